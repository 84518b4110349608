"""The sharded step: float64 references and 1-device == 8-device equality."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from tiny_fixtures import (
  MESH_LAYOUTS,
  assert_one_device_equals_n_devices_float64,
  loss_and_grads,
  np_ce,
  np_dist,
  random_batch,
)
from tiny_fixtures import tiny_two_towers as tiny_model

from hyperbolic_vl.models import two_towers
from hyperbolic_vl.objectives import base
from hyperbolic_vl.objectives import clip as clip_lib
from hyperbolic_vl.objectives import meru as meru_lib
from hyperbolic_vl.training import sharding
from hyperbolic_vl.training import step as step_lib


# ---------------------------------------------------------------------------
# float64 references written from the papers' formulas, independent of the
# geometry module (the exterior angle via MERU's eq. 17, law of cosines).
# ---------------------------------------------------------------------------
def np_exterior_angle(x, y, c):
  g = lambda d: np.cosh(d * np.sqrt(c))
  origin = np.zeros_like(x)
  d_oy = np.diag(np_dist(origin, y, c))
  d_ox = np.diag(np_dist(origin, x, c))
  d_xy = np.diag(np_dist(x, y, c))
  cos = (g(d_oy) - g(d_xy) * g(d_ox)) / (np.sqrt(g(d_xy) ** 2 - 1) * np.sqrt(g(d_ox) ** 2 - 1))
  return np.arccos(np.clip(cos, -1, 1))


def np_meru_loss(image, text, c, scale, weight):
  contrastive = 0.5 * (
    np_ce(-scale * np_dist(image, text, c)) + np_ce(-scale * np_dist(text, image, c))
  )
  aperture = np.arcsin(np.minimum(2 * 0.1 / (np.sqrt(c) * np.linalg.norm(text, axis=-1)), 1))
  entail = np.maximum(np_exterior_angle(text, image, c) - aperture, 0).mean()
  return contrastive + weight * entail


def np_clip_loss(image, text, scale):
  i = image / np.linalg.norm(image, axis=-1, keepdims=True)
  t = text / np.linalg.norm(text, axis=-1, keepdims=True)
  return 0.5 * (np_ce(scale * i @ t.T) + np_ce(scale * t @ i.T))


def embeddings_and_loss(model_def, params, objective, batch):
  """(image, text embeddings as float64 NumPy, loss, metrics, curvature,
  logit scale) of the model and objective as one jitted computation (run op
  by op, the towers and the loss compiled ~280 executables)."""

  def run(params, batch):
    model = model_def.merge(params)
    loss, (metrics, _) = objective.loss(model, {}, batch, rng=None, axis_name=None)
    embeddings = (model.encode_image(batch["image"]), model.encode_text(batch["tokens"]))
    curv = model.curv() if model_def.module.geometry == "lorentz" else jnp.zeros(())
    return embeddings, loss, metrics, curv, model.logit_scale()

  (image, text), loss, metrics, curv, scale = jax.device_get(jax.jit(run)(params, batch))
  return np.asarray(image, np.float64), np.asarray(text, np.float64), loss, metrics, curv, scale


def test_meru_loss_matches_float64_reference():
  model_def, params = tiny_model(geometry="lorentz")
  # Spread the embeddings so entailment is active for some pairs.
  params["log_alpha_img"] = jnp.asarray(np.log(0.6), jnp.float32)
  params["log_alpha_txt"] = jnp.asarray(np.log(0.3), jnp.float32)
  batch = random_batch(8)
  objective = meru_lib.MeruObjective({"name": "meru", "entail_weight": 0.2})
  image, text, loss, metrics, c, scale = embeddings_and_loss(model_def, params, objective, batch)
  expected = np_meru_loss(image, text, float(c), float(scale), 0.2)
  assert float(metrics["loss/entailment"]) > 0  # the entailment branch is exercised
  np.testing.assert_allclose(float(loss), expected, rtol=1e-5)


def test_clip_loss_matches_float64_reference():
  model_def, params = tiny_model(geometry="euclidean")
  batch = random_batch(8)
  objective = clip_lib.ClipObjective({"name": "clip"})
  image, text, loss, _, _, scale = embeddings_and_loss(model_def, params, objective, batch)
  np.testing.assert_allclose(float(loss), np_clip_loss(image, text, float(scale)), rtol=1e-5)


@pytest.mark.parametrize(
  "geometry,objective",
  [
    ("lorentz", meru_lib.MeruObjective({"name": "meru", "entail_weight": 0.2})),
    ("euclidean", clip_lib.ClipObjective({"name": "clip"})),
  ],
)
@pytest.mark.parametrize("fsdp", MESH_LAYOUTS)
def test_one_device_equals_eight_devices(geometry, objective, fsdp):
  def build():
    model_def, params = tiny_model(geometry=geometry, dtype="float64")
    if geometry == "lorentz":
      params["log_alpha_img"] = jnp.asarray(np.log(0.6))
    return model_def, params, objective, random_batch(16), None

  grads1 = assert_one_device_equals_n_devices_float64(build, label=objective.name, fsdp=fsdp)
  # The gradient is not trivially zero anywhere important.
  assert float(np.abs(grads1["image_proj"]["kernel"]).max()) > 0
  assert float(np.abs(grads1["log_logit_scale"])) > 0


# The same sharded loss as the float64 identity above (MERU, 1 vs 8 devices),
# in float32: a repeat of that path at a looser bound, slow tier.
@pytest.mark.slow
def test_one_device_equals_eight_devices_float32_smoke():
  """The production dtype: the same identity up to float32 reduction order.

  Bound: a reordered float32 sum of n terms moves by <= ~n * 2^-24 * sum|terms|.
  The loss (16 rows of O(1) terms) gets rtol 1e-5; a gradient leaf can be a
  sum of cancelling terms (log_curv moved 1.5e-5 relative to itself on one
  CPU), so leaves are judged against 1e-4 of the largest gradient in the tree
  (the scale of the summands), not against their own magnitude.
  """
  model_def, params = tiny_model(geometry="lorentz")
  params["log_alpha_img"] = jnp.asarray(np.log(0.6), jnp.float32)
  objective = meru_lib.MeruObjective({"name": "meru", "entail_weight": 0.2})
  batch = random_batch(16)
  loss1, grads1, _, _ = loss_and_grads(model_def, params, objective, batch, 1)
  loss8, grads8, _, _ = loss_and_grads(model_def, params, objective, batch, 8)
  assert abs(loss8 - loss1) <= 1e-5 * abs(loss1)
  scale = max(float(np.max(np.abs(g))) for g in jax.tree.leaves(grads1))
  for g8, g1 in zip(jax.tree.leaves(grads8), jax.tree.leaves(grads1)):
    np.testing.assert_allclose(g8, g1, rtol=0, atol=1e-4 * scale)


def test_per_device_logits_are_local_by_global(monkeypatch):
  """The shapes are the trace's: the 8-device step's value and gradient are
  traced (jax.eval_shape), not compiled or run."""
  shapes = []
  original = base.symmetric_contrastive

  def recording(logits_i2t, logits_t2i, axis_name):
    shapes.append((logits_i2t.shape, logits_t2i.shape))
    return original(logits_i2t, logits_t2i, axis_name)

  monkeypatch.setattr(base, "symmetric_contrastive", recording)
  model_def, params = tiny_model(geometry="lorentz")
  objective = meru_lib.MeruObjective({"name": "meru"})
  loss_fn = step_lib.make_sharded_loss(
    model_def, objective, sharding.make_mesh(8), base.EMPTY_CONTEXT, fsdp_min_elements=0
  )
  jax.eval_shape(
    jax.value_and_grad(loss_fn, has_aux=True), params, {}, random_batch(16), jax.random.key(0)
  )
  assert shapes and all(s == ((2, 16), (2, 16)) for s in shapes)


def test_local_targets_offset_by_device_index():
  mesh = sharding.make_mesh(8)
  per_device = jax.shard_map(
    lambda x: base.local_targets(2, "data")[None] + 0 * x,
    mesh=mesh,
    in_specs=jax.sharding.PartitionSpec("data"),
    out_specs=jax.sharding.PartitionSpec("data"),
  )
  # One jitted computation (run eagerly, its input and ops compiled 13 executables).
  targets = jax.jit(lambda: per_device(jnp.zeros((8, 2), jnp.int32)))()
  np.testing.assert_array_equal(np.asarray(targets).reshape(-1), np.arange(16))


def test_learned_scalar_projection_is_outside_the_gradient():
  model_def, params = tiny_model(geometry="lorentz")
  params["log_logit_scale"] = jnp.asarray(10.0, jnp.float32)  # beyond log(100)
  params["log_curv"] = jnp.asarray(5.0, jnp.float32)  # beyond log(10)
  params["log_alpha_txt"] = jnp.asarray(0.5, jnp.float32)  # alpha > 1
  projected = two_towers.project_learned_scalars(params, model_def.module)
  np.testing.assert_allclose(projected["log_logit_scale"], np.log(100.0), rtol=1e-6)
  np.testing.assert_allclose(projected["log_curv"], np.log(10.0), rtol=1e-6)
  np.testing.assert_allclose(projected["log_alpha_txt"], 0.0)
  # The loss itself does not clip: the logit-scale gradient is non-zero even
  # beyond the clamp (MERU's clamp-then-forward semantics). The trainer's
  # 1-device loss on the float32 smoke test's shapes and objective: loaded
  # from the session's cache when that test ran first, not compiled again.
  objective = meru_lib.MeruObjective({"name": "meru", "entail_weight": 0.2})
  _, grad, _, _ = loss_and_grads(model_def, params, objective, random_batch(16), 1)
  assert float(abs(grad["log_logit_scale"])) > 0
