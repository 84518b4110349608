"""Gradient clipping: off by default (no paper or released code clips), on as an option."""

import importlib

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from hyperbolic_vl import optimizer

CONFIGS = ("clip", "meru", "atmg", "hmid", "hcl", "radial")


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
