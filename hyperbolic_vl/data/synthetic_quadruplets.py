"""The synthetic world as HySAC's quadruplets (`input.data.name="world_quadruplets"`).

HySAC trains on (safe image, safe caption, unsafe image, unsafe caption):
ViSU pairs each COCO image and caption with a generated unsafe image and an
unsafe rewrite of the caption. In the world, the unsafe counterpart of a
scene is the same scene carrying a marked attribute, "unsafe", that is both
drawn and named, so unsafe content is distinguishable in pixels and in words
and everything else (shapes, colours, count, background) is shared:

  image / caption                 the `world` source's example: a random
                                  resized crop keeping the inner half of the
                                  main object, one caption tier drawn with
                                  `tier_weights` (default T4, the scene caption)
  unsafe_image / unsafe_caption   the same crop of the same scene with a white
                                  X drawn over the main object (white is no
                                  colour of the world and no background
                                  level), and the same caption with "unsafe"
                                  after its article ("an unsafe large red
                                  circle and two other shapes on ...")

The word "unsafe" is not in the world tokenizer's corpus; its pieces are
("unsafe" encodes as six sub-word pieces), so the tokenizer stays the one
every world run uses. Evaluation splits are the world's held-out scenes
with `unsafe_image` and `unsafe_tokens` beside the `world` split's keys.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from hyperbolic_vl.data import pipeline, registry, transforms
from hyperbolic_vl.data import synthetic_captions as world_source
from hyperbolic_vl.data import synthetic_world as world

UNSAFE_WORD = "unsafe"
# Half width of each bar of the X, as a fraction of the main object's radius:
# wide enough to cover ~25 % of a 16-px object's box.
_MARK_HALF_WIDTH = 0.18
_MARK_RGB = np.asarray((255, 255, 255), np.uint8)


def unsafe_caption(caption: str) -> str:
  """ "a red circle" -> "an unsafe red circle": the marked attribute named."""
  article, rest = caption.split(" ", 1)
  if article not in ("a", "an"):
    raise ValueError(f"a world caption starts with its article, got {caption!r}")
  return world.with_article(f"{UNSAFE_WORD} {rest}")


def draw_unsafe_mark(
  image: np.ndarray, scene: world.Scene, crop: Sequence[float] | None = None
) -> np.ndarray:
  """`image` (the render of `scene` at `crop`) with the white X over the main
  object's box; a new array."""
  size = image.shape[0]
  x0, y0, x1, y1 = (0.0, 0.0, 1.0, 1.0) if crop is None else (float(v) for v in crop)
  xs = x0 + (np.arange(size) + 0.5) * (x1 - x0) / size
  ys = y0 + (np.arange(size) + 0.5) * (y1 - y0) / size
  (cx, cy), radius = scene.main.center, scene.main.radius
  dx, dy = xs[None, :] - cx, ys[:, None] - cy
  inside = (np.abs(dx) <= radius) & (np.abs(dy) <= radius)
  # Distance to the diagonals x = y and x = -y is |dx -+ dy| / sqrt(2).
  half_width = _MARK_HALF_WIDTH * radius * np.sqrt(2.0)
  on_bar = (np.abs(dx - dy) <= half_width) | (np.abs(dx + dy) <= half_width)
  marked = image.copy()
  marked[inside & on_bar] = _MARK_RGB
  return marked


def render_unsafe(scene: world.Scene, size: int, crop: Sequence[float] | None = None) -> np.ndarray:
  """The unsafe counterpart of `world.render(scene, size, crop)`."""
  return draw_unsafe_mark(world.render(scene, size, crop=crop), scene, crop)


@dataclasses.dataclass(frozen=True)
class WorldQuadrupletSettings(world_source.WorldSettings):
  source = "world_quadruplets"
  # The safe caption's tier, tiers 1..4 (default: the scene caption, as
  # ViSU's captions describe the whole image).
  tier_weights: tuple[float, ...] = (0.0, 0.0, 0.0, 1.0)


@dataclasses.dataclass(frozen=True)
class WorldQuadrupletExample:
  """(epoch, index) -> train scene `index` and its unsafe counterpart, one crop."""

  world_seed: int
  augment_seed: int
  image_size: int
  cumulative_tier_weights: np.ndarray

  def __call__(self, epoch: int, index: int) -> dict[str, Any]:
    scene = world.sample_scene(self.world_seed, "train", index)
    rng = transforms.augment_rng(self.augment_seed, epoch, index)
    (cx, cy), half = scene.main.center, 0.5 * scene.main.radius
    core = (cx - half, cy - half, cx + half, cy + half)
    crop = transforms.random_resized_crop_box(
      rng, accept=lambda box: transforms.contains_box(box, core)
    )
    caption = world.caption_tiers(scene)[transforms.sample_tier(rng, self.cumulative_tier_weights)]
    image = world.render(scene, self.image_size, crop=crop)
    return {
      "image": image,
      "caption": caption,
      "unsafe_image": draw_unsafe_mark(image, scene, crop),
      "unsafe_caption": unsafe_caption(caption),
      "labels": world.labels(scene),
      "index": index,
    }


def quadruplet_eval_split(
  input_settings, tokenizer, split: str, num_examples: int | None, *, world_seed: int, num_eval: int
) -> dict[str, np.ndarray]:
  """The world's held-out split (world_source.world_eval_split) plus
  unsafe_image (N, H, W, 3) float32 in [0, 1] and unsafe_tokens (N, L), the
  unsafe counterpart of `tokens` (T4)."""
  result = world_source.world_eval_split(
    input_settings, tokenizer, split, num_examples, world_seed=world_seed, num_eval=num_eval
  )
  tokenizer = input_settings.resolve_tokenizer(tokenizer)
  image_size = input_settings.need_image_size()
  images, captions = [], []
  for index in range(result["image"].shape[0]):
    scene = world.sample_scene(world_seed, split, index)
    images.append(render_unsafe(scene, image_size))
    captions.append(unsafe_caption(world.caption_tiers(scene)[-1]))
  result["unsafe_image"] = np.stack(images).astype(np.float32) * np.float32(1.0 / 255.0)
  result["unsafe_tokens"] = tokenizer.encode(captions)
  return result


@registry.register
class WorldQuadrupletSource(registry.DataSource):
  """World scenes with their marked unsafe counterparts: HySAC's quadruplets."""

  name = "world_quadruplets"
  eval_source = "world_quadruplets"
  Settings = WorldQuadrupletSettings
  batch_keys = (
    "image",
    "tokens",
    "unsafe_image",
    "unsafe_tokens",
    "index",
    *world_source.LABEL_KEYS,
  )

  def num_train_examples(self, settings):
    return settings.num_train

  def train_iterator(self, input_settings, settings, tokenizer, *, seed, **layout):
    tokenizer = input_settings.resolve_tokenizer(tokenizer)
    make_example = WorldQuadrupletExample(
      world_seed=settings.world_seed,
      augment_seed=seed,
      image_size=input_settings.need_image_size(),
      cumulative_tier_weights=transforms.cumulative_tier_weights(settings.tier_weights),
    )
    encoder = transforms.CachedEncoder(tokenizer, cache=True, warm_up=world.caption_corpus())
    return pipeline.example_input(
      make_example, encoder, settings.num_train, input_settings, seed=seed, **layout
    )

  def eval_split(self, input_settings, settings, tokenizer, split, num_examples):
    return quadruplet_eval_split(
      input_settings,
      tokenizer,
      split,
      num_examples,
      world_seed=settings.world_seed,
      num_eval=settings.num_eval,
    )
