"""The synthetic world as grounded image-caption data (`input.data.name="world_boxes"`).

HyCoCLIP trains on whole images with their captions and, per example, one
grounded box: an image crop of the box and the noun phrase naming what it
holds (GRIT's boxes and phrases in the paper). The world has exact boxes and
attributes, so here every training example carries

  image / caption          the scene as the `world` source gives it: a random
                           resized crop (50-100% of the area) keeping the inner
                           half of the main object, and one caption tier drawn
                           with `tier_weights` (default: always T4, the whole
                           scene's caption, as GRIT's captions describe the
                           whole image)
  box_image / box_caption  one of the scene's objects, drawn uniformly (the
                           released loader draws one of an example's boxes
                           uniformly too): a random resized crop of its box
                           (50-100% of the box's area, as the released loader
                           applies the whole image's crop to the box image)
                           keeping the inner half of the object, rendered at
                           full resolution by `world.render_region`; and its
                           noun phrase, colour and shape ("a red circle")

With `max_boxes` = N > 0 (UNCHA) an example carries instead the scene's
first N objects in the world's order (no draw, as UNCHA's loader keeps the
first N boxes), each its own crop, in fixed shapes: `box_image` (N, H, W, 3)
and N phrases, zero images and empty phrases past the scene's objects, and
`box_mask` (N,). `crop_scale` (the crops' area share; UNCHA (0.8, 1.0)) and
`grayscale_prob` (UNCHA 0.2, per image and per box) are the `grit` source's
settings (`grounded.GroundedSettings`).

Batches carry `box_image` (uint8, like `image`) and `box_tokens` beside the
`world` source's keys (`image`, `tokens`, `index`, `label/<kind>`). The
evaluation splits are the world's held-out scenes, as for every source drawn
from the world.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from hyperbolic_vl.data import grounded, pipeline, registry, transforms
from hyperbolic_vl.data import synthetic_captions as world_source
from hyperbolic_vl.data import synthetic_world as world

# A random stream of its own for the box: the whole image's crop and caption
# draws stay those of the `world` source for the same seed.
_BOX_STREAM = 0x626F78  # "box"
# The crop keeps this centred share of the object's box (each side), as the
# `world` source keeps the inner half of the main object: a crop that cut
# more away could turn a diamond into a triangle and make the phrase false.
_KEPT_CORE = (0.25, 0.25, 0.75, 0.75)


def box_phrase(obj: world.SceneObject) -> str:
  """The noun phrase of one object: its colour and shape ("a red circle")."""
  return world.with_article(f"{obj.color} {obj.shape}")


def window_in_box(box: Sequence[float], window: Sequence[float]) -> tuple[float, ...]:
  """A window given in the box's own unit square, in scene coordinates."""
  x0, y0, x1, y1 = (float(v) for v in box)
  width, height = x1 - x0, y1 - y0
  return (
    x0 + window[0] * width,
    y0 + window[1] * height,
    x0 + window[2] * width,
    y0 + window[3] * height,
  )


@dataclasses.dataclass(frozen=True)
class WorldBoxesSettings(grounded.GroundedSettings, world_source.WorldSettings):
  source = "world_boxes"
  # The whole image's caption tier, tiers 1..4 (default: the scene caption).
  tier_weights: tuple[float, ...] = (0.0, 0.0, 0.0, 1.0)


@dataclasses.dataclass(frozen=True)
class WorldBoxesExample:
  """(epoch, index) -> scene `index` with one of its objects' box crop and phrase."""

  scene_example: world_source.WorldTrainExample
  image_size: int
  augmentation: grounded.BoxAugmentation = grounded.BoxAugmentation()

  def _box_crop(self, scene, obj, rng: np.random.Generator) -> np.ndarray:
    crop = transforms.random_resized_crop_box(
      rng,
      scale=self.augmentation.crop_scale,
      accept=lambda window: transforms.contains_box(window, _KEPT_CORE),
    )
    image = world.render_region(scene, window_in_box(obj.box, crop), self.image_size)
    return self.augmentation.finish(image, rng)

  def __call__(self, epoch: int, index: int) -> dict[str, Any]:
    example = self.scene_example(epoch, index)
    scene = world.sample_scene(self.scene_example.world_seed, "train", index)
    rng = np.random.default_rng(
      np.random.SeedSequence([self.scene_example.augment_seed, epoch, index, _BOX_STREAM])
    )
    max_boxes = self.augmentation.max_boxes
    if max_boxes:
      objects = scene.objects[:max_boxes]
      example.update(
        transforms.padded_boxes(
          [self._box_crop(scene, obj, rng) for obj in objects],
          [box_phrase(obj) for obj in objects],
          max_boxes,
          self.image_size,
        )
      )
    else:
      obj = scene.objects[int(rng.integers(scene.count))]
      example["box_image"] = self._box_crop(scene, obj, rng)
      example["box_caption"] = box_phrase(obj)
    example["image"] = self.augmentation.finish(example["image"], rng)
    return example


@registry.register
class WorldBoxesSource(world_source.WorldHeldOut, registry.DataSource):
  """World scenes with one grounded object box (crop + noun phrase) each, or
  their first `max_boxes` boxes (then batches also hold `box_mask`)."""

  name = "world_boxes"
  Settings = WorldBoxesSettings
  batch_keys = (
    "image",
    "tokens",
    "box_image",
    "box_tokens",
    "index",
    "tier_tokens",
    "neg_tier_tokens",
    *world_source.LABEL_KEYS,
  )

  def num_train_examples(self, settings):
    return settings.num_train

  def train_iterator(self, input_settings, settings, tokenizer, *, seed, **layout):
    tokenizer = input_settings.resolve_tokenizer(tokenizer)
    image_size = input_settings.need_image_size()
    scene_example = world_source.WorldTrainExample(
      world_seed=settings.world_seed,
      augment_seed=seed,
      image_size=image_size,
      cumulative_tier_weights=transforms.cumulative_tier_weights(settings.tier_weights),
      crop_scale=tuple(settings.crop_scale),
    )
    # Box phrases ("a red circle") are tier-3 captions: the corpus has them.
    encoder = transforms.CachedEncoder(tokenizer, cache=True, warm_up=world.caption_corpus())
    return pipeline.example_input(
      WorldBoxesExample(scene_example, image_size, settings.augmentation()),
      encoder,
      settings.num_train,
      input_settings,
      seed=seed,
      **layout,
    )
