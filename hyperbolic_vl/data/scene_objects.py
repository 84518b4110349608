"""HCL's training examples as a grain dataset: object views and scene/object pairs.

Per example (one scene of a box provider, see data/coco_boxes.py), with
`sampling="released"` (default; HCL's released loader, in the scene's pixels):
  boxes         the scene's boxes of at least 56 x 56 px (`min_box_pixels`;
                smaller ones dropped: area < min, as released); a scene left
                with fewer than 2 is replaced by a uniformly drawn other scene
                until one has 2
  object        one of them, uniformly: the object crop v (its own box)
  view1, view2  two MoCo views of it: random resized crops (scale 0.2-1,
                aspect 3/4-4/3) of the object's box, or, when the box covers
                under 256 x 256 px, of a window around it whose edges move out
                by a uniform whole number of pixels, up to 256 - box width
                (left, right and bottom) or 256 - box height (top), within
                the image (the released code bounds the bottom edge by the
                width's margin)
  scene         the union box u of k boxes drawn without replacement, k
                uniform in [2, max(min(n, 6), 3) - 1] for n boxes, and the
                object's box added when not among them
`sampling="whole_scene"` (this codebase's earlier reading, kept for
comparison): any box may be the object (the largest fallback: all of them);
the views are crops of a window 1-1.4x the object's box, jittered by up to
0.1 of its size; the scene is the whole image with probability 1/4 (always
when the object is alone), else the union of the object's box and 1-5 others.
The scene is opened once (one JPEG decode) and all four crops are cut from
it; then, when enabled, MoCo-v2's photometric augmentation applies to each.

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

Sources: `world_scene_objects` (the synthetic world's exact boxes, read as
`scene_pixels`-pixel images; it evaluates on the world's held-out splits, as
`world`) and `coco_scene_objects` (a COCO-style instances JSON and its
images; no evaluation split).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
from PIL import Image, ImageFilter

from hyperbolic_vl import errors
from hyperbolic_vl.data import pipeline, registry, transforms
from hyperbolic_vl.data import synthetic_captions as world_source
from hyperbolic_vl.data.readers import object_boxes as coco_boxes
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
# Windows of the released sampling, in the scene's pixels.
# ---------------------------------------------------------------------------
RELEASED_PAD_TO = 256  # objects under 256 x 256 px get a widened view window
# Draws of a replacement scene before a source with too few multi-object
# scenes is reported.
MAX_SCENE_DRAWS = 1000


def kept_boxes(pixel_boxes: np.ndarray, min_box_pixels: int) -> np.ndarray:
  """Boxes of at least `min_box_pixels` pixels (the released `area < min`
  drops a box; one of exactly min_box_pixels stays) and of positive sides."""
  boxes = np.asarray(pixel_boxes, np.int64).reshape(-1, 4)
  sides = boxes[:, 2:] - boxes[:, :2]
  keep = (sides[:, 0] * sides[:, 1] >= min_box_pixels) & np.all(sides > 0, axis=1)
  return boxes[keep]


def widened_window(rng, box, width: int, height: int, pad_to: int = RELEASED_PAD_TO):
  """The released loader's window around a small object box (pixels).

  Each edge moves out by a uniform whole number of pixels: left and right by
  up to max(0, pad_to - box width), top by up to max(0, pad_to - box
  height), bottom (as released) by up to the width's margin, all within the
  image.
  """
  x0, y0, x1, y1 = (int(v) for v in box)
  margin_x = max(0, pad_to - (x1 - x0))
  margin_y = max(0, pad_to - (y1 - y0))
  left = int(rng.integers(max(0, x0 - margin_x), x0 + 1))
  right = int(rng.integers(x1, min(width, x1 + margin_x) + 1))
  top = int(rng.integers(max(0, y0 - margin_y), y0 + 1))
  bottom = int(rng.integers(y1, min(height, y1 + margin_x) + 1))
  return np.asarray([left, top, right, bottom], np.int64)


def view_window(rng, box, width: int, height: int, pad_to: int = RELEASED_PAD_TO):
  """The object's box itself when it covers pad_to^2 px or more, else the
  widened window around it."""
  x0, y0, x1, y1 = (int(v) for v in box)
  if (x1 - x0) * (y1 - y0) < pad_to * pad_to:
    return widened_window(rng, box, width, height, pad_to)
  return np.asarray([x0, y0, x1, y1], np.int64)


def scene_union(rng, boxes: np.ndarray, obj: int) -> np.ndarray:
  """The released scene region: the union box of k of the n boxes, k uniform
  in [2, max(min(n, 6), 3) - 1] drawn without replacement, with the object's
  box added when it was not drawn."""
  n = len(boxes)
  count = int(rng.integers(2, max(min(n, 6), 3)))
  chosen = rng.permutation(n)[:count]
  if obj not in chosen:
    chosen = np.append(chosen, obj)
  return np.concatenate([boxes[chosen, :2].min(0), boxes[chosen, 2:].max(0)])


def sub_crop(rng, window, scale=(0.2, 1.0), aspect: float = 1.0):
  """MoCo's random resized crop (scale 0.2-1, aspect 3/4-4/3) inside `window`,
  whose own width / height is `aspect` (in the window's units)."""
  x0, y0, x1, y1 = window  # in the window's own dtype (float32 whole_scene windows)
  # Within the unit square.
  crop = transforms.random_resized_crop_box(rng, aspect, scale=scale)
  return np.asarray(
    [
      x0 + crop[0] * (x1 - x0),
      y0 + crop[1] * (y1 - y0),
      x0 + crop[2] * (x1 - x0),
      y0 + crop[3] * (y1 - y0),
    ]
  )


# ---------------------------------------------------------------------------
# Windows of the "whole_scene" sampling, normalised.
# ---------------------------------------------------------------------------
def jitter_expand(rng, box, scale=(1.0, 1.4), jitter=0.1):
  """Slightly expanded, jittered object window (normalised xyxy, clipped to [0,1])."""
  x0, y0, x1, y1 = box
  w, h = (x1 - x0) * rng.uniform(*scale), (y1 - y0) * rng.uniform(*scale)
  cx = (x0 + x1) / 2 + rng.uniform(-jitter, jitter) * w
  cy = (y0 + y1) / 2 + rng.uniform(-jitter, jitter) * h
  return np.clip([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], 0.0, 1.0)


SAMPLINGS = ("released", "whole_scene")


@dataclasses.dataclass(frozen=True)
class SceneObjectExample:
  """(position, scene index) -> (view1, view2, scene, object), uint8 each."""

  provider: Any
  image_size: int
  seed: int
  min_box_pixels: int = coco_boxes.HCL_MIN_BOX_AREA
  sampling: str = "released"
  whole_image_probability: float = 0.25  # sampling="whole_scene" only
  augment: str = "none"

  def __post_init__(self):
    if self.augment not in AUGMENTS:
      raise ValueError(f"augment={self.augment!r}; valid: {AUGMENTS}")
    if self.sampling not in SAMPLINGS:
      raise ValueError(f"sampling={self.sampling!r}; valid: {SAMPLINGS}")

  def released_windows(self, rng, index: int):
    """(scene index, pixel windows [view1, view2, scene, object])."""
    for _ in range(MAX_SCENE_DRAWS):
      boxes = kept_boxes(self.provider.pixel_boxes(index), self.min_box_pixels)
      if len(boxes) >= 2:
        break
      index = int(rng.integers(len(self.provider)))
    else:
      raise errors.DataError(
        f"no scene with 2 boxes of >= {self.min_box_pixels} px in {MAX_SCENE_DRAWS} draws: "
        "HCL's released sampling needs multi-object scenes (input.data.sampling="
        "'whole_scene' also takes single-object ones)"
      )
    width, height = self.provider.pixel_size(index)
    obj = int(rng.integers(len(boxes)))
    window = view_window(rng, boxes[obj], width, height)
    aspect = (window[2] - window[0]) / (window[3] - window[1])
    views = [sub_crop(rng, window, aspect=aspect) for _ in range(2)]
    region = scene_union(rng, boxes, obj)
    return index, [*views, region, boxes[obj]]

  def whole_scene_windows(self, rng, index: int):
    """(scene index, normalised windows [view1, view2, scene, object]); boxes
    under min_box_pixels are left out unless no other remains."""
    boxes = self.provider.boxes(index)
    pixel_boxes = np.asarray(self.provider.pixel_boxes(index), np.int64)
    areas = (pixel_boxes[:, 2] - pixel_boxes[:, 0]) * (pixel_boxes[:, 3] - pixel_boxes[:, 1])
    if np.any(areas >= self.min_box_pixels):
      boxes = boxes[areas >= self.min_box_pixels]
    obj = int(rng.choice(len(boxes)))
    window = jitter_expand(rng, boxes[obj])
    views = [sub_crop(rng, window) for _ in range(2)]
    others = [i for i in range(len(boxes)) if i != obj]
    if not others or rng.uniform() < self.whole_image_probability:
      region = np.array([0.0, 0.0, 1.0, 1.0])
    else:
      chosen = rng.choice(others, size=min(len(others), int(rng.integers(1, 6))), replace=False)
      region = np.concatenate(
        [boxes[[obj, *chosen]][:, :2].min(0), boxes[[obj, *chosen]][:, 2:].max(0)]
      )
    return index, [*views, region, boxes[obj]]

  def __call__(self, position: int, index: int) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng((self.seed, int(position), 0x68636C))
    size = self.image_size
    if self.sampling == "released":
      index, windows = self.released_windows(rng, index)
      scene = self.provider.open(index)
      crops = [scene.render_pixels(window, size) for window in windows]
    else:
      index, windows = self.whole_scene_windows(rng, index)
      scene = self.provider.open(index)
      crops = [scene.render(window, size) for window in windows]
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
  min_box_pixels: int = coco_boxes.HCL_MIN_BOX_AREA,
  sampling: str = "released",
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
    provider,
    image_size,
    seed,
    min_box_pixels=min_box_pixels,
    sampling=sampling,
    augment=augment,
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
  # "released" (HCL's released loader) or "whole_scene" (the earlier reading
  # here), see the module docstring.
  sampling: str = "released"
  # Boxes of fewer pixels (area, in the scene's pixels) are never sampled:
  # 56 x 56 as released ("small objects are always detrimental").
  min_box_pixels: int = coco_boxes.HCL_MIN_BOX_AREA
  # "moco_v2" or "none" photometric augmentation.
  augment: str = "moco_v2"

  def __post_init__(self):
    if self.augment not in AUGMENTS:
      raise ValueError(f"input.data.augment={self.augment!r}; valid: {AUGMENTS}")
    if self.sampling not in SAMPLINGS:
      raise ValueError(f"input.data.sampling={self.sampling!r}; valid: {SAMPLINGS}")


class _SceneObjectSource(registry.DataSource):
  batch_keys = _CROP_KEYS

  def provider(self, settings):
    raise NotImplementedError

  def num_train_examples(self, settings):
    return len(self.provider(settings))

  def train_iterator(self, input_settings, settings, tokenizer, *, seed, **layout):
    del tokenizer  # images only
    return make_scene_object_iterator(
      self.provider(settings),
      batch_size=input_settings.batch_size,
      image_size=input_settings.need_image_size(),
      seed=seed,
      min_box_pixels=settings.min_box_pixels,
      sampling=settings.sampling,
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
  # The side, in pixels, the world's scenes are read as for the pixel rules
  # (min_box_pixels, the released 256 px view window).
  scene_pixels: int = coco_boxes.WORLD_SCENE_PIXELS


@registry.register
class WorldSceneObjectsSource(world_source.WorldHeldOut, _SceneObjectSource):
  """The synthetic world's scenes and exact object boxes."""

  name = "world_scene_objects"
  Settings = WorldSceneObjectsSettings

  def provider(self, settings):
    return coco_boxes.WorldBoxes(
      settings.world_seed, "train", settings.num_train, settings.scene_pixels
    )


@dataclasses.dataclass(frozen=True)
class CocoSceneObjectsSettings(_CropSettings):
  source = "coco_scene_objects"
  path: str = ""  # a COCO-style instances JSON
  image_root: str = ""  # the folder of its images


@registry.register
class CocoSceneObjectsSource(_SceneObjectSource):
  """COCO-style boxes (crowd boxes dropped) and their images."""

  name = "coco_scene_objects"
  Settings = CocoSceneObjectsSettings

  def provider(self, settings):
    return coco_boxes.CocoBoxes(settings.path, settings.image_root)
