"""Labelled images for zero-shot classification and linear probes: a prepared
TFDS split, an image folder (one sub-folder per class) or a benchmark of
`benchmarks.ZERO_SHOT`, with class names and prompts. Images are centre
square crops resized to the model's resolution (MERU's classification
transform). TensorFlow Datasets is imported only when a TFDS dataset is
opened."""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from hyperbolic_vl.data.readers import image_text_records as sources
from hyperbolic_vl.evaluators import EvaluatorUnavailable
from hyperbolic_vl.evaluators.datasets import benchmarks
from hyperbolic_vl.evaluators.datasets.images import (
  IMAGE_SUFFIXES,
  load_image_file,
  resize_image,
  split_spec,
)


@dataclasses.dataclass
class LabelledImages:
  """Random-access labelled images: `read(i)` -> (uint8 image, int label)."""

  name: str
  size: int
  read: Callable[[int], tuple[np.ndarray, int]]
  classnames: tuple[str, ...]

  def batches(
    self, batch_size: int, num_threads: int = 8, progress_every_s: float = 30.0
  ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """(images (B, S, S, 3) uint8, labels (B,)) in order; decoding runs in a
    thread pool (PIL releases the GIL); progress printed on long sets."""
    start = last = time.perf_counter()
    with ThreadPoolExecutor(max_workers=num_threads) as pool:
      for begin in range(0, self.size, batch_size):
        rows = list(pool.map(self.read, range(begin, min(begin + batch_size, self.size))))
        yield np.stack([r[0] for r in rows]), np.asarray([r[1] for r in rows], np.int64)
        now = time.perf_counter()
        if now - last > progress_every_s:
          done = begin + len(rows)
          rate = done / (now - start)
          print(
            f"  {self.name}: {done}/{self.size} images ({rate:.0f} images/s, "
            f"{(self.size - done) / rate:.0f}s left)",
            flush=True,
          )
          last = now


def tfds_labelled_images(
  name: str,
  split: str,
  *,
  data_dir: str | None,
  image_size: int,
  image_key: str = "image",
  label_key: str = "label",
  label_transform: Callable[[dict], int] | None = None,
  num_examples: int | None = None,
) -> tuple[LabelledImages, tuple[str, ...] | None]:
  """A prepared TFDS split and the label feature's class names (None when
  the label is not a ClassLabel). A missing dataset raises
  EvaluatorUnavailable with how to prepare it."""
  try:
    source = sources.tfds_source(name, split, data_dir or None)
  except (FileNotFoundError, ValueError) as error:
    raise EvaluatorUnavailable(str(error)) from error
  import tensorflow_datasets as tfds  # already imported by tfds_source

  features = tfds.builder(name, data_dir=data_dir or None).info.features
  label_feature = features[label_key] if label_key in features else None
  names = (
    tuple(label_feature.names) if isinstance(label_feature, tfds.features.ClassLabel) else None
  )
  size = len(source) if num_examples is None else min(int(num_examples), len(source))

  def read(index: int) -> tuple[np.ndarray, int]:
    example = source[index]
    label = label_transform(example) if label_transform else int(example[label_key])
    return resize_image(example[image_key], image_size, "crop"), label

  return LabelledImages(f"{name}[{split}]", size, read, names or ()), names


def folder_labelled_images(
  root: str, *, image_size: int, num_examples: int | None = None
) -> LabelledImages:
  """ImageFolder layout: ROOT/<class name>/<image>; classes sorted by name."""
  if not os.path.isdir(root):
    raise EvaluatorUnavailable(f"image folder {root!r} does not exist")
  classes = sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)))
  if not classes:
    raise EvaluatorUnavailable(f"image folder {root!r} has no class sub-folders")
  items = [
    (os.path.join(root, c, f), label)
    for label, c in enumerate(classes)
    for f in sorted(os.listdir(os.path.join(root, c)))
    if f.lower().endswith(IMAGE_SUFFIXES)
  ]
  if num_examples is not None:
    # An even spread over the classes, not the first classes only.
    items = [items[i] for i in np.linspace(0, len(items) - 1, int(num_examples)).astype(int)]

  def read(index: int) -> tuple[np.ndarray, int]:
    path, label = items[index]
    return load_image_file(path, image_size, "crop"), label

  return LabelledImages(
    f"folder:{root}", len(items), read, tuple(c.replace("_", " ") for c in classes)
  )


def clean_classname(name: str) -> str:
  """TFDS label names as prompt text: "apple_pie" -> "apple pie"."""
  return name.replace("_", " ").strip()


def check_classnames(classnames: Sequence[str], num_labels: int | None, dataset: str) -> None:
  if num_labels is not None and len(classnames) != num_labels:
    raise EvaluatorUnavailable(
      f"{dataset}: {len(classnames)} class names but the label feature has {num_labels} classes"
    )


def open_labelled(
  dataset: str,
  split: str,
  *,
  image_size: int,
  data_dir: str = "",
  num_examples: int | None = None,
  prompts: Sequence[str] = (),
  classnames: Sequence[str] = (),
) -> tuple[LabelledImages, tuple[str, ...], tuple[str, ...]]:
  """(images, class names, prompts) of a zero-shot / probe dataset: a
  benchmark name, tfds:NAME or folder:DIR. `split` "" is the benchmark's test
  split (else "test"); empty `prompts` / `classnames` are the dataset's own."""
  if not dataset:
    raise ValueError("set dataset (a benchmark name, tfds:NAME or folder:DIR)")
  kind, value = split_spec(dataset)
  size = int(image_size)
  data_dir = str(data_dir or "")
  prompts = tuple(prompts or ())
  if kind == "folder":
    images = folder_labelled_images(value, image_size=size, num_examples=num_examples)
    return images, images.classnames, prompts or benchmarks.DEFAULT_PROMPTS
  if kind == "benchmark":
    spec = benchmarks.zero_shot_dataset(value)
    if spec.tfds_name is None:
      # No TFDS builder: the release's own folders, DATA_DIR/<split>/<class>/,
      # whose sorted class folders follow the benchmark's class order.
      root = os.path.join(data_dir, split or spec.test_split) if data_dir else ""
      if not root or not os.path.isdir(root):
        raise EvaluatorUnavailable(
          f"{spec.title} has no TFDS builder: unpack its release so that "
          f"DATA_DIR/{split or spec.test_split}/<class>/ holds the images and set data_dir "
          f"(looked for {root or 'an unset data_dir'})"
        )
      images = folder_labelled_images(root, image_size=size, num_examples=num_examples)
      check_classnames(spec.classnames, len(images.classnames), spec.title)
      images.classnames = spec.classnames
      return images, spec.classnames, prompts or spec.prompts
    transform = benchmarks.LABEL_TRANSFORMS[spec.label_transform] if spec.label_transform else None
    images, label_names = tfds_labelled_images(
      spec.tfds_name,
      split or spec.test_split,
      data_dir=data_dir,
      image_size=size,
      image_key=spec.image_key,
      label_key=spec.label_key,
      label_transform=transform,
      num_examples=num_examples,
    )
    if spec.label_transform is None:
      check_classnames(spec.classnames, len(label_names) if label_names else None, spec.title)
    images.classnames = spec.classnames
    return images, spec.classnames, prompts or spec.prompts
  images, label_names = tfds_labelled_images(
    value, split or "test", data_dir=data_dir, image_size=size, num_examples=num_examples
  )
  if not label_names:
    raise EvaluatorUnavailable(f"tfds:{value} has no ClassLabel 'label' feature to name classes")
  classnames = tuple(classnames or ()) or tuple(clean_classname(n) for n in label_names)
  check_classnames(classnames, len(label_names), f"tfds:{value}")
  return images, classnames, prompts or benchmarks.DEFAULT_PROMPTS
