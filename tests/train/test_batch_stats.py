"""Batch norms in the trainer: `state["batch_stats"]` (models with a ResNet
tower only), synchronised statistics (a step on 1 device equals one on 8,
float64, params and running statistics), the statistics saved with every
checkpoint and restored exactly on resume and by `hyperbolic_vl.load`."""

import os

import jax
import numpy as np
import optax
import pytest
from model_refs import fast_compile_jit
from tiny_fixtures import IDENTITY_RTOL, leafwise_relative_differences
from tiny_runs import small_config

from configs import hcl as hcl_config
from hyperbolic_vl import inference
from hyperbolic_vl import objectives as objectives_lib
from hyperbolic_vl.data import registry as data_registry
from hyperbolic_vl.data import tokenizer as tokenizer_lib
from hyperbolic_vl.runs import checkpointing
from hyperbolic_vl.training import loop, setup, sharding
from hyperbolic_vl.training import step as step_lib

LEARNING_RATE = 0.1
STATE_KEYS = {"step", "params", "opt_state", "aux", "first_nonfinite_step"}


def sgd(optim_config, total_steps, params, trainable):
  """Plain SGD: the first step moves every parameter (warmup would not)."""
  del optim_config, total_steps, params, trainable
  return optax.sgd(LEARNING_RATE), lambda step: LEARNING_RATE


def meru_config():
  return small_config(**{"model.image_variant": "RN-mu", "model.dtype": "float64"})


def hcl_tiny_config():
  config = hcl_config.get_config()
  with config.unlocked():
    config.model.image_variant = "RN-mu"
    config.model.dtype = "float64"
    config.input.image_size = 16
    config.input.batch_size = 16
    config.objective.queue_size = 64
  return config


class NoText:
  vocab_size = 1
  context_length = 1


def steps_on_1_and_8_devices(config, tokenizer, layouts=((1, 1), (8, 1))):
  """({layout: (state, metrics)} after one SGD step from the same initial
  state and batch, and that initial state); a layout is (devices, fsdp),
  and 1 stands for (1, 1), 8 for (8, 1)."""
  objective = objectives_lib.get(config.objective)
  model_def, state, tx, schedule, context, _ = setup.init_state(
    config, objective, tokenizer, tx_factory=sgd
  )
  batch = dict(next(data_registry.make_train_iterator(config.input, tokenizer, seed=config.seed)))
  before = jax.device_get(state)
  out = {}
  for num_devices, fsdp in layouts:
    mesh = sharding.make_mesh(num_devices, fsdp)
    # Compiled with the fast test-only options (tests/fixtures/model_refs.py):
    # the same values to float64 rounding, far inside IDENTITY_RTOL.
    step = fast_compile_jit(
      step_lib.make_train_step(
        model_def, objective, tx, schedule, mesh, jax.random.key(0), context, fsdp_min_elements=0
      )
    )
    new_state, metrics = step(
      jax.device_put(before, sharding.state_shardings(before, mesh, 0)),
      jax.device_put(batch, sharding.batch_sharding(mesh)),
    )
    key = num_devices if fsdp == 1 else (num_devices, fsdp)
    out[key] = jax.device_get((new_state, metrics))
  return out, before


# HCL's batch norms are the same synchronised layers: slow tier.
@pytest.mark.parametrize("name", ["meru", pytest.param("hcl", marks=pytest.mark.slow)])
def test_one_device_equals_eight_with_batch_norms(name):
  """Synchronised batch norms: the global batch's statistics on any number
  of devices, so the step (loss, params, HCL's momentum encoder and queues)
  and the running statistics it leaves are those of one device. HCL's key
  encoder normalises with its own batch statistics too (MoCo's key encoder
  runs in training mode); its running statistics are not kept. HCL also
  runs on 8 devices with sharded params (mesh.fsdp=2): the statistics and
  the momentum encoder come from the params gathered inside the step."""
  layouts = ((1, 1), (8, 1)) + (((8, 2),) if name == "hcl" else ())
  with jax.enable_x64(True):
    if name == "meru":
      config = meru_config()
      tokenizer = tokenizer_lib.get_tokenizer(config.input.tokenizer)
    else:
      config, tokenizer = hcl_tiny_config(), NoText()
    steps, before = steps_on_1_and_8_devices(config, tokenizer, layouts)
  one, one_metrics = steps[1]
  assert set(one) == STATE_KEYS | {"batch_stats"}
  for layout in [key for key in steps if key != 1]:
    many, many_metrics = steps[layout]
    parts = {
      key: max(leafwise_relative_differences(many[key], one[key]).values(), default=0.0)
      for key in ("params", "batch_stats", "aux")
    }
    parts["metrics"] = max(leafwise_relative_differences(many_metrics, one_metrics).values())
    print(f"[{name} RN-mu, 1 vs {layout} devices, float64] worst relative differences {parts}")
    assert max(parts.values()) <= IDENTITY_RTOL, parts
  # Not two copies of the initial state: the step moved the statistics and params.
  moved = lambda a, b: max(
    float(np.max(np.abs(np.asarray(x) - np.asarray(y))))
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b))
  )
  assert moved(one["batch_stats"], before["batch_stats"]) > 1e-3
  assert moved(one["params"], before["params"]) > 1e-3


def test_running_statistics_are_checkpointed_and_restored_exactly(tmp_path):
  """The statistics are saved with each checkpoint and come back bit for bit
  where a resumed run reads its state (`checkpointing.find_resumable`, what
  the trainer calls), where a run started with `init_from` reads another's
  params, and where `hyperbolic_vl.load` reads a run's weights.
  (A resumed run equals an uninterrupted one given its restored state:
  tests/train/test_train.py shows that for any state layout.)"""
  workdir = str(tmp_path / "run")
  config = small_config(**{"model.image_variant": "RN-mu", "total_steps": 2, "ckpt_steps": 2})
  result = loop.train(config, workdir)
  stats = jax.device_get(result.state["batch_stats"])
  init = result.model_def.initial_batch_stats()
  assert any(
    not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(init), jax.tree.leaves(stats))
  )

  # The fresh state's shapes, traced (a concrete init would compile each initialiser).
  abstract = jax.eval_shape(lambda: setup.init_state(config, result.objective, result.tokenizer)[1])
  resumable = checkpointing.find_resumable(os.path.join(workdir, "checkpoints"), abstract)
  assert resumable.step == 2
  for key in ("batch_stats", "params"):
    restored, kept = resumable.state[key], jax.device_get(result.state[key])
    assert jax.tree.structure(restored) == jax.tree.structure(kept)
    for a, b in zip(jax.tree.leaves(restored), jax.tree.leaves(kept)):
      np.testing.assert_array_equal(np.asarray(a), b)

  # A run started from this one (init_from) starts from its statistics too.
  config_from = small_config(**{"model.image_variant": "RN-mu", "init_from": workdir})
  _, started, *_ = setup.init_state(config_from, result.objective, result.tokenizer)
  for a, b in zip(jax.tree.leaves(started["batch_stats"]), jax.tree.leaves(stats)):
    np.testing.assert_array_equal(np.asarray(a), b)

  # Inference from the workdir embeds with the saved running statistics,
  # exactly as the run's own predictor does.
  images = np.random.default_rng(0).uniform(size=(8, 16, 16, 3)).astype(np.float32)
  loaded = inference.load(workdir)
  np.testing.assert_array_equal(
    loaded.encode_images(images), result.predictor().encode_images(images)
  )


def test_models_without_batch_norms_keep_their_state_layout():
  config = small_config()  # a ViT tower
  objective = objectives_lib.get(config.objective)
  tokenizer = tokenizer_lib.get_tokenizer(config.input.tokenizer)
  # Traced, not run: the layout is what is under test (a concrete init
  # would compile each initialiser). The model definition leaves the trace
  # only for its static facts.
  built = {}

  def init_state():
    built["model_def"], state, *_ = setup.init_state(config, objective, tokenizer)
    return state

  state = jax.eval_shape(init_state)
  model_def = built["model_def"]
  assert set(state) == STATE_KEYS
  assert not model_def.has_batch_stats and model_def.initial_batch_stats() == {}
