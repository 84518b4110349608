"""Benchmark images: how a dataset is named, and images decoded and resized.

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

Evaluators see uint8 arrays at the model's resolution. Classification crops the centre square then resizes
(MERU's classification transform); retrieval squeezes the whole image to the
square resolution, as MERU's retrieval evaluation does.
"""

from __future__ import annotations

import dataclasses
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from PIL import Image

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


def centre_square(width: int, height: int) -> tuple[int, int, int, int]:
  """PIL's (left, top, right, bottom) of the largest centred square, in
  whole pixels: the crop of mode "crop"."""
  side = min(width, height)
  left, top = (width - side) // 2, (height - side) // 2
  return left, top, left + side, top + side


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
    pil = pil.crop(centre_square(*pil.size))
  elif mode != "squeeze":
    raise ValueError(f"unknown resize mode {mode!r}; valid: ['crop', 'squeeze']")
  return np.asarray(pil.resize((size, size), Image.BICUBIC), np.uint8)


def load_image_file(path: str | os.PathLike, size: int, mode: str) -> np.ndarray:
  with Image.open(path) as image:
    return resize_image(np.asarray(image.convert("RGB")), size, mode)


# Settings of the types that read a real benchmark.
BENCHMARK_SETTINGS = dict(dataset="", split="", data_dir="", num_examples=None, image_size=0)


def figure_label(name: str, dataset: str) -> str:
  """A benchmark's own name, else the evaluator's."""
  kind, value = split_spec(dataset)
  return value if kind == "benchmark" else name


def image_size(settings, run_input) -> int:
  """The setting, else the run's own resolution (`input.image_size`)."""
  return int(settings.get("image_size") or run_input.image_size)


def load_image_files(paths, size: int, mode: str, num_threads: int = 8) -> np.ndarray:
  """(N, size, size, 3) uint8 of image files, decoded on `num_threads` threads."""
  with ThreadPoolExecutor(max_workers=num_threads) as pool:
    return np.stack(list(pool.map(lambda p: load_image_file(p, size, mode), paths)))


def embed_image_files(predictor, paths, size: int, mode: str, batch_size: int, encode=None):
  """(N, D) embeddings of image files, decoded `batch_size` at a time so that
  a large benchmark never sits in memory whole. encode: batch -> embeddings
  (default `predictor.encode_images`)."""
  encode = encode or predictor.encode_images
  paths = list(paths)
  return np.concatenate(
    [
      encode(load_image_files(paths[start : start + batch_size], size, mode))
      for start in range(0, len(paths), max(1, batch_size))
    ]
  )


@dataclasses.dataclass
class SkippedItems:
  """A benchmark file's items left out, by reason, so that the line a user
  reads says which (a file with the wrong keys is not "missing images").
  `noun`: what an item is called ("item", "sample"); `fault`: what a
  malformed one gets wrong ("lack the fields ..."); `example`: the first
  malformed item and what it held."""

  noun: str
  fault: str
  malformed: int = 0
  no_image: int = 0
  example: str = ""

  @property
  def total(self) -> int:
    return self.malformed + self.no_image

  def describe(self, image_root: str) -> str:
    parts = []
    if self.malformed:
      parts.append(f"{self.malformed} {self.noun}(s) {self.fault} ({self.example})")
    if self.no_image:
      parts.append(f"{self.no_image} {self.noun}(s) have no image in {image_root}")
    return "; ".join(parts) or f"its files hold no {self.noun}"
