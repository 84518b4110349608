"""Evaluation data: where a benchmark's images, labels and captions come from.

A dataset is named by a string:
  "imagenet", "food101", ...   a benchmark of `benchmarks.ZERO_SHOT` /
                               `benchmarks.RETRIEVAL` (its TFDS name, split,
                               class names and prompts are known)
  "tfds:NAME"                  any prepared TFDS dataset (array_record), read
                               by name from `data_dir`
  "folder:DIR"                 zero-shot / probe: one sub-folder per class
  "csv:FILE"                   retrieval: `image, caption` rows, several rows
                               per image for several captions; image paths
                               relative to an image folder

Images are decoded, resized and batched here; evaluators see uint8 arrays at
the model's resolution. Classification crops the centre square then resizes
(MERU's classification transform); retrieval squeezes the whole image to the
square resolution, as MERU's retrieval evaluation does.

TensorFlow Datasets is imported only when a TFDS dataset is opened: it is
heavy and absent on some accelerator machines.
"""

from __future__ import annotations

import csv
import dataclasses
import os
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from PIL import Image

from hyperbolic_vl.data import sources
from hyperbolic_vl.evaluators import EvaluatorUnavailable

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff")


def split_spec(dataset: str) -> tuple[str, str]:
  """ "tfds:cifar10" -> ("tfds", "cifar10"); a bare name -> ("benchmark", name)."""
  kind, sep, value = dataset.partition(":")
  if not sep:
    return "benchmark", dataset
  if kind not in ("tfds", "folder", "csv"):
    raise ValueError(f"dataset {dataset!r}: prefix must be tfds:, folder: or csv:")
  if not value:
    raise ValueError(f"dataset {dataset!r} names nothing after {kind}:")
  return kind, value


def resize_image(image: np.ndarray, size: int, mode: str) -> np.ndarray:
  """(H, W, C) uint8 -> (size, size, 3) uint8, bicubic; mode "crop" takes the
  centre square first, "squeeze" resizes the whole image."""
  image = np.asarray(image)
  if image.ndim == 2:
    image = image[..., None]
  if image.shape[-1] == 1:
    image = np.repeat(image, 3, axis=-1)
  pil = Image.fromarray(image.astype(np.uint8, copy=False)).convert("RGB")
  if mode == "crop":
    width, height = pil.size
    side = min(width, height)
    left, top = (width - side) // 2, (height - side) // 2
    pil = pil.crop((left, top, left + side, top + side))
  elif mode != "squeeze":
    raise ValueError(f"unknown resize mode {mode!r}; valid: ['crop', 'squeeze']")
  return np.asarray(pil.resize((size, size), Image.BICUBIC), np.uint8)


def load_image_file(path: str | os.PathLike, size: int, mode: str) -> np.ndarray:
  with Image.open(path) as image:
    return resize_image(np.asarray(image.convert("RGB")), size, mode)


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


@dataclasses.dataclass
class CaptionedImages:
  """Images with several captions each: caption_image[j] is caption j's image."""

  name: str
  images: np.ndarray  # (N, S, S, 3) uint8
  captions: list[str]
  caption_image: np.ndarray  # (M,) int


def csv_captioned_images(
  path: str,
  image_root: str,
  *,
  image_size: int,
  image_column: str = "image",
  caption_column: str = "caption",
  num_images: int | None = None,
  num_threads: int = 8,
) -> CaptionedImages:
  """`image, caption` rows (several per image); images in `image_root`."""
  if not os.path.isfile(path):
    raise EvaluatorUnavailable(f"retrieval CSV {path!r} does not exist")
  order: dict[str, int] = {}
  captions, caption_image = [], []
  with open(path, newline="", encoding="utf-8") as f:
    reader = csv.DictReader(f)
    missing = {image_column, caption_column} - set(reader.fieldnames or ())
    if missing:
      raise EvaluatorUnavailable(
        f"{path}: missing column(s) {sorted(missing)}; columns are {reader.fieldnames}"
      )
    for row in reader:
      image = row[image_column]
      if image not in order:
        if num_images is not None and len(order) >= num_images:
          continue
        order[image] = len(order)
      captions.append(row[caption_column])
      caption_image.append(order[image])
  root = image_root or os.path.dirname(os.path.abspath(path))
  paths = [os.path.join(root, name) for name in order]
  absent = [p for p in paths if not os.path.isfile(p)]
  if absent:
    raise EvaluatorUnavailable(f"{len(absent)} image(s) of {path} not found, first: {absent[0]}")
  with ThreadPoolExecutor(max_workers=num_threads) as pool:
    images = list(pool.map(lambda p: load_image_file(p, image_size, "squeeze"), paths))
  return CaptionedImages(f"csv:{path}", np.stack(images), captions, np.asarray(caption_image))


def tfds_captioned_images(
  name: str,
  split: str,
  *,
  data_dir: str | None,
  image_size: int,
  image_key: str = "image",
  captions_key: str = "captions/text",
  num_images: int | None = None,
  num_threads: int = 8,
  captions_per_image: int | None = None,
) -> CaptionedImages:
  """A prepared TFDS split with a sequence of captions per image (e.g.
  coco_captions: `captions/text`); `captions_per_image` keeps each image's
  first ones (Karpathy's COCO test split has a few images with 6 or 7)."""
  try:
    source = sources.tfds_source(name, split, data_dir or None)
  except (FileNotFoundError, ValueError) as error:
    raise EvaluatorUnavailable(str(error)) from error
  size = len(source) if num_images is None else min(int(num_images), len(source))

  def read(index: int):
    example = source[index]
    texts = example
    for part in captions_key.split("/"):
      texts = texts[part]
    texts = [
      t.decode("utf-8") if isinstance(t, bytes) else str(t) for t in np.asarray(texts).ravel()
    ]
    return resize_image(example[image_key], image_size, "squeeze"), texts[:captions_per_image]

  with ThreadPoolExecutor(max_workers=num_threads) as pool:
    rows = list(pool.map(read, range(size)))
  captions, caption_image = [], []
  for index, (_, texts) in enumerate(rows):
    captions.extend(texts)
    caption_image.extend([index] * len(texts))
  return CaptionedImages(
    f"{name}[{split}]", np.stack([r[0] for r in rows]), captions, np.asarray(caption_image)
  )


def clean_classname(name: str) -> str:
  """TFDS label names as prompt text: "apple_pie" -> "apple pie"."""
  return name.replace("_", " ").strip()


def check_classnames(classnames: Sequence[str], num_labels: int | None, dataset: str) -> None:
  if num_labels is not None and len(classnames) != num_labels:
    raise EvaluatorUnavailable(
      f"{dataset}: {len(classnames)} class names but the label feature has {num_labels} classes"
    )
