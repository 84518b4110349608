"""HCL's training examples as a grain dataset: object views and scene/object pairs.

Per example (one scene of a box provider, see data/coco_boxes.py):
  view1, view2  two MoCo views of one object: random resized crops (scale
                0.2-1) of a slightly expanded, jittered window around it
  scene         a region u holding the object: the union of its box and 1-5
                other boxes, or (with probability 1/4, or when it is alone)
                the whole image
  object        the object's own box v (inside u)
The scene is opened once (one JPEG decode) and all four crops are cut from it;
then, when enabled, MoCo-v2's photometric augmentation applies to each.

Example p of the stream (its global position) takes its scene from a per-epoch
shuffle and its randomness from a generator seeded by (seed, p), so the
stream is a pure function of the seed. Batches are cut from the stream in
global-batch blocks and process i of n keeps the i-th slice of each block:
the processes' batches concatenate to the single-process batch, and no
example enters the MoCo queues twice. The iterator is grain's, so its state
(the position) goes into the checkpoint and a resumed run replays exactly.

MoCo-v2's augmentation (He et al. / Chen et al. 2020, as HCL's released
training uses with --aug-plus): colour jitter (brightness, contrast,
saturation 0.4, hue 0.1; the four in random order) with p 0.8, greyscale
with p 0.2, Gaussian blur (sigma in [0.1, 2]) with p 0.5, horizontal flip
with p 0.5. As in HCL's released loader it applies to all four crops, each
drawn independently (the scene and object crops get no random crop). On the
synthetic world colour is a label, so the tiny config turns it off
(`input.data.augment="none"`).

Sources: `world_scene_objects` (the synthetic world's exact boxes; it
evaluates on the world's held-out splits, as `world`) and `coco_scene_objects`
(a COCO-style instances JSON and its images; no evaluation split).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
from PIL import Image, ImageFilter

from hyperbolic_vl.data import coco_boxes, pipeline, registry, transforms, world_source
from hyperbolic_vl.data.settings import SourceSettings

AUGMENTS = ("moco_v2", "none")


# ---------------------------------------------------------------------------
# MoCo-v2 photometric augmentation, one function per operation so each can be
# checked against its formula.
# ---------------------------------------------------------------------------
def _grey(image: np.ndarray) -> np.ndarray:
  """ITU-R 601-2 luma, as PIL's convert("L") (uint8, rounded)."""
  return np.asarray(Image.fromarray(image).convert("L"))


def _blend(image: np.ndarray, other: np.ndarray, factor: float) -> np.ndarray:
  """factor * image + (1 - factor) * other, clipped to uint8 (PIL's enhance)."""
  mixed = factor * image.astype(np.float64) + (1.0 - factor) * other.astype(np.float64)
  return np.clip(np.round(mixed), 0, 255).astype(np.uint8)


def adjust_brightness(image: np.ndarray, factor: float) -> np.ndarray:
  return _blend(image, np.zeros_like(image), factor)


def adjust_contrast(image: np.ndarray, factor: float) -> np.ndarray:
  # Towards the mean luma, as torchvision's and PIL's contrast.
  mean = float(np.mean(_grey(image)))
  return _blend(image, np.full_like(image, int(mean + 0.5)), factor)


def adjust_saturation(image: np.ndarray, factor: float) -> np.ndarray:
  return _blend(image, np.repeat(_grey(image)[..., None], 3, axis=-1), factor)


def adjust_hue(image: np.ndarray, shift: float) -> np.ndarray:
  """Rotates the hue by `shift` turns (in [-0.5, 0.5]) in PIL's 8-bit HSV."""
  hsv = np.asarray(Image.fromarray(image).convert("HSV")).copy()
  hsv[..., 0] = (hsv[..., 0].astype(np.int64) + int(round(shift * 255))) % 256
  return np.asarray(Image.fromarray(hsv, "HSV").convert("RGB"))


def greyscale(image: np.ndarray) -> np.ndarray:
  return np.repeat(_grey(image)[..., None], 3, axis=-1)


def gaussian_blur(image: np.ndarray, sigma: float) -> np.ndarray:
  return np.asarray(Image.fromarray(image).filter(ImageFilter.GaussianBlur(radius=sigma)))


def moco_v2_augment(image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
  """MoCo-v2's photometric augmentation of one uint8 (H, W, 3) view."""
  if rng.uniform() < 0.8:
    # torchvision's ColorJitter: the four factors drawn, then applied in a
    # random order.
    brightness, contrast, saturation = rng.uniform(0.6, 1.4, size=3)
    hue = rng.uniform(-0.1, 0.1)
    for index in rng.permutation(4):
      if index == 0:
        image = adjust_brightness(image, brightness)
      elif index == 1:
        image = adjust_contrast(image, contrast)
      elif index == 2:
        image = adjust_saturation(image, saturation)
      else:
        image = adjust_hue(image, hue)
  if rng.uniform() < 0.2:
    image = greyscale(image)
  if rng.uniform() < 0.5:
    image = gaussian_blur(image, rng.uniform(0.1, 2.0))
  if rng.uniform() < 0.5:
    image = image[:, ::-1]
  return np.ascontiguousarray(image)


# ---------------------------------------------------------------------------
# Windows.
# ---------------------------------------------------------------------------
def jitter_expand(rng, box, scale=(1.0, 1.4), jitter=0.1):
  """Slightly expanded, jittered object window (normalised xyxy, clipped to [0,1])."""
  x0, y0, x1, y1 = box
  w, h = (x1 - x0) * rng.uniform(*scale), (y1 - y0) * rng.uniform(*scale)
  cx = (x0 + x1) / 2 + rng.uniform(-jitter, jitter) * w
  cy = (y0 + y1) / 2 + rng.uniform(-jitter, jitter) * h
  return np.clip([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], 0.0, 1.0)


def sub_crop(rng, window, scale=(0.2, 1.0)):
  """MoCo's random resized crop (scale 0.2-1, aspect 3/4-4/3) inside `window`."""
  x0, y0, x1, y1 = window
  crop = transforms.random_resized_crop_box(rng, scale=scale)  # within the unit square
  return np.asarray(
    [
      x0 + crop[0] * (x1 - x0),
      y0 + crop[1] * (y1 - y0),
      x0 + crop[2] * (x1 - x0),
      y0 + crop[3] * (y1 - y0),
    ]
  )


@dataclasses.dataclass(frozen=True)
class SceneObjectExample:
  """(position, scene index) -> (view1, view2, scene, object), uint8 each."""

  provider: Any
  image_size: int
  seed: int
  min_box_area: float = 0.0
  whole_image_probability: float = 0.25
  augment: str = "none"

  def __post_init__(self):
    if self.augment not in AUGMENTS:
      raise ValueError(f"augment={self.augment!r}; valid: {AUGMENTS}")

  def __call__(self, position: int, index: int) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng((self.seed, int(position), 0x68636C))
    boxes = self.provider.boxes(index)
    areas = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
    keep = np.flatnonzero(areas > self.min_box_area)
    if keep.size == 0:
      keep = np.arange(len(boxes))
    obj = int(rng.choice(keep))
    window = jitter_expand(rng, boxes[obj])
    size = self.image_size
    scene = self.provider.open(index)
    view1 = scene.render(sub_crop(rng, window), size)
    view2 = scene.render(sub_crop(rng, window), size)
    others = [i for i in range(len(boxes)) if i != obj]
    if not others or rng.uniform() < self.whole_image_probability:
      region = np.array([0.0, 0.0, 1.0, 1.0])
    else:
      chosen = rng.choice(others, size=min(len(others), int(rng.integers(1, 6))), replace=False)
      region = np.concatenate(
        [boxes[[obj, *chosen]][:, :2].min(0), boxes[[obj, *chosen]][:, 2:].max(0)]
      )
    crops = [view1, view2, scene.render(region, size), scene.render(boxes[obj], size)]
    if self.augment == "moco_v2":
      # Its own stream: switching the augmentation leaves the crop windows
      # unchanged. As the released loader, every crop is augmented
      # independently, the scene and object crops too (without a crop).
      photometric = np.random.default_rng((self.seed, int(position), 0x6D6F636F))
      crops = [moco_v2_augment(crop, photometric) for crop in crops]
    return tuple(crops)


@dataclasses.dataclass(frozen=True)
class _Assemble:
  make_example: SceneObjectExample

  def __call__(self, rows: list[tuple[int, int]]) -> dict[str, np.ndarray]:
    examples = [self.make_example(position, index) for position, index in rows]
    # uint8 to the device; the image tower scales to [0, 1] there.
    stack = lambda i: np.stack([e[i] for e in examples]).astype(np.uint8, copy=False)
    return {"view1": stack(0), "view2": stack(1), "scene": stack(2), "object": stack(3)}


def make_scene_object_iterator(
  provider,
  *,
  batch_size: int,
  image_size: int,
  seed: int,
  min_box_area: float = 0.0,
  augment: str = "none",
  process_index: int = 0,
  process_count: int = 1,
  num_threads: int = 1,
  prefetch_batches: int = 2,
):
  """A checkpointable iterator over this process's slice of HCL batches."""
  if len(provider) == 0:
    raise ValueError(f"box provider {provider!r} holds no scenes")
  make_example = SceneObjectExample(
    provider, image_size, seed, min_box_area=min_box_area, augment=augment
  )
  batches = pipeline.sliced_batches(
    len(provider),
    seed=seed,
    batch_size=batch_size,
    process_index=process_index,
    process_count=process_count,
    assemble=_Assemble(make_example),
  )
  return pipeline.iterate(batches, num_threads=num_threads, prefetch_batches=prefetch_batches)


_CROP_KEYS = ("view1", "view2", "scene", "object")


@dataclasses.dataclass(frozen=True)
class _CropSettings(SourceSettings):
  # Boxes of at most this normalised area are never the object (HCL drops
  # small objects); "moco_v2" or "none" photometric augmentation.
  min_box_area: float = 0.0
  augment: str = "moco_v2"

  def __post_init__(self):
    if self.augment not in AUGMENTS:
      raise ValueError(f"input.data.augment={self.augment!r}; valid: {AUGMENTS}")


class _SceneObjectSource(registry.DataSource):
  batch_keys = _CROP_KEYS

  def provider(self, settings):
    raise NotImplementedError

  def train_iterator(self, input_settings, settings, tokenizer, *, seed, **layout):
    del tokenizer  # images only
    return make_scene_object_iterator(
      self.provider(settings),
      batch_size=input_settings.batch_size,
      image_size=input_settings.need_image_size(),
      seed=seed,
      min_box_area=settings.min_box_area,
      augment=settings.augment,
      num_threads=input_settings.num_threads,
      prefetch_batches=input_settings.prefetch_batches,
      **layout,
    )


@dataclasses.dataclass(frozen=True)
class WorldSceneObjectsSettings(_CropSettings):
  source = "world_scene_objects"
  num_train: int = 100_000
  num_eval: int = 1000  # default size of the world's evaluation split
  world_seed: int = 0


@registry.register
class WorldSceneObjectsSource(world_source.WorldHeldOut, _SceneObjectSource):
  """The synthetic world's scenes and exact object boxes."""

  name = "world_scene_objects"
  Settings = WorldSceneObjectsSettings

  def provider(self, settings):
    return coco_boxes.WorldBoxes(settings.world_seed, "train", settings.num_train)


@dataclasses.dataclass(frozen=True)
class CocoSceneObjectsSettings(_CropSettings):
  source = "coco_scene_objects"
  path: str = ""  # a COCO-style instances JSON
  image_root: str = ""  # the folder of its images


@registry.register
class CocoSceneObjectsSource(_SceneObjectSource):
  """COCO-style boxes (crowd and <= 56 x 56 px boxes dropped) and their images."""

  name = "coco_scene_objects"
  Settings = CocoSceneObjectsSettings

  def provider(self, settings):
    return coco_boxes.CocoBoxes(settings.path, settings.image_root)
