"""Images with several captions each, for image-text retrieval: a CSV of
`image, caption` rows plus an image folder, or a prepared TFDS split with a
sequence of captions per image. Whole images are squeezed to the model's
square resolution, as MERU's retrieval evaluation does. TensorFlow Datasets
is imported only when a TFDS dataset is opened."""

from __future__ import annotations

import csv
import dataclasses
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from hyperbolic_vl.data.readers import image_text_records as sources
from hyperbolic_vl.evaluators import EvaluatorUnavailable
from hyperbolic_vl.evaluators.datasets.images import load_image_file, resize_image


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
