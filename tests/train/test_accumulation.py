"""`optim.accumulation_steps`: the towers run each device's rows in K
micro-batches while the contrastive loss still sees the whole global batch,
so loss, gradients and the parameters after a few steps equal K = 1's
(float64, 8 devices); values a run cannot use are refused in one line
before anything is written."""

import os

import jax
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from tiny_fixtures import (
  IDENTITY_RTOL,
  as_float64,
  leafwise_relative_differences,
  random_batch,
  tiny_two_towers,
)
from tiny_runs import small_config

from hyperbolic_vl import errors
from hyperbolic_vl import objectives as objectives_lib
from hyperbolic_vl.data import registry as data_registry
from hyperbolic_vl.data import tokenizer as tokenizer_lib
from hyperbolic_vl.models import registry as models_registry
from hyperbolic_vl.objectives import clip as clip_lib
from hyperbolic_vl.objectives import meru as meru_lib
from hyperbolic_vl.training import loop, setup, sharding, step_builder
from hyperbolic_vl.training import step as step_lib

NUM_DEVICES = 8
# 8 rows per device: 4 micro-batches of 2.
GLOBAL_BATCH = 64
STEPS = 4

OBJECTIVES = {
  "meru": ("lorentz", lambda: meru_lib.MeruObjective({"name": "meru"})),
  "clip": ("euclidean", lambda: clip_lib.ClipObjective({"name": "clip"})),
}


def sharded_loss_and_grads(model_def, params, objective, batch, accumulation_steps):
  mesh = sharding.make_mesh(NUM_DEVICES)
  sharded = step_lib.make_sharded_loss(
    model_def, objective, mesh, accumulation_steps=accumulation_steps
  )
  fn = jax.jit(jax.value_and_grad(sharded, has_aux=True))
  (loss, (metrics, _)), grads = fn(params, {}, batch, jax.random.key(0))
  return jax.device_get((loss, metrics, grads))


# Accumulation is the objective's loss over micro-batches whatever its
# geometry. The push tier has MERU's through the train step below (params
# after two steps); the loss, metrics and gradients of MERU's and CLIP's
# sharded loss repeat that path: slow tier.
@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(OBJECTIVES))
def test_accumulated_gradients_equal_the_whole_batch_float64(name):
  """The same tolerance as 1 vs 8 devices (tiny_fixtures.IDENTITY_RTOL):
  only the order of the parameter-gradient sums changes."""
  geometry, make_objective = OBJECTIVES[name]
  with jax.enable_x64(True):
    model_def, params = tiny_two_towers(geometry=geometry, dtype="float64")
    params, batch = as_float64(params), as_float64(random_batch(GLOBAL_BATCH))
    whole = sharded_loss_and_grads(model_def, params, make_objective(), batch, 1)
    split = sharded_loss_and_grads(model_def, params, make_objective(), batch, STEPS)
  parts = {
    part: max(leafwise_relative_differences(split[index], whole[index]).values())
    for part, index in (("loss", 0), ("metrics", 1), ("grads", 2))
  }
  print(f"[{name}, accumulation {STEPS} vs 1, 8 devices, float64] {parts}")
  assert max(parts.values()) <= IDENTITY_RTOL, parts


LEARNING_RATE = 0.1


def sgd(optim_config, total_steps, params, trainable):
  """Plain SGD: an update linear in the gradient. Adam divides each gradient
  component by its own root mean square, so a component that is zero by
  symmetry (the key bias's gradient: softmax ignores a shift shared by all
  keys) moves by +-lr on rounding noise alone, on 1 device as on 8."""
  del optim_config, total_steps, params, trainable
  return optax.sgd(LEARNING_RATE), lambda step: LEARNING_RATE


def two_steps(config):
  """(state before, state after two SGD steps on two world batches)."""
  objective = objectives_lib.get(config.objective)
  tokenizer = tokenizer_lib.get_tokenizer(config.input.tokenizer)
  model_def, state, tx, schedule, context, _ = setup.init_state(
    config, objective, tokenizer, tx_factory=sgd
  )
  mesh = sharding.make_mesh(NUM_DEVICES)
  steps = step_builder.checked_accumulation_steps(config, model_def, NUM_DEVICES)
  step = jax.jit(
    step_lib.make_train_step(
      model_def,
      objective,
      tx,
      schedule,
      mesh,
      jax.random.key(0),
      context,
      accumulation_steps=steps,
    )
  )
  before = jax.device_get(state)
  state = jax.device_put(state, NamedSharding(mesh, P()))
  batches = data_registry.make_train_iterator(config.input, tokenizer, seed=config.seed)
  for _ in range(2):
    batch = jax.device_put(dict(next(batches)), NamedSharding(mesh, P(step_lib.DATA_AXIS)))
    state, _ = step(state, batch)
  return before, jax.device_get(state)


def test_train_step_with_accumulation_equals_whole_batch_float64():
  """Two MERU steps on the world's batches: the same params with 4
  micro-batches as without."""
  settings = {"model.dtype": "float64", "input.batch_size": GLOBAL_BATCH}
  with jax.enable_x64(True):
    before, whole = two_steps(small_config(**settings))
    _, split = two_steps(small_config(**settings, **{"optim.accumulation_steps": STEPS}))
  assert int(whole["step"]) == int(split["step"]) == 2
  assert int(split["first_nonfinite_step"]) == -1
  worst = max(leafwise_relative_differences(split["params"], whole["params"]).values())
  print(f"[MERU, 2 steps, accumulation {STEPS} vs 1, 8 devices, float64] params {worst:.1e}")
  assert worst <= IDENTITY_RTOL
  moved = max(
    float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
    for a, b in zip(jax.tree.leaves(whole["params"]), jax.tree.leaves(before["params"]))
  )
  assert moved > 1e-3  # the steps changed the params


def checked(config, num_devices=NUM_DEVICES):
  model_def, _ = models_registry.ModelDef.from_module(models_registry.abstract_model(config))
  return step_builder.checked_accumulation_steps(config, model_def, num_devices)


def test_accumulation_settings_a_run_cannot_use_are_one_line_errors():
  assert checked(small_config()) == 1
  assert checked(small_config(**{"optim.accumulation_steps": 2})) == 2  # 16 rows / 8 devices
  refusals = {
    # 16 rows over 8 devices: 2 per device.
    "must divide the per-device batch 2 \\(input.batch_size=16 over 8 devices\\)": small_config(
      **{"optim.accumulation_steps": 4}
    ),
    "must be an integer >= 1, got 0": small_config(**{"optim.accumulation_steps": 0}),
    "needs a model without batch norms: model.image_variant='RN-mu'": small_config(
      **{"optim.accumulation_steps": 2, "model.image_variant": "RN-mu"}
    ),
  }
  for message, config in refusals.items():
    with pytest.raises(errors.ConfigError, match=f"^optim.accumulation_steps.*{message}") as error:
      checked(config)
    assert "\n" not in str(error.value)


def test_a_model_without_micro_batches_is_refused():
  plain, _ = models_registry.ModelDef.from_module(nnx.Linear(2, 2, rngs=nnx.Rngs(0)))
  config = small_config(**{"optim.accumulation_steps": 2, "model.name": "my_model"})
  with pytest.raises(
    errors.ConfigError, match="model.name='my_model' does not run its towers in micro-batches"
  ):
    step_builder.checked_accumulation_steps(config, plain, NUM_DEVICES)


def test_a_refused_accumulation_leaves_no_workdir_behind(tmp_path):
  workdir = os.path.join(tmp_path, "run")
  config = small_config(**{"optim.accumulation_steps": 3})
  with pytest.raises(errors.ConfigError, match="accumulation_steps=3 must divide"):
    loop.train(config, workdir)
  assert not os.path.exists(os.path.join(workdir, "config.json"))
