"""The optimizer: decay mask, schedule, and clipping off by default (no paper or released code clips).

Clipping: Gradient clipping: off by default (no paper or released code clips), on as an option."""

import importlib

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest
from tiny_fixtures import tiny_two_towers as tiny_model

from hyperbolic_vl import optimizer

CONFIGS = ("clip", "meru", "atmg", "hmid", "hcl", "radial")


def test_weight_decay_mask_excludes_scalars_biases_and_gains():
  model_def, params = tiny_model(geometry="lorentz")
  mask = optimizer.weight_decay_mask(params, decay_gains_biases=False)
  assert mask["image_proj"]["kernel"] is True
  assert mask["log_curv"] is False and mask["log_logit_scale"] is False
  flat = {optimizer.path_str(p): v for p, v in jax.tree_util.tree_flatten_with_path(mask)[0]}
  assert not any(v for k, v in flat.items() if k.endswith("bias") or k.endswith("scale"))
  mask_all = optimizer.weight_decay_mask(params, decay_gains_biases=True)
  flat_all = {
    optimizer.path_str(p): v for p, v in jax.tree_util.tree_flatten_with_path(mask_all)[0]
  }
  assert all(v for k, v in flat_all.items() if not k.split("/")[-1].startswith("log_"))


def test_schedule_warmup_then_cosine_to_zero():
  optim = ml_collections.ConfigDict(dict(lr=1e-3, warmup_steps=10))
  schedule = optimizer.learning_rate_schedule(optim, 110)
  np.testing.assert_allclose(schedule(0), 0.0)
  np.testing.assert_allclose(schedule(5), 5e-4, rtol=1e-6)
  np.testing.assert_allclose(schedule(10), 1e-3, rtol=1e-6)
  np.testing.assert_allclose(schedule(60), 5e-4, rtol=1e-5)  # half-way down the cosine
  np.testing.assert_allclose(schedule(110), 0.0, atol=1e-12)


def _adam_first_moment(optim_config, grad_value):
  """Adam's first moment after one update with a constant gradient."""
  params = {"w": jnp.zeros((3, 2), jnp.float32)}
  tx, _ = optimizer.make_optimizer(optim_config, 10, params, lambda path: True)
  grads = {"w": jnp.full((3, 2), grad_value, jnp.float32)}
  _, state = tx.update(grads, tx.init(params), params)
  is_adam = lambda x: isinstance(x, optax.ScaleByAdamState)
  moments = [s.mu["w"] for s in jax.tree.leaves(state, is_leaf=is_adam) if is_adam(s)]
  assert len(moments) == 1
  return np.asarray(moments[0], np.float64)


@pytest.mark.parametrize("name", CONFIGS)
def test_every_config_leaves_clipping_off(name):
  config = importlib.import_module(f"configs.{name}").get_config()
  assert config.optim.grad_clip_norm == 0.0


def test_default_passes_a_huge_gradient_unclipped():
  config = importlib.import_module("configs.clip").get_config()
  # Unclipped: mu = (1 - b1) g exactly (float32 rounding only, rtol 1e-6).
  mu = _adam_first_moment(config.optim, 1e6)
  np.testing.assert_allclose(mu, (1 - config.optim.b1) * 1e6, rtol=1e-6)


def test_clip_option_scales_to_the_global_norm():
  config = importlib.import_module("configs.clip").get_config()
  config.optim.grad_clip_norm = 1.0
  mu = _adam_first_moment(config.optim, 1e6)
  # Global norm of 6 entries of 1e6 is 1e6 sqrt(6): clipped entries 1/sqrt(6).
  np.testing.assert_allclose(mu, (1 - config.optim.b1) / np.sqrt(6.0), rtol=1e-6)
