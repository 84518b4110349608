"""Real grounded image-caption data for HyCoCLIP: GRIT-style web shards
(`input.data.name="grit"`) and COCO instances with captions (`coco_grounded`).

Every training example carries, as the synthetic `world_boxes` source does,

  image / caption          a random resized crop (50-100% of the area, as
                           released) of the whole image, and its caption
  box_image / box_caption  one of the example's boxes, drawn uniformly (the
                           released loader's `random.randrange(numparents)`),
                           as a random resized crop of its own (drawn
                           independently: the released transform is applied
                           to the box image separately), and its phrase

`grit` reads the shards HyCoCLIP's `utils/prepare_GRIT_webdataset.py`
writes: per key, `KEY.child.jpg` + `KEY.child.txt` (the whole image, resized
to 224 px with white borders, and its caption), `KEY.numparents.txt`, and
per box `KEY.parentNNN.jpg` + `KEY.parentNNN.txt` (the box's crop, resized
the same way, and its noun chunk or referring expression; the script keeps
boxes over 32 x 32 px). `coco_grounded` reads a COCO instances JSON, a
captions JSON and the image folder: the box crop comes from the whole image,
its phrase is the box's category name, boxes of at most `min_box_area`
pixels (32 x 32, the GRIT script's cut-off) are dropped, and an image left
without a box or a caption is skipped at start-up.

An example whose whole image or drawn box image does not decode is replaced
by the next one, deterministically, and counted (`input/bad_samples`,
`input/bad_names`), as for the other real sources. Neither source has an
evaluation split: the paper variants evaluate on the benchmarks.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from hyperbolic_vl.data import image_text, pipeline, registry, transforms
from hyperbolic_vl.data.readers import object_boxes as coco_boxes
from hyperbolic_vl.data.readers import tar_shards
from hyperbolic_vl.data.settings import SourceSettings

# HyCoCLIP's GRIT preparation keeps boxes of more than 32 x 32 pixels.
MIN_BOX_AREA = 32 * 32


@dataclasses.dataclass(frozen=True)
class GritExamples:
  """Grounded examples of GRIT-style shards, augmented."""

  shards: tar_shards.GritShardSource

  def __len__(self) -> int:
    return len(self.shards)

  def example(self, index: int, rng: np.random.Generator, size: int) -> dict[str, Any]:
    record = self.shards[index]
    image, crop = image_text.image_and_random_crop(record["image"], rng, size)
    box_image, phrase = self.shards.box(index, int(rng.integers(record["num_boxes"])))
    box, box_crop = image_text.image_and_random_crop(box_image, rng, size)
    return {
      "image": transforms.resize_window(image, crop, size),
      "caption": record["caption"],
      "box_image": transforms.resize_window(box, box_crop, size),
      "box_caption": phrase,
    }


class CocoGroundedExamples:
  """COCO images with their captions and boxes; a box's phrase is its category."""

  def __init__(self, instances_path: str, captions_path: str, image_root: str, min_box_area: int):
    for key, path in (("path", instances_path), ("captions_path", captions_path)):
      if not pathlib.Path(path).is_file():
        raise FileNotFoundError(f"input.data.{key}: COCO JSON not found: {path}")
    boxes = coco_boxes.CocoBoxes(instances_path, image_root)
    with open(captions_path, encoding="utf-8") as f:
      captions: dict[Any, list[str]] = {}
      for annotation in json.load(f)["annotations"]:
        captions.setdefault(annotation["image_id"], []).append(str(annotation["caption"]).strip())
    self.category_names = boxes.category_names
    # Per image: (path, width, height, captions, pixel boxes, labels).
    self.items = []
    self.skipped_images = boxes.skipped_images
    for item in range(len(boxes)):
      pixel_boxes = boxes.pixel_boxes(item)
      areas = (pixel_boxes[:, 2] - pixel_boxes[:, 0]) * (pixel_boxes[:, 3] - pixel_boxes[:, 1])
      keep = areas > min_box_area
      image_captions = captions.get(boxes.image_ids[item])
      if not keep.any() or not image_captions:
        self.skipped_images += 1
        continue
      width, height = boxes.pixel_size(item)
      self.items.append(
        (
          str(boxes.image_path(item)),
          width,
          height,
          image_captions,
          pixel_boxes[keep],
          boxes.labels(item)[keep],
        )
      )
    if not self.items:
      raise ValueError(
        f"{instances_path} + {captions_path}: no image has a caption and a box over "
        f"{min_box_area} px"
      )

  def __len__(self) -> int:
    return len(self.items)

  def example(self, index: int, rng: np.random.Generator, size: int) -> dict[str, Any]:
    path, width, height, captions, pixel_boxes, labels = self.items[index]
    try:
      data = pathlib.Path(path).read_bytes()
    except OSError as error:
      raise tar_shards.BadSampleError(f"{path} ({type(error).__name__})") from error
    # Decoded whole: the box crop may need the full resolution.
    image = tar_shards.decode_rgb_image(data, path)
    crop = transforms.random_resized_crop_box(rng, image_aspect=image.width / image.height)
    caption = captions[int(rng.integers(len(captions)))]
    number = int(rng.integers(len(pixel_boxes)))
    # The annotation's size, not the file's, scales the box (they agree in COCO).
    x0, y0, x1, y1 = pixel_boxes[number] / np.asarray([width, height, width, height], np.float64)
    box = (x0, y0, x1, y1)
    box_aspect = (x1 - x0) * width / ((y1 - y0) * height)
    box_crop = transforms.random_resized_crop_box(rng, image_aspect=box_aspect)
    return {
      "image": transforms.resize_window(image, crop, size),
      "caption": caption,
      "box_image": transforms.resize_window(image, _window_in_box(box, box_crop), size),
      "box_caption": self.category_names[int(labels[number])],
    }


def _window_in_box(box: Sequence[float], window: Sequence[float]) -> tuple[float, ...]:
  """`window`, given in the unit square of `box`, in image coordinates."""
  x0, y0, x1, y1 = box
  return (
    x0 + window[0] * (x1 - x0),
    y0 + window[1] * (y1 - y0),
    x0 + window[2] * (x1 - x0),
    y0 + window[3] * (y1 - y0),
  )


@dataclasses.dataclass(frozen=True)
class GroundedTrainExample:
  """(epoch, index) -> example `index` augmented for `epoch`; an undecodable
  example is replaced by the next index and its name kept for counting."""

  examples: Any  # GritExamples or CocoGroundedExamples
  augment_seed: int
  image_size: int

  def __call__(self, epoch: int, index: int) -> dict[str, Any]:
    bad_names = []
    for _ in range(image_text.MAX_BAD_IN_A_ROW):
      rng = transforms.augment_rng(self.augment_seed, epoch, index)
      try:
        example = self.examples.example(index, rng, self.image_size)
        break
      except tar_shards.BadSampleError as error:
        bad_names.append(str(error))
        index = (index + 1) % len(self.examples)
    else:
      raise tar_shards.BadSampleError(
        f"{image_text.MAX_BAD_IN_A_ROW} bad examples in a row, first: {bad_names[:3]}"
      )
    example.update(index=index, bad_names=bad_names)
    return example


class _GroundedSource(registry.DataSource):
  """A real grounded source; subclasses open the examples."""

  batch_keys = (
    "image",
    "tokens",
    "box_image",
    "box_tokens",
    "index",
    "input/bad_samples",
    "input/bad_names",
  )

  def open(self, settings):
    raise NotImplementedError

  def num_train_examples(self, settings) -> int:
    count = len(self.open(settings))
    return min(count, settings.num_train or count)

  def train_iterator(self, input_settings, settings, tokenizer, *, seed, **layout):
    pipeline.check_layout(input_settings.batch_size, seed=seed, **layout)
    tokenizer = input_settings.resolve_tokenizer(tokenizer)
    examples = self.open(settings)
    num_examples = min(len(examples), settings.num_train or len(examples))
    make_example = GroundedTrainExample(examples, seed, input_settings.need_image_size())
    # Real captions are not cached (the cache would grow with the data).
    encoder = transforms.CachedEncoder(tokenizer, cache=False)
    return pipeline.example_input(
      make_example, encoder, num_examples, input_settings, seed=seed, **layout
    )


@dataclasses.dataclass(frozen=True)
class GritSettings(SourceSettings):
  source = "grit"
  # Brace pattern (grit-{00000..01023}.tar), glob, or comma-separated list.
  path: str = ""
  index_cache_dir: str = ""  # "": the member index is cached next to the shards
  num_train: int = 0  # cap on the training examples; 0: all


@registry.register
class GritSource(_GroundedSource):
  """HyCoCLIP's GRIT shards: whole image + caption, box crops + phrases."""

  name = "grit"
  Settings = GritSettings

  def open(self, settings):
    shards = tar_shards.GritShardSource(
      image_text.required_setting(settings, "path"), cache_dir=settings.index_cache_dir or None
    )
    return GritExamples(shards)


@dataclasses.dataclass(frozen=True)
class CocoGroundedSettings(SourceSettings):
  source = "coco_grounded"
  path: str = ""  # instances JSON (instances_train2017.json)
  captions_path: str = ""  # captions JSON (captions_train2017.json)
  image_root: str = ""  # the folder of the images
  min_box_area: int = MIN_BOX_AREA  # boxes of at most this many pixels are dropped
  num_train: int = 0  # cap on the training examples; 0: all


@registry.register
class CocoGroundedSource(_GroundedSource):
  """COCO images + captions, with object boxes named by their category."""

  name = "coco_grounded"
  Settings = CocoGroundedSettings

  def open(self, settings):
    return CocoGroundedExamples(
      image_text.required_setting(settings, "path"),
      image_text.required_setting(settings, "captions_path"),
      image_text.required_setting(settings, "image_root"),
      settings.min_box_area,
    )
