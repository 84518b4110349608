# TEMPORARY STUB (not committed): replaced by helper HM's module.
from __future__ import annotations

import dataclasses
from collections.abc import Callable


@dataclasses.dataclass(frozen=True)
class ZeroShotDataset:
  name: str
  title: str
  tfds_name: str | None
  test_split: str
  train_split: str | None
  val_split: str | None
  split_sizes: tuple[int, int, int] | None
  classnames: tuple[str, ...]
  prompts: tuple[str, ...]
  image_key: str = "image"
  label_key: str = "label"
  label_transform: str | None = None


@dataclasses.dataclass(frozen=True)
class RetrievalDataset:
  name: str
  title: str
  tfds_name: str | None
  split: str | None
  num_images: int
  num_captions: int


ZERO_SHOT = {
  "imagenet": ZeroShotDataset(
    "imagenet",
    "ImageNet",
    "imagenet2012",
    "validation",
    "train",
    None,
    None,
    tuple(f"c{i}" for i in range(1000)),
    ("a photo of a {}.",),
  ),
  "cifar10": ZeroShotDataset(
    "cifar10",
    "CIFAR-10",
    "cifar10",
    "test",
    "train[:45000]",
    "train[45000:]",
    (45000, 5000, 10000),
    ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"),
    ("a photo of a {}.",),
  ),
}
RETRIEVAL = {
  "coco": RetrievalDataset("coco", "COCO", "coco_captions", "test", 5000, 25000),
  "flickr30k": RetrievalDataset("flickr30k", "Flickr30K", None, None, 1000, 5000),
}
MERU_ZERO_SHOT_SUITE = tuple(ZERO_SHOT)
DEFAULT_PROMPTS = ("a photo of a {}.",)
LABEL_TRANSFORMS: dict[str, Callable[[dict], int]] = {}


def zero_shot_dataset(name):
  if name not in ZERO_SHOT:
    raise ValueError(f"unknown zero-shot benchmark {name!r}; valid: {list(ZERO_SHOT)}")
  return ZERO_SHOT[name]


def retrieval_dataset(name):
  if name not in RETRIEVAL:
    raise ValueError(f"unknown retrieval benchmark {name!r}; valid: {list(RETRIEVAL)}")
  return RETRIEVAL[name]
