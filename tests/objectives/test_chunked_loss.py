"""Chunked contrastive loss == materialised loss (value, gradients, metrics).

Runs the objectives' real `loss` under the project's shard_mapped loss on 8
CPU devices, in float64, so the only difference between the two paths is the
summation order of the log-sum-exp: agreement to 1e-10 relative is then a
test of the streaming log-sum-exp and of its hand-written VJP. The towers are
linear maps of given features (the loss, not the towers, is under test).
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from model_refs import fast_compile_jit

from hyperbolic_vl.objectives import chunked
from hyperbolic_vl.objectives import clip as clip_lib
from hyperbolic_vl.objectives import meru as meru_lib
from hyperbolic_vl.training import sharding
from hyperbolic_vl.training import step as step_lib

DEVICES, LOCAL_ROWS, IMAGE_FEATURES, TEXT_FEATURES, EMBED = 8, 6, 7, 5, 4


class LinearTowers:
  """Duck-typed stand-in for TwoTowers with float64 linear towers."""

  def __init__(self, params, geometry):
    self.params, self.geometry = params, geometry

  def encode_image(self, image):
    return image @ self.params["image"]

  def encode_text(self, tokens):
    return tokens @ self.params["text"]

  def logit_scale(self):
    return jnp.exp(self.params["log_logit_scale"])

  def curv(self):
    return jnp.exp(self.params["log_curv"])

  def alpha(self, which):
    del which
    return jnp.asarray(1.0)


@dataclasses.dataclass
class LinearModelDef:
  geometry: str

  def merge(self, params):
    return LinearTowers(params, self.geometry)


def _params_and_batch(geometry="lorentz", seed=0):
  rng = np.random.default_rng(seed)
  global_batch = DEVICES * LOCAL_ROWS
  params = {
    "image": rng.normal(size=(IMAGE_FEATURES, EMBED)) * 0.6,
    "text": rng.normal(size=(TEXT_FEATURES, EMBED)) * 0.6,
    "log_logit_scale": np.log(10.0),
    "log_curv": np.log(0.7),
  }
  if geometry != "lorentz":
    del params["log_curv"]
  batch = {
    "image": rng.normal(size=(global_batch, IMAGE_FEATURES)),
    "tokens": rng.normal(size=(global_batch, TEXT_FEATURES)),
  }
  # Duplicate pairs: equal logits in a row, and equal columns in two blocks.
  batch["image"][1] = batch["image"][0]
  batch["tokens"][1] = batch["tokens"][0]
  return jax.tree.map(jnp.asarray, params), jax.tree.map(jnp.asarray, batch)


def _loss_grads_metrics(objective, geometry, params, batch):
  mesh = sharding.make_mesh(DEVICES)
  sharded = step_lib.make_sharded_loss(LinearModelDef(geometry), objective, mesh)
  # Fast test-only compile options (tests/fixtures/model_refs.py) on both
  # paths: values change by float64 rounding, far inside 1e-10.
  fn = fast_compile_jit(jax.value_and_grad(sharded, has_aux=True))
  (loss, (metrics, _)), grads = fn(params, {}, batch, jax.random.key(0))
  return float(loss), jax.device_get(grads), jax.device_get(metrics)


def _relative(a, b):
  return float(np.max(np.abs(np.asarray(a) - np.asarray(b))) / np.max(np.abs(np.asarray(b))))


_MATERIALISED = {}


# 5 leaves a ragged last block (48 = 9 * 5 + 3); 16 divides the global batch;
# 64 is one block wider than the batch.
@pytest.mark.parametrize("chunk", [5, 16, 64])
@pytest.mark.parametrize(
  "objective_cls, geometry",
  [(clip_lib.ClipObjective, "euclidean"), (meru_lib.MeruObjective, "lorentz")],
  ids=["clip", "meru"],
)
def test_chunked_equals_materialised_on_8_devices(objective_cls, geometry, chunk):
  with jax.enable_x64(True):
    params, batch = _params_and_batch(geometry)
    name = objective_cls.name
    # The materialised loss is the same for every chunk size: compiled and
    # run once per objective.
    if name not in _MATERIALISED:
      _MATERIALISED[name] = _loss_grads_metrics(
        objective_cls({"name": name}), geometry, params, batch
      )
    plain = _MATERIALISED[name]
    chunked_run = _loss_grads_metrics(
      objective_cls({"name": name, "logit_chunk_size": chunk}), geometry, params, batch
    )
  loss0, grads0, metrics0 = plain
  loss1, grads1, metrics1 = chunked_run
  assert np.isfinite(loss0) and loss0 > 0
  assert abs(loss1 - loss0) / abs(loss0) <= 1e-10
  for key in grads0:
    assert np.max(np.abs(grads0[key])) > 0, key  # every parameter gets a gradient
    assert _relative(grads1[key], grads0[key]) <= 1e-10, key
  for key in metrics0:
    np.testing.assert_allclose(metrics1[key], metrics0[key], rtol=1e-10, atol=0)


def test_chunked_logsumexp_matches_dense_with_param_gradients():
  """The helper alone, one device: value and VJP against jax.nn.logsumexp."""
  with jax.enable_x64(True):
    rng = np.random.default_rng(1)
    rows, columns = rng.normal(size=(3, 4)), rng.normal(size=(11, 4))
    weights = rng.normal(size=3)
    logits_fn = lambda r, c, s: s * jnp.tanh(r @ c.T)

    def dense(r, c, s):
      return jnp.sum(weights * jax.nn.logsumexp(logits_fn(r, c, s), axis=1))

    def blocked(r, c, s):
      return jnp.sum(weights * chunked.chunked_logsumexp(logits_fn, 4, r, c, s))

    # Both sides as one jitted computation (eagerly, each op of the forward
    # and backward passes is its own compile).
    both = fast_compile_jit(
      lambda *args: [jax.value_and_grad(f, argnums=(0, 1, 2))(*args) for f in (dense, blocked)]
    )
    (expected, expected_grads), (value, grads) = both(rows, columns, np.float64(3.0))
  np.testing.assert_allclose(value, expected, rtol=1e-12)
  for g, e in zip(grads, expected_grads):
    np.testing.assert_allclose(g, e, rtol=1e-11, atol=1e-14)


def test_negative_chunk_size_is_refused():
  objective = clip_lib.ClipObjective({"name": "clip", "logit_chunk_size": -1})
  params, batch = _params_and_batch("euclidean")
  with pytest.raises(ValueError, match="logit_chunk_size"):
    objective.loss(LinearTowers(params, "euclidean"), {}, batch, rng=None, axis_name=None)
