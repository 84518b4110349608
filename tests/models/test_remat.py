"""Rematerialised encoder blocks (`model.image_remat`, `model.text_remat`):
the same loss and gradients as without, less kept for the backward pass,
and bad values refused naming the key."""

import math

import jax
import jax.numpy as jnp
import pytest
from flax import nnx
from tiny_fixtures import (
  IMAGE,
  as_float64,
  leafwise_relative_differences,
  loss_and_grads,
  random_batch,
  tiny_two_towers,
)

from hyperbolic_vl import errors
from hyperbolic_vl.models import hcl, tower_options
from hyperbolic_vl.models import registry as models_registry
from hyperbolic_vl.objectives import clip as clip_lib
from hyperbolic_vl.objectives import meru as meru_lib

POLICIES = ("none", "dots_saveable", "full")

# Remat recomputes the same operations on the same inputs; only the
# compiler's fusion of the recomputed and the stored parts can differ, which
# reassociates a few float64 sums: a few ulps (2.2e-16 each) times the sums'
# condition number. 1e-12 allows ~4500 ulps; a policy that changed the
# function (a dropped or doubled term) moves gradients by far more than 1e-6.
REMAT_RTOL = 1e-12

OBJECTIVES = {
  "meru": ("lorentz", lambda: meru_lib.MeruObjective({"name": "meru"})),
  "clip": ("euclidean", lambda: clip_lib.ClipObjective({"name": "clip"})),
}
# (image_remat, text_remat) pairs compared with ("none", "none"): every
# policy on both towers for MERU, a mixed pair for CLIP.
SETTINGS = {
  "meru": (("dots_saveable", "dots_saveable"), ("full", "full")),
  "clip": (("full", "dots_saveable"),),
}


# The rematerialised towers are the same for every objective: MERU's case
# repeats CLIP's path and is in the slow tier.
@pytest.mark.parametrize("name", ["clip", pytest.param("meru", marks=pytest.mark.slow)])
def test_remat_keeps_loss_and_gradients_float64(name):
  geometry, make_objective = OBJECTIVES[name]
  results = {}
  with jax.enable_x64(True):
    batch = as_float64(random_batch(16))
    for image_remat, text_remat in (("none", "none"),) + SETTINGS[name]:
      model_def, params = tiny_two_towers(
        geometry=geometry, dtype="float64", image_remat=image_remat, text_remat=text_remat
      )
      results[image_remat, text_remat] = loss_and_grads(
        model_def, as_float64(params), make_objective(), batch, num_devices=1
      )
  loss, grads = results["none", "none"][:2]
  for setting in SETTINGS[name]:
    other_loss, other_grads = results[setting][:2]
    worst = max(leafwise_relative_differences(other_grads, grads).values())
    print(
      f"[{name}, remat {setting} vs none, float64] loss {other_loss - loss:.1e}, grads {worst:.1e}"
    )
    assert abs(other_loss - loss) <= REMAT_RTOL * abs(loss)
    assert worst <= REMAT_RTOL


def saved_residual_bytes(policy: str) -> int:
  """Bytes JAX keeps from the towers' forward pass for the backward one
  (the residuals of `jax.vjp`, parameters included), batch 16."""
  model_def, params = tiny_two_towers(image_remat=policy, text_remat=policy)
  batch = random_batch(16)

  def towers(params):
    model = model_def.merge(params)
    image = model.image_tangent(jnp.asarray(batch["image"]))
    return jnp.sum(image * model.text_tangent(jnp.asarray(batch["tokens"])))

  residuals = jax.eval_shape(lambda p: jax.vjp(towers, p)[1], params)
  return sum(math.prod(x.shape) * x.dtype.itemsize for x in jax.tree.leaves(residuals))


def test_remat_keeps_less_for_the_backward_pass():
  """What JAX hands the compiler to store: "full" keeps each block's input,
  "dots_saveable" the matrix products too, "none" every activation.

  XLA's compiled temp memory is not asserted: the CPU compiler drops the
  barriers between a block's forward pass and its recomputation and merges
  the two again, so on a CPU the figures do not move (they do on GPU/TPU;
  benchmarks/memory_levers.py prints both)."""
  saved = {policy: saved_residual_bytes(policy) for policy in POLICIES}
  print(f"[remat] bytes saved for the backward pass: {saved}")
  assert saved["full"] < saved["dots_saveable"] < saved["none"]


def test_bad_remat_values_name_the_key():
  with pytest.raises(errors.ConfigError, match=r"^model.image_remat='all'; valid: \[") as error:
    tiny_two_towers(image_remat="all")
  assert "\n" not in str(error.value)
  with pytest.raises(errors.ConfigError, match=r"^model.text_remat='dots'; valid: \["):
    tiny_two_towers(text_remat="dots")
  with pytest.raises(errors.ConfigError, match="model.image_remat='full' applies to ViT"):
    tiny_two_towers(image_variant="RN-mu", image_remat="full")
  with pytest.raises(errors.ConfigError, match=r"^model.image_remat='x'; valid: \["):
    hcl.HclModel(
      image_variant="mu/8",
      image_size=IMAGE,
      embed_dim=8,
      head_dim=8,
      image_remat="x",
      rngs=nnx.Rngs(params=0),
    )


def test_config_keys_reach_the_encoders():
  assert tower_options.tower_options({})["image_remat"] == "none"
  assert tower_options.tower_options({})["text_remat"] == "none"
  sizes = dict(image_size=IMAGE, vocab_size=40, context_length=8, rngs=nnx.Rngs(params=0))
  model_config = dict(image_variant="mu/8", text_variant="mu", embed_dim=8)
  module = models_registry.build(
    dict(model_config, image_remat="full", text_remat="dots_saveable"), **sizes
  )
  assert module.image_tower.encoder.remat == "full"
  assert module.text_tower.encoder.remat == "dots_saveable"
  module = models_registry.build(dict(model_config, name="hcl", image_remat="full"), **sizes)
  assert module.image_tower.encoder.remat == "full"
