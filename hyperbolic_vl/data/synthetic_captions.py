"""The synthetic world as an image-caption source (`input.data.name="world"`).

Training examples are scenes of the world's train split, each a random
resized crop (50-100% of the area, aspect 3/4-4/3, as MERU) that keeps the
inner half of the main object, which the captions describe; the training
caption is one of its four tiers, drawn with `tier_weights`. Batches carry
the generic image-caption keys (data/transforms.py) plus `tier_tokens`,
`neg_tier_tokens` and the scene's labels, `label/<kind>` for each kind of
`world.CLASS_NAMES`. The held-out splits ("validation", "test") are the
evaluation splits.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from hyperbolic_vl.data import pipeline, registry, transforms
from hyperbolic_vl.data import synthetic_world as world
from hyperbolic_vl.data.settings import SourceSettings

_EVAL_NEGATIVES_STREAM = 0x6E6567  # "neg"
LABEL_KEYS = tuple(f"label/{kind}" for kind in world.CLASS_NAMES)


@dataclasses.dataclass(frozen=True)
class WorldSettings(SourceSettings):
  source = "world"
  num_train: int = 100_000  # train scenes (the world's content is fixed by world_seed)
  num_eval: int = 1000  # default size of an evaluation split
  world_seed: int = 0
  # Sampling weights of the training caption's tier, tiers 1..4.
  tier_weights: tuple[float, ...] = transforms.DEFAULT_TIER_WEIGHTS


@dataclasses.dataclass(frozen=True)
class WorldTrainExample:
  """(epoch, index) -> the augmented example of train scene `index`."""

  world_seed: int
  augment_seed: int
  image_size: int
  cumulative_tier_weights: np.ndarray
  crop_scale: tuple[float, float] = transforms.CROP_SCALE

  def __call__(self, epoch: int, index: int) -> dict[str, Any]:
    scene = world.sample_scene(self.world_seed, "train", index)
    rng = transforms.augment_rng(self.augment_seed, epoch, index)
    # The crop must keep the inner half of the main object's box: tiers 2-4
    # describe the main object, and a crop that cuts it away (or halves a
    # diamond into a triangle) would make them false.
    (cx, cy), half = scene.main.center, 0.5 * scene.main.radius
    core = (cx - half, cy - half, cx + half, cy + half)
    crop = transforms.random_resized_crop_box(
      rng, scale=self.crop_scale, accept=lambda box: transforms.contains_box(box, core)
    )
    tiers = world.caption_tiers(scene)
    negatives = world.negative_tiers(scene, rng)
    tier = transforms.sample_tier(rng, self.cumulative_tier_weights)
    return {
      "image": world.render(scene, self.image_size, crop=crop),
      "caption": tiers[tier],
      "tiers": tiers,
      "neg_tiers": negatives,
      "labels": world.labels(scene),
      "index": index,
    }


def world_eval_split(
  input_settings, tokenizer, split: str, num_examples: int | None, *, world_seed: int, num_eval: int
) -> dict[str, np.ndarray]:
  """A held-out split of the world, whole scenes (no crop): the evaluation
  split of every source built on the world. num_examples defaults to num_eval.

  Keys: image (N, H, W, 3) float32 in [0, 1]; tokens (N, L) the most
  specific tier (T4); tier_tokens / neg_tier_tokens (N, 4, L); label/<kind>
  (N,); boxes (N, 4, 4) normalised xyxy, zero-padded beyond num_objects (N,);
  object_labels (N, 4) shape index, -1 padded; index (N,).
  """
  if split == "train":
    raise ValueError("evaluate on the world's 'validation' or 'test' split")
  if num_examples is None:
    num_examples = num_eval
  if num_examples < 1:
    raise ValueError(f"num_examples must be positive, got {num_examples}")
  tokenizer = input_settings.resolve_tokenizer(tokenizer)
  image_size = input_settings.need_image_size()
  encoder = transforms.CachedEncoder(tokenizer, cache=True)
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


class WorldHeldOut:
  """Mixin of the sources drawn from the synthetic world: they evaluate on the
  world's held-out scenes (settings `world_seed` and `num_eval`)."""

  eval_source = "world"

  def eval_split(self, input_settings, settings, tokenizer, split, num_examples):
    return world_eval_split(
      input_settings,
      tokenizer,
      split,
      num_examples,
      world_seed=settings.world_seed,
      num_eval=settings.num_eval,
    )


@registry.register
class WorldSource(WorldHeldOut, registry.DataSource):
  """Rendered scenes of the synthetic world with their four caption tiers."""

  name = "world"
  Settings = WorldSettings
  batch_keys = ("image", "tokens", "index", "tier_tokens", "neg_tier_tokens", *LABEL_KEYS)

  def num_train_examples(self, settings):
    return settings.num_train

  def train_iterator(self, input_settings, settings, tokenizer, *, seed, **layout):
    tokenizer = input_settings.resolve_tokenizer(tokenizer)
    make_example = WorldTrainExample(
      world_seed=settings.world_seed,
      augment_seed=seed,
      image_size=input_settings.need_image_size(),
      cumulative_tier_weights=transforms.cumulative_tier_weights(settings.tier_weights),
    )
    encoder = transforms.CachedEncoder(tokenizer, cache=True, warm_up=world.caption_corpus())
    return pipeline.example_input(
      make_example, encoder, settings.num_train, input_settings, seed=seed, **layout
    )
