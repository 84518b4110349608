"""Per-example pieces the image-caption sources share: random resized crops,
caption-tier sampling, tokenisation with a cache, and collation of examples
into a batch.

An example is a dict holding the uint8 image and strings; tokenisation
happens per batch. `collate` turns examples into::

  image            uint8   (b, H, W, 3)  (the image tower scales to [0, 1])
  tokens           int32   (b, L)  the training caption
  index            int64   (b,)    example index in the source
  tier_tokens      int32   (b, T, L) caption tiers, most general first
                                   (examples with "tiers")
  neg_tier_tokens  int32   (b, T, L) negatives contradicting each tier
                                   (examples with "neg_tiers")
  box_image        uint8   (b, H, W, 3) one grounded box's crop
  box_tokens       int32   (b, L)  its noun phrase (examples with "box_image"
                                   and "box_caption": HyCoCLIP's sources)
                   With `max_boxes` = N > 0 (UNCHA, examples with "box_mask"):
                   box_image (b, N, H, W, 3), box_tokens (b, N, L), zero
                   images and empty phrases in the padded slots, and
  box_mask         bool    (b, N)  which slots hold a box
  unsafe_image     uint8   (b, H, W, 3) the unsafe counterpart of the image
  unsafe_tokens    int32   (b, L)  of the caption (examples with "unsafe_image"
                                   and "unsafe_caption": HySAC's quadruplets)
  label/<kind>     int32   (b,)    the synthetic world's class labels
                                   (examples with "labels")
  input/bad_samples, input/bad_names  host-side counts and names of skipped
                                   undecodable examples (examples with "bad_names")

`Assemble` is every sequential source's batch maker: examples by position,
then `collate`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from PIL import Image

# Caption tiers per example, most general first (the world's and HierarCaps').
NUM_TIERS = 4
DEFAULT_TIER_WEIGHTS = (0.0, 0.2, 0.3, 0.5)
# MERU's augmentation: RandomResizedCrop(scale=(0.5, 1.0)), default ratio.
CROP_SCALE = (0.5, 1.0)
CROP_RATIO = (3.0 / 4.0, 4.0 / 3.0)
# Distinguishes augmentation generators from world.sample_scene generators,
# whose seed sequences would otherwise coincide for small seeds.
_AUGMENT_STREAM = 0x617567  # "aug"


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


def maybe_grayscale(image: np.ndarray, rng: np.random.Generator, prob: float) -> np.ndarray:
  """torchvision's RandomGrayscale(p=prob): with probability `prob` the luma
  (ITU-R 601: 0.299 R + 0.587 G + 0.114 B, PIL's "L") in all three channels.
  With prob 0 nothing is drawn, so the generator's later draws are unchanged."""
  if prob <= 0 or rng.random() >= prob:
    return image
  luma = np.asarray(Image.fromarray(image).convert("L"))
  return np.repeat(luma[..., None], 3, axis=-1)


def padded_boxes(
  box_images: Sequence[np.ndarray], phrases: Sequence[str], max_boxes: int, size: int
) -> dict[str, Any]:
  """An example's first `max_boxes` boxes in fixed shapes: (N, size, size, 3)
  uint8 images with zero images in the empty slots, N phrases ("" in the
  empty slots) and the (N,) validity mask."""
  count = min(len(box_images), max_boxes)
  images = np.zeros((max_boxes, size, size, 3), np.uint8)
  for slot in range(count):
    images[slot] = box_images[slot]
  return {
    "box_image": images,
    "box_caption": [*phrases[:count], *([""] * (max_boxes - count))],
    "box_mask": np.arange(max_boxes) < count,
  }


def contains_box(outer, inner) -> bool:
  return (
    outer[0] <= inner[0] and outer[1] <= inner[1] and inner[2] <= outer[2] and inner[3] <= outer[3]
  )


def resize_window(image: np.ndarray | Image.Image, box, size: int) -> np.ndarray:
  """Crops the normalised window ``box`` of ``image`` (an (H, W, 3) array or
  an RGB PIL image) and resizes it to size^2."""
  if not isinstance(image, Image.Image):
    image = Image.fromarray(image)
  width, height = image.size
  pixel_box = (box[0] * width, box[1] * height, box[2] * width, box[3] * height)
  resized = image.resize((size, size), Image.Resampling.BICUBIC, box=pixel_box)
  return np.asarray(resized, dtype=np.uint8)


def center_square_box(image: np.ndarray):
  """Largest centred square: resize-shorter-side + centre crop, as in eval."""
  height, width = image.shape[:2]
  side = min(height, width)
  x0, y0 = (width - side) / 2 / width, (height - side) / 2 / height
  return (x0, y0, x0 + side / width, y0 + side / height)


def augment_rng(seed: int, epoch: int, index: int) -> np.random.Generator:
  """The augmentation generator of example `index` in `epoch`."""
  return np.random.default_rng(np.random.SeedSequence([seed, epoch, index, _AUGMENT_STREAM]))


def sample_tier(rng: np.random.Generator, cumulative_weights: np.ndarray) -> int:
  # Inverse-CDF sampling; rng.choice(p=...) costs ~10x more per call.
  return min(int(np.searchsorted(cumulative_weights, rng.random(), side="right")), NUM_TIERS - 1)


def cumulative_tier_weights(weights: Sequence[float]) -> np.ndarray:
  """Cumulative, normalised caption-tier sampling weights (data.tier_weights)."""
  weights = np.asarray(weights, np.float64)
  if weights.shape != (NUM_TIERS,) or (weights < 0).any() or weights.sum() <= 0:
    raise ValueError(
      f"data.tier_weights must be {NUM_TIERS} non-negative weights with a "
      f"positive sum, got {weights.tolist()}"
    )
  return np.cumsum(weights / weights.sum())


class CachedEncoder:
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


def collate(examples: Sequence[Mapping[str, Any]], encode) -> dict[str, np.ndarray]:
  """The batch of `examples` (see the module docstring)."""
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
      batch[out_key] = flat.reshape(batch_size, len(examples[0][key]), -1)
  if "box_mask" in examples[0]:
    batch["box_image"] = np.stack([e["box_image"] for e in examples]).astype(np.uint8, copy=False)
    flat = encode([phrase for e in examples for phrase in e["box_caption"]])
    batch["box_tokens"] = flat.reshape(batch_size, len(examples[0]["box_caption"]), -1)
    batch["box_mask"] = np.stack([e["box_mask"] for e in examples]).astype(bool)
  elif "box_image" in examples[0]:
    boxes = np.stack([e["box_image"] for e in examples])
    batch["box_image"] = boxes.astype(np.uint8, copy=False)
    batch["box_tokens"] = encode([e["box_caption"] for e in examples])
  if "unsafe_image" in examples[0]:
    unsafe = np.stack([e["unsafe_image"] for e in examples])
    batch["unsafe_image"] = unsafe.astype(np.uint8, copy=False)
    batch["unsafe_tokens"] = encode([e["unsafe_caption"] for e in examples])
  for kind in examples[0].get("labels", ()):
    batch[f"label/{kind}"] = np.asarray([e["labels"][kind] for e in examples], np.int32)
  if "bad_names" in examples[0]:
    # Host-side bookkeeping (popped by the trainer, never sent to devices).
    batch["input/bad_samples"] = np.asarray([len(e["bad_names"]) for e in examples], np.int32)
    batch["input/bad_names"] = np.asarray(
      ["\n".join(e["bad_names"]) for e in examples], dtype=object
    )
  return batch


@dataclasses.dataclass
class Assemble:
  """(position, index) pairs -> the collated batch of those examples.

  `make_example(epoch, index)` builds one example; position // num_examples
  is its epoch, so a pass over the data draws fresh augmentations. A
  dataclass of picklable parts, so input worker processes can run it.
  """

  make_example: Callable[[int, int], dict[str, Any]]
  encode: CachedEncoder
  num_examples: int

  def __call__(self, positions: Sequence[tuple[int, int]]) -> dict[str, np.ndarray]:
    examples = [
      self.make_example(position // self.num_examples, int(index)) for position, index in positions
    ]
    return collate(examples, self.encode)
