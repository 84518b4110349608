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

With `max_boxes` = N > 0 (UNCHA) an example carries instead its FIRST N
boxes in stored order (no draw, as UNCHA's released loader), each its own
random resized crop, in fixed shapes with a validity mask (`box_mask`, see
`transforms.padded_boxes`). `crop_scale` (default MERU's (0.5, 1.0); UNCHA
(0.8, 1.0)) and `grayscale_prob` (UNCHA 0.2) apply to the whole image and to
each box independently. UNCHA's release lists a colour jitter too, but its
transform wrapper skips it, so there is none here.

An example whose whole image or drawn box image does not decode is replaced
by the next one, deterministically, and counted (`input/bad_samples`,
`input/bad_names`), as for the other real sources; with `max_boxes` > 0 so
is one without a box, with a box file missing among its first N, or with any
of those boxes undecodable. Neither source has an
evaluation split: the paper variants evaluate on the benchmarks.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from hyperbolic_vl import errors
from hyperbolic_vl.data import image_text, pipeline, registry, transforms
from hyperbolic_vl.data.readers import object_boxes as coco_boxes
from hyperbolic_vl.data.readers import tar_shards
from hyperbolic_vl.data.settings import SourceSettings

# HyCoCLIP's GRIT preparation keeps boxes of more than 32 x 32 pixels.
MIN_BOX_AREA = 32 * 32


@dataclasses.dataclass(frozen=True)
class BoxAugmentation:
  """How a grounded source crops and colours (the `GroundedSettings` fields)."""

  max_boxes: int = 0
  crop_scale: tuple[float, float] = transforms.CROP_SCALE
  grayscale_prob: float = 0.0

  def finish(self, image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    return transforms.maybe_grayscale(image, rng, self.grayscale_prob)


@dataclasses.dataclass(frozen=True)
class GritExamples:
  """Grounded examples of GRIT-style shards, augmented."""

  shards: tar_shards.GritShardSource
  augmentation: BoxAugmentation = BoxAugmentation()

  def __len__(self) -> int:
    return len(self.shards)

  def _crop(self, raw, rng: np.random.Generator, size: int) -> np.ndarray:
    scale = self.augmentation.crop_scale
    image, crop = image_text.image_and_random_crop(raw, rng, size, scale=scale)
    return self.augmentation.finish(transforms.resize_window(image, crop, size), rng)

  def example(self, index: int, rng: np.random.Generator, size: int) -> dict[str, Any]:
    record = self.shards[index]
    max_boxes = self.augmentation.max_boxes
    if max_boxes:
      boxes = self.shards.first_boxes(index, max_boxes)
      image = self._crop(record["image"], rng, size)
      crops = [self._crop(box_image, rng, size) for box_image, _ in boxes]
      return {
        "image": image,
        "caption": record["caption"],
        **transforms.padded_boxes(crops, [phrase for _, phrase in boxes], max_boxes, size),
      }
    image = self._crop(record["image"], rng, size)
    box_image, phrase = self.shards.box(index, int(rng.integers(record["num_boxes"])))
    return {
      "image": image,
      "caption": record["caption"],
      "box_image": self._crop(box_image, rng, size),
      "box_caption": phrase,
    }


class CocoGroundedExamples:
  """COCO images with their captions and boxes; a box's phrase is its category."""

  def __init__(
    self,
    instances_path: str,
    captions_path: str,
    image_root: str,
    min_box_area: int,
    augmentation: BoxAugmentation = BoxAugmentation(),
  ):
    self.augmentation = augmentation
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
    augmentation = self.augmentation
    scale = augmentation.crop_scale
    crop = transforms.random_resized_crop_box(
      rng, image_aspect=image.width / image.height, scale=scale
    )
    whole = augmentation.finish(transforms.resize_window(image, crop, size), rng)
    caption = captions[int(rng.integers(len(captions)))]

    def box_crop(number: int) -> np.ndarray:
      # The annotation's size, not the file's, scales the box (they agree in COCO).
      x0, y0, x1, y1 = pixel_boxes[number] / np.asarray([width, height, width, height], np.float64)
      box_aspect = (x1 - x0) * width / ((y1 - y0) * height)
      window = transforms.random_resized_crop_box(rng, image_aspect=box_aspect, scale=scale)
      crop = transforms.resize_window(image, _window_in_box((x0, y0, x1, y1), window), size)
      return augmentation.finish(crop, rng)

    if augmentation.max_boxes:
      # The first boxes in the instances file's order (UNCHA keeps the first N).
      numbers = range(min(augmentation.max_boxes, len(pixel_boxes)))
      return {
        "image": whole,
        "caption": caption,
        **transforms.padded_boxes(
          [box_crop(n) for n in numbers],
          [self.category_names[int(labels[n])] for n in numbers],
          augmentation.max_boxes,
          size,
        ),
      }
    number = int(rng.integers(len(pixel_boxes)))
    return {
      "image": whole,
      "caption": caption,
      "box_image": box_crop(number),
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
      raise image_text.TooManyBadExamplesError(
        f"{image_text.MAX_BAD_IN_A_ROW} bad training examples in a row (undecodable images, "
        f"missing boxes); first: {bad_names[:3]}"
      )
    example.update(index=index, bad_names=bad_names)
    return example


@dataclasses.dataclass(frozen=True)
class GroundedSettings(SourceSettings):
  """The box settings every grounded source has (`world_boxes` too)."""

  # 0: one box per example, drawn uniformly (HyCoCLIP); N > 0: the first N
  # boxes in stored order with a validity mask (UNCHA: 5).
  max_boxes: int = 0
  # Random resized crops' share of the area: MERU's and HyCoCLIP's (0.5, 1.0);
  # UNCHA (0.8, 1.0).
  crop_scale: tuple[float, float] = transforms.CROP_SCALE
  grayscale_prob: float = 0.0  # RandomGrayscale's p, per image and box (UNCHA 0.2)

  def __post_init__(self):
    where = f"input.data (source {self.source!r})"
    if self.max_boxes < 0:
      raise errors.ConfigError(f"{where}.max_boxes must be >= 0, got {self.max_boxes}")
    low, high = self.crop_scale
    if len(self.crop_scale) != 2 or not 0 < low <= high <= 1:
      raise errors.ConfigError(
        f"{where}.crop_scale must be (low, high) with 0 < low <= high <= 1, got {self.crop_scale}"
      )
    if not 0 <= self.grayscale_prob <= 1:
      raise errors.ConfigError(
        f"{where}.grayscale_prob must be in [0, 1], got {self.grayscale_prob}"
      )

  def slots(self, key: str) -> tuple[int, str]:
    if key in ("box_image", "box_tokens") and self.max_boxes:
      return self.max_boxes, "max_boxes"
    return super().slots(key)

  def augmentation(self) -> BoxAugmentation:
    return BoxAugmentation(self.max_boxes, tuple(self.crop_scale), self.grayscale_prob)


class _GroundedSource(registry.DataSource):
  """A real grounded source; subclasses open the examples. With max_boxes > 0
  its batches also hold `box_mask` (and boxes of shape (b, N, ...))."""

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
class GritSettings(GroundedSettings):
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
      image_text.required_setting(settings, "path"),
      cache_dir=settings.index_cache_dir or None,
      keep_boxless=settings.max_boxes > 0,
    )
    return GritExamples(shards, settings.augmentation())


@dataclasses.dataclass(frozen=True)
class CocoGroundedSettings(GroundedSettings):
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
      settings.augmentation(),
    )
