"""grain input pipelines: training iterators and evaluation splits.

Training order. The train split is a finite range of example indices,
shuffled per epoch from ``seed`` and repeated forever (grain ``shuffle`` +
``repeat``). Global position ``p`` of that stream holds example
``index(p)`` of epoch ``p // num_examples``; global batch ``k`` is positions
``[k B, (k+1) B)``. Process ``i`` of ``n`` reads the contiguous slice
``[k B + i b, k B + (i+1) b)`` with ``b = B / n``, so concatenating the
processes' batches in process order gives exactly the single-process global
batch: runs are reproducible across pod sizes.

Randomness. Augmentation (random resized crop, caption tier, negatives) of an
example is drawn from a generator seeded by ``(seed, epoch, index)``, never
from shared state, so batches do not depend on threads, workers or process
count, and a restored iterator replays exactly. World crops are random
resized crops (50-100% of the area, aspect 3/4-4/3, as MERU) that must keep
the inner half of the main object, which the captions describe.

Checkpointing. The iterator is a grain ``DatasetIterator``: ``get_state()``
is a small JSON-serialisable dict, ``set_state()`` on a fresh iterator built
from the same config resumes with identical batches.

Batch (per process, ``b`` rows)::

  image            float32 (b, H, W, 3) in [0, 1]
  tokens           int32   (b, L)  the training caption
  index            int64   (b,)    example index in the source
  # world, and CSV/TFDS data with tiered captions (data.tier_separator):
  tier_tokens      int32   (b, 4, L) captions most general first
  # world only:
  neg_tier_tokens  int32   (b, 4, L) negatives contradicting each tier
  label/<kind>     int32   (b,)    for each kind of world.CLASS_NAMES
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import grain
import numpy as np
from PIL import Image

from hyperbolic_vl.data import sources, tar_shards, world
from hyperbolic_vl.data import tokenizer as tokenizer_lib

DATA_NAMES = ("world", "image_text_csv", "tfds", "tar_shards")
# Consecutive undecodable examples tolerated before giving up on a row.
MAX_BAD_IN_A_ROW = 64
DEFAULT_TIER_WEIGHTS = (0.0, 0.2, 0.3, 0.5)
# MERU's augmentation: RandomResizedCrop(scale=(0.5, 1.0)), default ratio.
CROP_SCALE = (0.5, 1.0)
CROP_RATIO = (3.0 / 4.0, 4.0 / 3.0)
# Distinguishes augmentation generators from world.sample_scene generators,
# whose seed sequences would otherwise coincide for small seeds.
_AUGMENT_STREAM = 0x617567  # "aug"
_EVAL_NEGATIVES_STREAM = 0x6E6567  # "neg"

_REQUIRED = object()


def _field(
  config: Mapping[str, Any], name: str, default: Any = _REQUIRED, where: str = "input_config"
) -> Any:
  """``config.get(name)`` for dicts and ConfigDicts, with a clear error."""
  value = config.get(name, None) if config is not None else None
  if value is None:
    if default is _REQUIRED:
      raise ValueError(f"{where}.{name} is required")
    return default
  return value


# --------------------------------------------------------------------------
# Augmentation.
# --------------------------------------------------------------------------


def random_resized_crop_box(
  rng: np.random.Generator,
  image_aspect: float = 1.0,
  *,
  scale: tuple[float, float] = CROP_SCALE,
  ratio: tuple[float, float] = CROP_RATIO,
  attempts: int = 10,
  accept: Callable[[tuple[float, float, float, float]], bool] | None = None,
) -> tuple[float, float, float, float]:
  """A random-resized-crop window (x0, y0, x1, y1) in normalised coordinates.

  Follows torchvision's RandomResizedCrop: area fraction uniform in
  ``scale``, aspect ratio (width / height, in pixels) log-uniform in
  ``ratio``, up to ``attempts`` tries, then the whole image.

  Args:
    rng: the generator.
    image_aspect: width / height of the source image in pixels.
    scale: range of the crop's share of the image area.
    ratio: range of the crop's pixel aspect ratio.
    attempts: tries before falling back to the whole image.
    accept: optional extra condition on the window (tried like the bounds).
  """
  log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
  for _ in range(attempts):
    area = rng.uniform(*scale)
    aspect = math.exp(rng.uniform(*log_ratio))
    width = math.sqrt(area * aspect / image_aspect)
    height = math.sqrt(area * image_aspect / aspect)
    if width > 1.0 or height > 1.0:
      continue
    x0 = rng.uniform(0.0, 1.0 - width)
    y0 = rng.uniform(0.0, 1.0 - height)
    box = (x0, y0, x0 + width, y0 + height)
    if accept is None or accept(box):
      return box
  return (0.0, 0.0, 1.0, 1.0)


def _contains_box(outer, inner) -> bool:
  return (
    outer[0] <= inner[0] and outer[1] <= inner[1] and inner[2] <= outer[2] and inner[3] <= outer[3]
  )


def _resize_window(image: np.ndarray | Image.Image, box, size: int) -> np.ndarray:
  """Crops the normalised window ``box`` of ``image`` (an (H, W, 3) array or
  an RGB PIL image) and resizes it to size^2."""
  if not isinstance(image, Image.Image):
    image = Image.fromarray(image)
  width, height = image.size
  pixel_box = (box[0] * width, box[1] * height, box[2] * width, box[3] * height)
  resized = image.resize((size, size), Image.Resampling.BICUBIC, box=pixel_box)
  return np.asarray(resized, dtype=np.uint8)


def _center_square_box(image: np.ndarray):
  """Largest centred square: resize-shorter-side + centre crop, as in eval."""
  height, width = image.shape[:2]
  side = min(height, width)
  x0, y0 = (width - side) / 2 / width, (height - side) / 2 / height
  return (x0, y0, x0 + side / width, y0 + side / height)


def _augment_rng(seed: int, epoch: int, index: int) -> np.random.Generator:
  return np.random.default_rng(np.random.SeedSequence([seed, epoch, index, _AUGMENT_STREAM]))


def _sample_tier(rng: np.random.Generator, cumulative_weights: np.ndarray) -> int:
  # Inverse-CDF sampling; rng.choice(p=...) costs ~10x more per call.
  return min(
    int(np.searchsorted(cumulative_weights, rng.random(), side="right")), world.NUM_TIERS - 1
  )


def _cumulative_tier_weights(data_config) -> np.ndarray:
  """Cumulative, normalised caption-tier sampling weights."""
  weights = np.asarray(_field(data_config, "tier_weights", DEFAULT_TIER_WEIGHTS), np.float64)
  if weights.shape != (world.NUM_TIERS,) or (weights < 0).any() or weights.sum() <= 0:
    raise ValueError(
      f"data.tier_weights must be {world.NUM_TIERS} non-negative weights with a "
      f"positive sum, got {weights.tolist()}"
    )
  return np.cumsum(weights / weights.sum())


# --------------------------------------------------------------------------
# Example makers: picklable callables (epoch, index) -> example dict. An
# example holds the uint8 image and strings; tokenisation happens per batch.
# --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _WorldTrainExample:
  world_seed: int
  augment_seed: int
  image_size: int
  cumulative_tier_weights: np.ndarray

  def __call__(self, epoch: int, index: int) -> dict[str, Any]:
    scene = world.sample_scene(self.world_seed, "train", index)
    rng = _augment_rng(self.augment_seed, epoch, index)
    # The crop must keep the inner half of the main object's box: tiers 2-4
    # describe the main object, and a crop that cuts it away (or halves a
    # diamond into a triangle) would make them false.
    (cx, cy), half = scene.main.center, 0.5 * scene.main.radius
    core = (cx - half, cy - half, cx + half, cy + half)
    crop = random_resized_crop_box(rng, accept=lambda box: _contains_box(box, core))
    tiers = world.caption_tiers(scene)
    negatives = world.negative_tiers(scene, rng)
    tier = _sample_tier(rng, self.cumulative_tier_weights)
    return {
      "image": world.render(scene, self.image_size, crop=crop),
      "caption": tiers[tier],
      "tiers": tiers,
      "neg_tiers": negatives,
      "labels": world.labels(scene),
      "index": index,
    }


def _split_tiers(caption: str, separator: str | None, where: str):
  if separator is None:
    return None
  tiers = [tier.strip() for tier in caption.split(separator)]
  if len(tiers) != world.NUM_TIERS:
    raise ValueError(
      f"{where}: expected {world.NUM_TIERS} caption tiers separated by "
      f"{separator!r}, got {len(tiers)} in {caption!r}"
    )
  return tiers


def _as_text(value: Any, rng: np.random.Generator | None) -> str:
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


def _nested_get(record: Mapping[str, Any], key: str) -> Any:
  """record["a/b"] -> record["a"]["b"], for nested TFDS features."""
  for part in key.split("/"):
    record = record[part]
  return record


@dataclasses.dataclass(frozen=True)
class _RealTrainExample:
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
        rng = _augment_rng(self.augment_seed, epoch, index)
        image, crop = self._image_and_crop(_nested_get(record, self.image_key), rng)
        break
      except tar_shards.BadSampleError as error:
        bad_names.append(str(error))
        index = (index + 1) % len(self.source)
    else:
      raise tar_shards.BadSampleError(
        f"{MAX_BAD_IN_A_ROW} bad examples in a row, first: {bad_names[:3]}"
      )
    caption = _as_text(_nested_get(record, self.caption_key), rng)
    example = {
      "image": _resize_window(image, crop, self.image_size),
      "index": index,
      "bad_names": bad_names,
    }
    tiers = _split_tiers(caption, self.tier_separator, f"example {index}")
    if tiers is None:
      example["caption"] = caption
    else:
      example["caption"] = tiers[_sample_tier(rng, self.cumulative_tier_weights)]
      example["tiers"] = tiers
    return example

  def _image_and_crop(self, raw, rng: np.random.Generator) -> tuple[Any, tuple]:
    """The decoded image and its random-resized-crop window. An encoded
    image learns its size first, so the crop is drawn before the decode and
    a JPEG is decoded only as finely as the crop's downscale needs."""
    if not isinstance(raw, tar_shards.EncodedImage):
      image = _as_rgb(np.asarray(raw))
      height, width = image.shape[:2]
      return image, random_resized_crop_box(rng, image_aspect=width / height)
    crop = None

    def draft_size(width: int, height: int) -> tuple[int, int]:
      nonlocal crop
      crop = random_resized_crop_box(rng, image_aspect=width / height)
      x0, y0, x1, y1 = crop
      # The whole image at this size puts image_size pixels across the crop.
      return (
        math.ceil(self.image_size / max(x1 - x0, 1e-6)),
        math.ceil(self.image_size / max(y1 - y0, 1e-6)),
      )

    return raw.decode_rgb_image(draft_size), crop


def _as_rgb(image: np.ndarray) -> np.ndarray:
  if image.ndim == 2:
    image = image[..., None]
  if image.shape[-1] == 1:
    image = np.repeat(image, 3, axis=-1)
  if image.ndim != 3 or image.shape[-1] != 3:
    raise ValueError(f"expected an (H, W, 3) image, got shape {image.shape}")
  return image.astype(np.uint8, copy=False)


# --------------------------------------------------------------------------
# Batching.
# --------------------------------------------------------------------------


class _CachedEncoder:
  """Tokenizes with a per-string cache.

  The world's grammar has under 2k distinct sentences, so after warm-up
  tokenisation is a dictionary lookup. Real captions are not cached (the
  cache would grow with the dataset).
  """

  def __init__(self, tokenizer, cache: bool, warm_up: Sequence[str] = ()):
    self._tokenizer = tokenizer
    self._cache: dict[str, np.ndarray] | None = {} if cache else None
    if cache and warm_up:
      # One batched encode of the whole grammar beats ~100 small ones.
      self._cache.update(zip(warm_up, tokenizer.encode(list(warm_up))))

  def __call__(self, texts: Sequence[str]) -> np.ndarray:
    if self._cache is None:
      return self._tokenizer.encode(texts)
    missing = [t for t in dict.fromkeys(texts) if t not in self._cache]
    if missing:
      for text, row in zip(missing, self._tokenizer.encode(missing)):
        self._cache[text] = row
    return np.stack([self._cache[t] for t in texts])


@dataclasses.dataclass
class _BatchAssembler:
  """Turns a list of (global position, index) into a batch dict."""

  make_example: Callable[[int, int], dict[str, Any]]
  encode: _CachedEncoder
  num_examples: int

  def __call__(self, positions: Sequence[tuple[int, int]]) -> dict[str, np.ndarray]:
    examples = [
      self.make_example(position // self.num_examples, int(index)) for position, index in positions
    ]
    return _collate(examples, self.encode)


def _collate(examples: Sequence[Mapping[str, Any]], encode) -> dict[str, np.ndarray]:
  batch_size = len(examples)
  images = np.stack([e["image"] for e in examples])
  batch = {
    # uint8 to the device (a quarter of float32's bytes); the image tower
    # scales to [0, 1] there (models/vit.py).
    "image": images.astype(np.uint8, copy=False),
    "tokens": encode([e["caption"] for e in examples]),
    "index": np.asarray([e["index"] for e in examples], np.int64),
  }
  for key, out_key in (("tiers", "tier_tokens"), ("neg_tiers", "neg_tier_tokens")):
    if key in examples[0]:
      flat = encode([t for e in examples for t in e[key]])
      batch[out_key] = flat.reshape(batch_size, world.NUM_TIERS, -1)
  if "bad_names" in examples[0]:
    # Host-side bookkeeping (popped by the trainer, never sent to devices).
    batch["input/bad_samples"] = np.asarray([len(e["bad_names"]) for e in examples], np.int32)
    batch["input/bad_names"] = np.asarray(
      ["\n".join(e["bad_names"]) for e in examples], dtype=object
    )
  if "labels" in examples[0]:
    for kind in world.CLASS_NAMES:
      batch[f"label/{kind}"] = np.asarray([e["labels"][kind] for e in examples], np.int32)
  return batch


# --------------------------------------------------------------------------
# Public API.
# --------------------------------------------------------------------------


def _resolve_tokenizer(input_config, tokenizer):
  if tokenizer is not None:
    return tokenizer
  return tokenizer_lib.get_tokenizer(_field(input_config, "tokenizer"))


def _real_source(data_config, split: str | None, decode: bool = True):
  """(source, image_key, caption_key) for the CSV, TFDS and tar-shard data
  names. decode=False: CSV and tar images come as EncodedImage, for the
  training map to decode at the size its crop needs."""
  name = _field(data_config, "name", where="input_config.data")
  if name == "image_text_csv":
    path = _field(data_config, "path", where="input_config.data")
    if split not in (None, "train"):
      path = _field(data_config, "eval_path", path)
    source = sources.ImageTextCsvSource(
      path,
      _field(data_config, "image_root", where="input_config.data"),
      image_column=_field(data_config, "image_column", "image"),
      caption_column=_field(data_config, "caption_column", "caption"),
      decode=decode,
    )
    return source, "image", "caption"
  if name == "tfds":
    source = sources.tfds_source(
      _field(data_config, "tfds_name", where="input_config.data"),
      split=split or _field(data_config, "split", "train"),
      data_dir=_field(data_config, "data_dir", None),
    )
    return (
      source,
      _field(data_config, "image_key", "image"),
      _field(data_config, "caption_key", "caption"),
    )
  if name == "tar_shards":
    pattern = _field(data_config, "path", where="input_config.data")
    if split not in (None, "train"):
      pattern = _field(data_config, "eval_path", pattern)
    source = tar_shards.TarShardSource(
      pattern,
      caption_key=_field(data_config, "caption_key", "caption"),
      cache_dir=_field(data_config, "index_cache_dir", None) or None,
      decode=decode,
    )
    return source, "image", "caption"
  raise ValueError(f"unknown input_config.data.name {name!r}; valid: {list(DATA_NAMES)}")


def make_train_iterator(
  input_config: Mapping[str, Any],
  tokenizer=None,
  *,
  seed: int,
  process_index: int | None = None,
  process_count: int | None = None,
) -> grain.DatasetIterator:
  """A checkpointable iterator over this process's share of training batches.

  Args:
    input_config: dict or ConfigDict with ``batch_size`` (global),
      ``image_size``, ``data``, optional ``tokenizer`` (a get_tokenizer
      config, used when ``tokenizer`` is None), ``num_workers`` (default 0:
      read in this process), ``num_threads`` (default 1 background reader
      thread), ``prefetch_batches`` (default 2). ``data.name`` picks the
      source:
        "world": num_train (100_000), num_eval (1000), world_seed (0),
          tier_weights (DEFAULT_TIER_WEIGHTS, for tiers 1..4);
        "image_text_csv": path, image_root, image_column ("image"),
          caption_column ("caption"), eval_path (optional), tier_separator
          (optional, e.g. " => " for HierarCaps: 4 tiers per caption),
          tier_weights, num_train (optional cap);
        "tfds": tfds_name, split ("train"), data_dir, image_key ("image"),
          caption_key ("caption"; "a/b" for nested features), tier_separator,
          num_train (optional cap);
        "tar_shards": path (brace pattern ``shard-{000..099}.tar``, glob, or
          comma-separated list), caption_key ("caption", the field of
          KEY.json; KEY.txt is read whole), index_cache_dir (optional; the
          member index is cached next to the shards otherwise), eval_path,
          tier_separator, num_train.
      Real-data batches also carry host-side ``input/bad_samples`` (int32
      per row: undecodable examples skipped for it) and ``input/bad_names``.
    tokenizer: object with ``encode``; built from input_config.tokenizer if
      None.
    seed: shuffling and augmentation seed (the world's content is fixed by
      ``data.world_seed`` instead, so different runs see the same world).
    process_index: this process (default ``jax.process_index()``).
    process_count: number of processes (default ``jax.process_count()``).

  Returns:
    A grain DatasetIterator of batch dicts (see the module docstring).
  """
  if process_index is None or process_count is None:
    import jax  # pylint: disable=g-import-not-at-top  (only for the defaults)

    process_index = jax.process_index() if process_index is None else process_index
    process_count = jax.process_count() if process_count is None else process_count
  global_batch = int(_field(input_config, "batch_size"))
  if global_batch % process_count:
    raise ValueError(f"batch_size {global_batch} is not divisible by process_count {process_count}")
  if not 0 <= process_index < process_count:
    raise ValueError(f"process_index {process_index} not in [0, {process_count})")
  if seed < 0:
    raise ValueError(f"seed must be non-negative, got {seed}")
  local_batch = global_batch // process_count
  tokenizer = _resolve_tokenizer(input_config, tokenizer)
  image_size = int(_field(input_config, "image_size"))
  data_config = _field(input_config, "data")
  weights = _cumulative_tier_weights(data_config)

  if _field(data_config, "name", where="input_config.data") == "world":
    num_examples = int(_field(data_config, "num_train", 100_000))
    make_example = _WorldTrainExample(
      world_seed=int(_field(data_config, "world_seed", 0)),
      augment_seed=seed,
      image_size=image_size,
      cumulative_tier_weights=weights,
    )
    encoder = _CachedEncoder(tokenizer, cache=True, warm_up=world.caption_corpus())
  else:
    source, image_key, caption_key = _real_source(data_config, split=None, decode=False)
    num_examples = min(len(source), int(_field(data_config, "num_train", len(source))))
    if num_examples == 0:
      raise ValueError(f"training source {source!r} is empty")
    make_example = _RealTrainExample(
      source=source,
      augment_seed=seed,
      image_size=image_size,
      cumulative_tier_weights=weights,
      image_key=image_key,
      caption_key=caption_key,
      tier_separator=_field(data_config, "tier_separator", None),
    )
    encoder = _CachedEncoder(tokenizer, cache=False)

  positions = (
    grain.MapDataset.range(num_examples)
    .shuffle(seed=seed)
    .repeat(None)  # infinite; reshuffled every epoch
    .map_with_index(lambda position, index: (position, index))
  )
  # Batch the cheap (position, index) pairs first, then keep every
  # process_count-th chunk: process i gets chunk k * n + i, i.e. the i-th
  # contiguous slice of global batch k, and only renders its own examples.
  batches = (
    positions.batch(local_batch, batch_fn=list)
    .slice(slice(process_index, None, process_count))
    .map(_BatchAssembler(make_example, encoder, num_examples))
  )
  num_threads = int(_field(input_config, "num_threads", 1))
  prefetch = int(_field(input_config, "prefetch_batches", 2))
  dataset = batches.to_iter_dataset(
    grain.ReadOptions(
      num_threads=num_threads, prefetch_buffer_size=max(prefetch, num_threads) if num_threads else 0
    )
  )
  num_workers = int(_field(input_config, "num_workers", 0))
  if num_workers > 0:
    # grain's worker processes read absl flags; outside an absl app (tests,
    # notebooks) they are unparsed, so take their defaults.
    from absl import flags  # pylint: disable=g-import-not-at-top

    if not flags.FLAGS.is_parsed():
      flags.FLAGS.mark_as_parsed()
    dataset = dataset.mp_prefetch(
      grain.MultiprocessingOptions(num_workers=num_workers, per_worker_buffer_size=max(prefetch, 1))
    )
  return iter(dataset)


def load_eval_split(
  input_config: Mapping[str, Any],
  tokenizer=None,
  split: str = "test",
  num_examples: int | None = None,
) -> dict[str, np.ndarray]:
  """A whole evaluation split in memory, deterministic, un-augmented.

  World keys: image (N, H, W, 3) float32 full scenes; tokens (N, L) the most
  specific tier (T4); tier_tokens / neg_tier_tokens (N, 4, L); label/<kind>
  (N,); boxes (N, 4, 4) normalised xyxy, zero-padded beyond num_objects (N,);
  object_labels (N, 4) shape index, -1 padded; index (N,).
  CSV / TFDS keys: image (centre square crop), tokens (the last tier when
  data.tier_separator is set), tier_tokens (when tiered), index.

  Args:
    input_config: as for make_train_iterator.
    tokenizer: built from input_config.tokenizer if None.
    split: "test" or "validation" for the world; the TFDS split name; for
      CSV data, data.eval_path is read when set (else data.path).
    num_examples: default data.num_eval (world: 1000), else the whole split.
  """
  tokenizer = _resolve_tokenizer(input_config, tokenizer)
  image_size = int(_field(input_config, "image_size"))
  data_config = _field(input_config, "data")
  if _field(data_config, "name", where="input_config.data") == "world":
    return _load_world_eval(data_config, tokenizer, split, image_size, num_examples)

  source, image_key, caption_key = _real_source(data_config, split=split)
  separator = _field(data_config, "tier_separator", None)
  if num_examples is None:
    num_examples = int(_field(data_config, "num_eval", len(source)))
  num_examples = min(num_examples, len(source))
  images, captions, tiers = [], [], []
  for index in range(num_examples):
    try:
      record = source[index]
    except tar_shards.BadSampleError:
      continue  # evaluation skips undecodable examples too
    image = _as_rgb(np.asarray(_nested_get(record, image_key)))
    images.append(_resize_window(image, _center_square_box(image), image_size))
    caption = _as_text(_nested_get(record, caption_key), rng=None)
    example_tiers = _split_tiers(caption, separator, f"example {index}")
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
      num_examples, world.NUM_TIERS, -1
    )
  return result


def _load_world_eval(
  data_config, tokenizer, split: str, image_size: int, num_examples: int | None
) -> dict[str, np.ndarray]:
  if split == "train":
    raise ValueError("evaluate on the world's 'validation' or 'test' split")
  world_seed = int(_field(data_config, "world_seed", 0))
  if num_examples is None:
    num_examples = int(_field(data_config, "num_eval", 1000))
  if num_examples < 1:
    raise ValueError(f"num_examples must be positive, got {num_examples}")
  encoder = _CachedEncoder(tokenizer, cache=True)
  images, tiers, negatives = [], [], []
  boxes = np.zeros((num_examples, world.MAX_OBJECTS, 4), np.float32)
  object_labels = np.full((num_examples, world.MAX_OBJECTS), -1, np.int32)
  num_objects = np.zeros((num_examples,), np.int32)
  labels = {kind: np.zeros((num_examples,), np.int32) for kind in world.CLASS_NAMES}
  for index in range(num_examples):
    scene = world.sample_scene(world_seed, split, index)
    images.append(world.render(scene, image_size))
    tiers += world.caption_tiers(scene)
    negatives += world.negative_tiers(
      scene, world.scene_rng(world_seed, split, index, _EVAL_NEGATIVES_STREAM)
    )
    count = scene.count
    num_objects[index] = count
    boxes[index, :count] = world.object_boxes(scene)
    object_labels[index, :count] = world.object_labels(scene)
    for kind, label in world.labels(scene).items():
      labels[kind][index] = label
  tier_tokens = encoder(tiers).reshape(num_examples, world.NUM_TIERS, -1)
  result = {
    "image": np.stack(images).astype(np.float32) * np.float32(1.0 / 255.0),
    "tokens": tier_tokens[:, -1],
    "tier_tokens": tier_tokens,
    "neg_tier_tokens": encoder(negatives).reshape(num_examples, world.NUM_TIERS, -1),
    "boxes": boxes,
    "num_objects": num_objects,
    "object_labels": object_labels,
    "index": np.arange(num_examples, dtype=np.int64),
  }
  for kind, values in labels.items():
    result[f"label/{kind}"] = values
  return result
