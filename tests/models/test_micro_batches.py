"""Towers in micro-batches (models/micro_batches.py): the same features and
gradients as one call on every row, masked images and row counts the
micro-batch count does not divide included, and less compiled memory."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from model_refs import build, built_model_def, fast_compile_jit
from tiny_fixtures import (
  IMAGE,
  as_float64,
  leafwise_relative_differences,
  random_batch,
  tiny_two_towers,
)

from hyperbolic_vl.models import hcl, micro_batches, vit
from hyperbolic_vl.models import registry as models_registry
from hyperbolic_vl.objectives import meru as meru_lib
from hyperbolic_vl.training import sharding
from hyperbolic_vl.training import step as step_lib

# The micro-batches compute each row with the same operations as one call;
# the parameter gradients are summed per micro-batch, then over them: a
# reassociated float64 sum, a few ulps times its condition number. 1e-12
# leaves ~4500 ulps; a lost or duplicated row moves results by O(1/rows).
ROWS_RTOL = 1e-12


def features_and_vjp(model_def, params, count, features, *rows):
  """(features, parameter gradient of <features, fixed weights>) with the
  model in `count` micro-batches."""

  # Fast test-only compile options (tests/fixtures/model_refs.py): both
  # counts' programs get them, and they change values by float64 rounding.
  @fast_compile_jit
  def features_and_gradient(params, rows):
    def project(params):
      model = model_def.merge(params)
      micro_batches.set_micro_batches(model, count)
      return features(model, *rows)

    out, vjp = jax.vjp(project, params)
    weights = jax.random.normal(jax.random.key(1), out.shape, out.dtype)
    return out, vjp(weights)[0]

  return features_and_gradient(params, rows)


def assert_micro_batches_match_one_call(model_def, params, features, *rows, count=4):
  whole, whole_grads = features_and_vjp(model_def, params, 1, features, *rows)
  split, split_grads = features_and_vjp(model_def, params, count, features, *rows)
  assert split.shape == whole.shape
  np.testing.assert_allclose(split, whole, rtol=ROWS_RTOL, atol=0)
  worst = max(leafwise_relative_differences(split_grads, whole_grads).values())
  assert worst <= ROWS_RTOL, worst


@pytest.fixture(scope="module")
def float64_model():
  """The tiny float64 two-tower model, built once (one compile) for the module."""
  with jax.enable_x64(True):
    return built_model_def(lambda: tiny_two_towers(dtype="float64"))


@pytest.mark.parametrize("rows", [10, 1])
def test_text_rows_in_micro_batches_float64(rows, float64_model):
  """10 rows: 4 micro-batches of 3, the last padded with
  copies of row 9, whose outputs are dropped and whose gradient is zero;
  1 row (a root caption): one call."""
  with jax.enable_x64(True):
    model_def, params = float64_model
    tokens = jnp.asarray(random_batch(max(rows, 2))["tokens"][:rows])
    assert_micro_batches_match_one_call(
      model_def, as_float64(params), lambda m, t: m.text_tangent(t), tokens
    )


def test_masked_image_rows_in_micro_batches_float64(float64_model):
  """HMID-Net's kept patches travel with their images' rows."""
  with jax.enable_x64(True):
    model_def, params = float64_model
    images = jnp.asarray(random_batch(8)["image"], jnp.float64)
    num_patches = model_def.module.image_tower.num_patches
    keep = jax.jit(vit.random_keep_indices, static_argnums=(1, 2, 3))(
      jax.random.key(3), 8, num_patches, 0.5
    )
    assert_micro_batches_match_one_call(
      model_def,
      as_float64(params),
      lambda m, x, k: m.image_tangent(x, keep_indices=k),
      images,
      keep,
    )


def test_hcl_head_output_in_micro_batches_float64():
  with jax.enable_x64(True):
    module = build(
      lambda: hcl.HclModel(
        image_variant="mu/8",
        image_size=IMAGE,
        embed_dim=8,
        head_dim=16,
        dtype="float64",
        rngs=nnx.Rngs(params=0),
      )
    )
    model_def, params = models_registry.ModelDef.from_module(module)
    images = jnp.asarray(random_batch(8)["image"], jnp.float64)
    assert_micro_batches_match_one_call(model_def, as_float64(params), lambda m, x: m(x), images)


def test_models_that_split_their_rows():
  # Built abstractly: only the modules' structure is under test.
  module = nnx.eval_shape(lambda: tiny_two_towers()[0].module)
  assert micro_batches.supports(module)
  assert not micro_batches.supports(nnx.eval_shape(lambda: nnx.Linear(2, 2, rngs=nnx.Rngs(0))))
  assert module.micro_batches == 1  # a built model runs every call whole


@pytest.mark.slow  # a memory figure of two compiles; the gradients' identity is in the push tier
def test_accumulation_lowers_compiled_temp_memory():
  """XLA's buffer assignment on this CPU (nothing runs): the loop over
  micro-batches keeps one micro-batch's activations, so the step's temp
  memory falls with the count (tiny MERU, batch 16: 2.6 MB whole, 0.8 MB
  in 4 micro-batches when written)."""
  model_def, params = tiny_two_towers()
  objective = meru_lib.MeruObjective({"name": "meru"})
  mesh = sharding.make_mesh(1)
  batch = random_batch(16)
  temp = {}
  for count in (1, 4):
    sharded = step_lib.make_sharded_loss(model_def, objective, mesh, accumulation_steps=count)
    loss = lambda params, batch: sharded(params, {}, batch, jax.random.key(0))[0]
    compiled = jax.jit(jax.value_and_grad(loss)).lower(params, batch).compile()
    temp[count] = compiled.memory_analysis().temp_size_in_bytes
  print(f"[accumulation] compiled temp bytes by micro-batch count: {temp}")
  assert temp[4] < temp[1]
