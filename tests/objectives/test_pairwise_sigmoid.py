"""SigLIP's pairwise sigmoid loss for CLIP and MERU: a float64 NumPy reference,
gathered == ring == one device (loss, gradients, metrics), and the checks
that keep the learned bias exactly where the sigmoid loss is on."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from tiny_fixtures import (
  as_float64,
  leafwise_relative_differences,
  loss_and_grads,
  np_dist,
  random_batch,
)
from tiny_fixtures import tiny_two_towers as tiny_model

from hyperbolic_vl import errors
from hyperbolic_vl.objectives import base as objectives_base
from hyperbolic_vl.objectives import clip as clip_lib
from hyperbolic_vl.objectives import meru as meru_lib
from hyperbolic_vl.objectives import pairwise_sigmoid
from hyperbolic_vl.training import sharding
from hyperbolic_vl.training import step as step_lib

# SigLIP's initialisation: t = 10, b = -10.
SIGLIP_SCALE, SIGLIP_BIAS = 10.0, -10.0
# See tiny_fixtures.IDENTITY_RTOL: float64 sums reordered across devices (and
# the ring visits the columns in another order than the gather lays them out).
IDENTITY_RTOL = 1e-10


def np_sigmoid_loss(logits):
  """(1 / n) sum_ij -log sigmoid(y_ij z_ij), y = +1 on the diagonal, -1 elsewhere
  (SigLIP's eq. 1), with log sigmoid written as -log(1 + exp(-x))."""
  labels = 2 * np.eye(len(logits)) - 1
  return np.sum(np.log1p(np.exp(-labels * logits))) / len(logits)


def np_unit(x):
  return x / np.linalg.norm(x, axis=-1, keepdims=True)


def np_entailment(text, image, c):
  """MERU's entailment (eq. 10-12) from the law of cosines, as test_meru_clip."""
  from test_meru_clip import np_exterior_angle  # noqa: PLC0415

  aperture = np.arcsin(np.minimum(2 * 0.1 / (np.sqrt(c) * np.linalg.norm(text, axis=-1)), 1))
  return np.maximum(np_exterior_angle(text, image, c) - aperture, 0).mean()


def _objective(geometry, columns="gathered", chunk_size=0):
  config = {
    "name": "",
    "pairwise_loss": "sigmoid",
    "sigmoid_columns": columns,
    "logit_chunk_size": chunk_size,
  }
  if geometry == "lorentz":
    return meru_lib.MeruObjective({**config, "name": "meru", "entail_weight": 0.2})
  return clip_lib.ClipObjective({**config, "name": "clip"})


def _sigmoid_model(geometry, **kwargs):
  return tiny_model(
    geometry=geometry, logit_scale_init=SIGLIP_SCALE, logit_bias_init=SIGLIP_BIAS, **kwargs
  )


@pytest.mark.parametrize("chunk_size", [0, 4, 6, 9])
@pytest.mark.parametrize("columns", ["gathered", "ring"])
def test_helper_matches_numpy_on_one_device(columns, chunk_size):
  """The loss and its gradients against eq. 1 written out in NumPy: column
  blocks of 4 leave a ragged last block of 6 columns; 6 is one block; 9 wider."""
  rng = np.random.default_rng(0)
  image, text = rng.normal(size=(2, 6, 5))
  scale, bias = 2.0, -1.5
  with jax.enable_x64(True):
    logits_fn = lambda r, c, p: p[0] * r @ c.T + p[1]

    def loss(image, text, bias):
      return pairwise_sigmoid.sigmoid_contrastive(
        logits_fn,
        (jnp.asarray(scale), bias),
        image,
        text,
        None,
        columns=columns,
        chunk_size=chunk_size,
      )

    # One jitted computation per setting (run op by op, ~150 executables).
    value, grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))(
      image, text, jnp.asarray(bias)
    )
  logits = scale * image @ text.T + bias
  np.testing.assert_allclose(float(value), np_sigmoid_loss(logits), rtol=1e-13)
  # d/dz of -log sigmoid(y z) is -y sigmoid(-y z); chain through z = s I T^T + b.
  labels = 2 * np.eye(6) - 1
  d_logits = -labels / (1 + np.exp(labels * logits)) / len(logits)
  np.testing.assert_allclose(grads[0], scale * d_logits @ text, rtol=1e-12)
  np.testing.assert_allclose(grads[1], scale * d_logits.T @ image, rtol=1e-12)
  np.testing.assert_allclose(float(grads[2]), d_logits.sum(), rtol=1e-12)


@pytest.mark.parametrize("geometry", ["euclidean", "lorentz"])
def test_objective_matches_float64_reference(geometry):
  """The objectives' sigmoid loss on the tiny model's embeddings against
  NumPy: CLIP t cos + b; MERU -s d_L + b plus 0.2 x entailment."""
  with jax.enable_x64(True):
    model_def, params = _sigmoid_model(geometry, dtype="float64")
    if geometry == "lorentz":
      params["log_alpha_img"] = jnp.asarray(np.log(0.6))
      params["log_alpha_txt"] = jnp.asarray(np.log(0.3))
    params["logit_bias"] = jnp.asarray(-3.0)  # off its init, so b is really read
    batch = as_float64(random_batch(8))
    objective = _objective(geometry)

    def embeddings_and_loss(params, batch):
      model = model_def.merge(params)
      embeddings = (model.encode_image(batch["image"]), model.encode_text(batch["tokens"]))
      return embeddings, objective.loss(model, {}, batch, rng=None, axis_name=None)

    # One jitted computation (run op by op, the towers and loss compiled ~220 executables).
    (image, text), (loss, (metrics, _)) = jax.device_get(
      jax.jit(embeddings_and_loss)(params, batch)
    )
    image, text = np.asarray(image), np.asarray(text)
  if geometry == "lorentz":
    c = float(np.exp(params["log_curv"]))
    expected = np_sigmoid_loss(-SIGLIP_SCALE * np_dist(image, text, c) - 3.0)
    entail = np_entailment(text, image, c)
    assert entail > 0  # the entailment term is exercised
    expected += 0.2 * entail
  else:
    expected = np_sigmoid_loss(SIGLIP_SCALE * np_unit(image) @ np_unit(text).T - 3.0)
  np.testing.assert_allclose(float(loss), expected, rtol=1e-12)
  assert float(metrics["logit_bias"]) == -3.0


def _run(geometry, columns, num_devices, fsdp=1, chunk_size=0):
  model_def, params = _sigmoid_model(geometry, dtype="float64")
  if geometry == "lorentz":
    params["log_alpha_img"] = jnp.asarray(np.log(0.6))
  batch = as_float64(random_batch(16))
  objective = _objective(geometry, columns, chunk_size)
  return loss_and_grads(model_def, params, objective, batch, num_devices, fsdp=fsdp)


def _worst(a, b):
  """Worst relative difference over loss, gradients and metrics."""
  parts = [abs(a[0] - b[0]) / abs(b[0])]
  for index in (1, 2):
    parts += leafwise_relative_differences(a[index], b[index]).values()
  return max(parts)


# (columns, chunk size) of the 8-device runs: 16 gathered columns in blocks of
# 3 leave a ragged last block; each device's 2 ring columns in blocks of 1.
EIGHT_DEVICE_RUNS = {
  "euclidean": [("gathered", 0), ("ring", 0)],
  "lorentz": [("gathered", 0), ("ring", 0), ("gathered", 3), ("ring", 1)],
}


# The ring passes the same columns for either geometry: the Lorentz case
# (its logits are checked against NumPy in the push tier) is in the slow tier.
@pytest.mark.parametrize("geometry", ["euclidean", pytest.param("lorentz", marks=pytest.mark.slow)])
def test_ring_equals_gathered_equals_one_device(geometry):
  with jax.enable_x64(True):
    one = _run(geometry, "gathered", 1)
    for columns, chunk_size in EIGHT_DEVICE_RUNS[geometry]:
      eight = _run(geometry, columns, 8, chunk_size=chunk_size)
      worst = _worst(eight, one)
      print(f"{geometry} 8 devices {columns} chunk {chunk_size} vs 1 device: {worst:.2e}")
      assert worst <= IDENTITY_RTOL, (columns, chunk_size)
  grads = one[1]
  # Every learned scalar the logits read gets a gradient, the bias included.
  assert abs(float(grads["logit_bias"])) > 0
  assert abs(float(grads["log_logit_scale"])) > 0
  assert float(np.abs(grads["text_proj"]["kernel"]).max()) > 0


@pytest.mark.slow
def test_ring_over_the_data_and_fsdp_axes():
  """Under fsdp the objective's axis name is ("data", "fsdp"): the ring runs
  over both axes' devices in their linear order."""
  with jax.enable_x64(True):
    one = _run("lorentz", "gathered", 1)
    ring = _run("lorentz", "ring", 8, fsdp=2)
  assert _worst(ring, one) <= IDENTITY_RTOL


def test_ring_sends_blocks_not_the_batch(monkeypatch):
  """The ring scores (b, b) blocks: no logits wider than the local batch."""
  shapes = []
  original = pairwise_sigmoid.negatives_sum

  def recording(logits_fn, params, rows, columns, chunk_size=0):
    shapes.append(columns.shape)
    return original(logits_fn, params, rows, columns, chunk_size)

  monkeypatch.setattr(pairwise_sigmoid, "negatives_sum", recording)
  model_def, params = _sigmoid_model("euclidean")
  # The shapes are the trace's: the 8-device step's value and gradient are
  # traced (jax.eval_shape), not compiled or run.
  loss_fn = step_lib.make_sharded_loss(
    model_def,
    _objective("euclidean", "ring"),
    sharding.make_mesh(8),
    objectives_base.EMPTY_CONTEXT,
    fsdp_min_elements=0,
  )
  jax.eval_shape(
    jax.value_and_grad(loss_fn, has_aux=True), params, {}, random_batch(16), jax.random.key(0)
  )
  assert shapes and all(shape[0] == 2 for shape in shapes)


def test_bias_param_only_with_the_sigmoid_loss():
  _, plain = tiny_model(geometry="lorentz")
  _, with_bias = _sigmoid_model("lorentz")
  assert "logit_bias" not in plain
  assert float(with_bias["logit_bias"]) == SIGLIP_BIAS
  assert set(with_bias) - set(plain) == {"logit_bias"}


def test_bad_settings_are_one_line_config_errors():
  sigmoid = _objective("lorentz")
  with pytest.raises(errors.ConfigError, match="model.logit_bias_init"):
    sigmoid.check_model_config({"geometry": "lorentz"})
  softmax = meru_lib.MeruObjective({"name": "meru"})
  with pytest.raises(errors.ConfigError, match="only the sigmoid loss"):
    softmax.check_model_config({"geometry": "lorentz", "logit_bias_init": -10.0})
  with pytest.raises(errors.ConfigError, match="sigmoid_columns"):
    clip_lib.ClipObjective({"name": "clip", "sigmoid_columns": "allreduce"})
  with pytest.raises(errors.ConfigError, match="pairwise_loss"):
    clip_lib.ClipObjective({"name": "clip", "pairwise_loss": "hinge"})
