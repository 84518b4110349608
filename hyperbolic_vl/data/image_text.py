"""Real image-caption data: a CSV with an image folder (`image_text_csv`), a
prepared TFDS dataset (`tfds`) and webdataset tar shards (`tar_shards`).

The three share one example maker: a random resized crop (as MERU) of the
decoded image, drawn before the decode so that a JPEG is decoded only as
finely as the crop needs, and the caption, or with `tier_separator` one of its
four tiers drawn with `tier_weights` (HierarCaps' "T1 => T2 => T3 => T4").
An image that does not decode is replaced by the next example,
deterministically, and counted (`input/bad_samples`, `input/bad_names`).
Evaluation splits are the whole images' centre squares, un-augmented.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from hyperbolic_vl import errors
from hyperbolic_vl.data import pipeline, registry, transforms
from hyperbolic_vl.data.readers import image_text_records as sources
from hyperbolic_vl.data.readers import tar_shards
from hyperbolic_vl.data.settings import SourceSettings

# Consecutive undecodable examples tolerated before giving up on a row.
MAX_BAD_IN_A_ROW = 64


def split_tiers(caption: str, separator: str | None, where: str):
  if separator is None:
    return None
  tiers = [tier.strip() for tier in caption.split(separator)]
  if len(tiers) != transforms.NUM_TIERS:
    raise ValueError(
      f"{where}: expected {transforms.NUM_TIERS} caption tiers separated by "
      f"{separator!r}, got {len(tiers)} in {caption!r}"
    )
  return tiers


def as_text(value: Any, rng: np.random.Generator | None) -> str:
  """A caption from a TFDS/CSV field: bytes, str, or a list of either.

  From a list, training (``rng`` given) picks a random caption; evaluation
  (``rng=None``) takes the first, to stay deterministic.
  """
  if isinstance(value, np.ndarray) and value.ndim == 0:
    value = value.item()
  if isinstance(value, (list, tuple, np.ndarray)):
    if len(value) == 0:
      raise ValueError("empty caption list")
    value = value[0 if rng is None else rng.integers(len(value))]
  if isinstance(value, (bytes, np.bytes_)):
    value = value.decode("utf-8")
  return str(value)


def nested_get(record: Mapping[str, Any], key: str) -> Any:
  """record["a/b"] -> record["a"]["b"], for nested TFDS features."""
  for part in key.split("/"):
    record = record[part]
  return record


def as_rgb(image: np.ndarray) -> np.ndarray:
  if image.ndim == 2:
    image = image[..., None]
  if image.shape[-1] == 1:
    image = np.repeat(image, 3, axis=-1)
  if image.ndim != 3 or image.shape[-1] != 3:
    raise ValueError(f"expected an (H, W, 3) image, got shape {image.shape}")
  return image.astype(np.uint8, copy=False)


class TooManyBadExamplesError(errors.DataError, tar_shards.BadSampleError):
  """So many bad examples in a row that the data as a whole is unusable."""


@dataclasses.dataclass(frozen=True)
class RealTrainExample:
  """(epoch, index) -> the augmented example `index` of a random-access source."""

  source: Any
  augment_seed: int
  image_size: int
  cumulative_tier_weights: np.ndarray
  image_key: str = "image"
  caption_key: str = "caption"
  tier_separator: str | None = None

  def __call__(self, epoch: int, index: int) -> dict[str, Any]:
    # A bad example (image that does not decode) is replaced by the next
    # index, deterministically, and its name reported for counting.
    bad_names = []
    for _ in range(MAX_BAD_IN_A_ROW):
      try:
        record = self.source[index]
        rng = transforms.augment_rng(self.augment_seed, epoch, index)
        image, crop = self._image_and_crop(nested_get(record, self.image_key), rng)
        caption = as_text(nested_get(record, self.caption_key), rng)
        if not caption.strip():
          # Judged like an image that does not decode: skipped and counted.
          raise tar_shards.BadSampleError(f"example {index}: empty caption")
        break
      except tar_shards.BadSampleError as error:
        bad_names.append(str(error))
        index = (index + 1) % len(self.source)
    else:
      raise TooManyBadExamplesError(
        f"{MAX_BAD_IN_A_ROW} bad training examples in a row (missing or undecodable images, "
        f"empty captions); first: {bad_names[:3]}"
      )
    example = {
      "image": transforms.resize_window(image, crop, self.image_size),
      "index": index,
      "bad_names": bad_names,
    }
    tiers = split_tiers(caption, self.tier_separator, f"example {index}")
    if tiers is None:
      example["caption"] = caption
    else:
      example["caption"] = tiers[transforms.sample_tier(rng, self.cumulative_tier_weights)]
      example["tiers"] = tiers
    return example

  def _image_and_crop(self, raw, rng: np.random.Generator) -> tuple[Any, tuple]:
    return image_and_random_crop(raw, rng, self.image_size)


def image_and_random_crop(
  raw, rng: np.random.Generator, image_size: int, scale: tuple[float, float] = transforms.CROP_SCALE
) -> tuple[Any, tuple]:
  """The decoded image and its random-resized-crop window. An encoded image
  learns its size first, so the crop is drawn before the decode and a JPEG is
  decoded only as finely as the crop's downscale to image_size needs."""
  if not isinstance(raw, tar_shards.EncodedImage):
    image = as_rgb(np.asarray(raw))
    height, width = image.shape[:2]
    return image, transforms.random_resized_crop_box(rng, image_aspect=width / height, scale=scale)
  crop = None

  def draft_size(width: int, height: int) -> tuple[int, int]:
    nonlocal crop
    crop = transforms.random_resized_crop_box(rng, image_aspect=width / height, scale=scale)
    x0, y0, x1, y1 = crop
    # The whole image at this size puts image_size pixels across the crop.
    return (
      math.ceil(image_size / max(x1 - x0, 1e-6)),
      math.ceil(image_size / max(y1 - y0, 1e-6)),
    )

  return raw.decode_rgb_image(draft_size), crop


@dataclasses.dataclass(frozen=True)
class _ImageTextSettings(SourceSettings):
  """Settings every real image-caption source has."""

  # With a separator (e.g. " => " for HierarCaps) a caption holds 4 tiers,
  # most general first; batches then carry tier_tokens.
  tier_separator: str | None = None
  tier_weights: tuple[float, ...] = transforms.DEFAULT_TIER_WEIGHTS
  num_train: int = 0  # cap on the training examples; 0: all
  num_eval: int = 0  # default size of an evaluation split; 0: all

  def slots(self, key: str) -> tuple[int, str]:
    if key == "tier_tokens" and self.tier_separator is None:
      return 0, ""  # untiered captions: batches carry no tier_tokens
    return super().slots(key)


class _ImageTextSource(registry.DataSource):
  """A random-access image-caption source; subclasses open the records."""

  batch_keys = ("image", "tokens", "index", "tier_tokens", "input/bad_samples", "input/bad_names")

  def open(self, settings, split: str | None, decode: bool) -> tuple[Any, str, str]:
    """(records, image key, caption key) of `split` (None: training).
    decode=False: images may come as EncodedImage, for the training map to
    decode at the size its crop needs."""
    raise NotImplementedError

  def train_iterator(self, input_settings, settings, tokenizer, *, seed, **layout):
    pipeline.check_layout(input_settings.batch_size, seed=seed, **layout)
    tokenizer = input_settings.resolve_tokenizer(tokenizer)
    weights = transforms.cumulative_tier_weights(settings.tier_weights)
    records, image_key, caption_key = self.open(settings, split=None, decode=False)
    num_examples = min(len(records), settings.num_train or len(records))
    if num_examples == 0:
      raise errors.DataError(f"training source {records!r} holds no examples")
    make_example = RealTrainExample(
      source=records,
      augment_seed=seed,
      image_size=input_settings.need_image_size(),
      cumulative_tier_weights=weights,
      image_key=image_key,
      caption_key=caption_key,
      tier_separator=settings.tier_separator,
    )
    encoder = transforms.CachedEncoder(tokenizer, cache=False)
    return pipeline.example_input(
      make_example, encoder, num_examples, input_settings, seed=seed, **layout
    )

  def eval_split(self, input_settings, settings, tokenizer, split, num_examples):
    """image (N, H, W, 3) float32 centre squares; tokens (the last tier when
    tiered); tier_tokens (when tiered); index. Undecodable examples are
    skipped."""
    tokenizer = input_settings.resolve_tokenizer(tokenizer)
    image_size = input_settings.need_image_size()
    records, image_key, caption_key = self.open(settings, split=split, decode=True)
    if num_examples is None:
      num_examples = settings.num_eval or len(records)
    num_examples = min(num_examples, len(records))
    images, captions, tiers = [], [], []
    for index in range(num_examples):
      try:
        record = records[index]
      except tar_shards.BadSampleError:
        continue
      image = as_rgb(np.asarray(nested_get(record, image_key)))
      images.append(
        transforms.resize_window(image, transforms.center_square_box(image), image_size)
      )
      caption = as_text(nested_get(record, caption_key), rng=None)
      example_tiers = split_tiers(caption, settings.tier_separator, f"example {index}")
      if example_tiers is not None:
        tiers.append(example_tiers)
        caption = example_tiers[-1]
      captions.append(caption)
    num_examples = len(images)
    result = {
      "image": np.stack(images).astype(np.float32) / 255.0,
      "tokens": tokenizer.encode(captions),
      "index": np.arange(num_examples, dtype=np.int64),
    }
    if tiers:
      result["tier_tokens"] = tokenizer.encode([t for row in tiers for t in row]).reshape(
        num_examples, transforms.NUM_TIERS, -1
      )
    return result


def required_setting(settings, key: str) -> str:
  """`settings.key`, or a one-line error naming `input.data.key` when empty."""
  value = getattr(settings, key)
  if not value:
    # A config error (one line from the command line, not a traceback): a
    # paper variant's CSV source run without --config.input.data.path.
    raise errors.ConfigError(f"input.data.{key} is required (source {settings.source!r})")
  return value


@dataclasses.dataclass(frozen=True)
class CsvSettings(_ImageTextSettings):
  source = "image_text_csv"
  path: str = ""  # the training CSV
  image_root: str = ""  # folder of the images the CSV names (paths or URLs)
  eval_path: str = ""  # the evaluation CSV (default: path)
  image_column: str = "image"
  caption_column: str = "caption"


@registry.register
class ImageTextCsvSource(_ImageTextSource):
  name = "image_text_csv"
  eval_source = "image_text_csv"
  Settings = CsvSettings

  def open(self, settings, split, decode):
    path = required_setting(settings, "path")
    if split not in (None, "train"):
      path = settings.eval_path or path
    records = sources.ImageTextCsvSource(
      path,
      required_setting(settings, "image_root"),
      image_column=settings.image_column,
      caption_column=settings.caption_column,
      decode=decode,
    )
    return records, "image", "caption"

  def num_train_examples(self, settings):
    """The training CSV's rows (capped by input.data.num_train), so a run can
    be sized in epochs (the adaptation recipe of docs/interop.md is)."""
    records, _, _ = self.open(settings, split=None, decode=False)
    return min(len(records), settings.num_train or len(records))


@dataclasses.dataclass(frozen=True)
class TfdsSettings(_ImageTextSettings):
  source = "tfds"
  tfds_name: str = ""  # prepared with file_format=array_record (random access)
  split: str = "train"  # the training split
  data_dir: str = ""  # "": TFDS's default
  image_key: str = "image"
  caption_key: str = "caption"  # "a/b" for nested features


@registry.register
class TfdsSource(_ImageTextSource):
  name = "tfds"
  eval_source = "tfds"
  Settings = TfdsSettings

  def open(self, settings, split, decode):
    del decode  # TFDS decodes its own features
    records = sources.tfds_source(
      required_setting(settings, "tfds_name"),
      split=split or settings.split,
      data_dir=settings.data_dir or None,
    )
    return records, settings.image_key, settings.caption_key


@dataclasses.dataclass(frozen=True)
class TarShardSettings(_ImageTextSettings):
  source = "tar_shards"
  # Brace pattern (shard-{000..099}.tar), glob, or comma-separated list.
  path: str = ""
  eval_path: str = ""  # shards of the evaluation split (default: path)
  caption_key: str = "caption"  # the field of KEY.json; KEY.txt is read whole
  index_cache_dir: str = ""  # "": the member index is cached next to the shards


@registry.register
class TarShardsSource(_ImageTextSource):
  name = "tar_shards"
  eval_source = "tar_shards"
  Settings = TarShardSettings

  def open(self, settings, split, decode):
    pattern = required_setting(settings, "path")
    if split not in (None, "train"):
      pattern = settings.eval_path or pattern
    records = tar_shards.TarShardSource(
      pattern,
      caption_key=settings.caption_key,
      cache_dir=settings.index_cache_dir or None,
      decode=decode,
    )
    return records, "image", "caption"
