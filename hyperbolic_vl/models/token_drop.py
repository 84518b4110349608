"""Image token dropping while training (FLIP, Li et al. 2023), for every objective.

`model.image_token_drop = r` drops round(N r) of each image's N patch tokens
before the ViT's encoder, a fresh random subset per example and step, so the
image tower runs on N (1 - r) + 1 tokens (models/vit.py gathers the kept
ones after the position embedding: kept patches keep their positions).
Evaluation, inference and export never drop: only a training step puts the
model in dropping mode, through `Objective.loss` (objectives/base.py wraps
every objective's loss), and the mode lives on the module merged for that
step alone.

`model.image_token_drop_until_step = S` > 0 drops for steps [0, S) only and
then sees whole images: FLIP's short unmasked tuning at the end of a run.
The step is counted in the objective's aux state (`STEP_KEY`, checkpointed
with the run), which exists only then.

Mask randomness. Row r of the c-th image-tower call of a step, in a call of
n * b rows over a batch of b examples (n = 1, or 2 when HyCoCLIP sends
images and box crops through one call), draws its subset from

  fold_in(fold_in(fold_in(fold_in(step_rng, SALT), c), r // b), index[r % b])

with `index` the batch's global example indices: the mask of an example
depends on the example, not on the device that holds it, so 1 device and 8
draw the same masks; it changes with the step's rng.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from hyperbolic_vl import errors
from hyperbolic_vl.models import vit

# Folded into the step rng first, so the masks are a stream of their own
# (HMID-Net's student masks and LoRA's dropout use other salts).
SALT = 0x70CE
# The objective aux entry counting steps while a final unmasked phase is set.
STEP_KEY = "image_token_drop_step"


def check_fraction(drop: float) -> float:
  drop = float(drop)
  if not 0.0 <= drop < 1.0:
    raise errors.ConfigError(f"model.image_token_drop={drop}; must be in [0, 1)")
  return drop


def kept_count(num_patches: int, drop: float) -> int:
  """Patches each image keeps: round(N (1 - drop)), as vit.random_keep_indices."""
  return int(round(num_patches * (1.0 - drop)))


def example_keep_indices(
  key: jax.Array, index: jax.Array, rows: int, num_patches: int, drop: float
) -> jax.Array:
  """(rows, K) sorted kept-patch indices for `rows` = n * b image rows of the
  b examples `index` names (see the module docstring for the key of a row)."""
  examples = index.shape[0]
  if rows % examples:
    raise ValueError(
      f"image token dropping needs image rows in whole multiples of the batch's "
      f"{examples} examples, got {rows}"
    )
  slots = jnp.arange(rows) // examples
  row_examples = jnp.tile(jnp.asarray(index), rows // examples)

  def one(slot, example):
    row_key = jax.random.fold_in(jax.random.fold_in(key, slot), example.astype(jnp.uint32))
    return vit.random_keep_indices(row_key, 1, num_patches, drop)[0]

  return jax.vmap(one)(slots, row_examples)


def is_enabled(model) -> bool:
  """Whether `model` drops image tokens while training."""
  return getattr(model, "image_token_drop", 0.0) > 0.0


def has_final_phase(model) -> bool:
  return is_enabled(model) and getattr(model, "image_token_drop_until_step", 0) > 0


def training_mode(model, rng: jax.Array, batch, step: jax.Array | None) -> None:
  """Puts a merged model in dropping mode for one training step."""
  if "index" not in batch:
    raise errors.ConfigError(
      "model.image_token_drop needs the batch's global example indices "
      "(batch['index']); this data source sends none"
    )
  model.begin_token_drop(jax.random.fold_in(rng, SALT), batch["index"], step)
