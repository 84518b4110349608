"""ATMG: float64 reference of the angle + centroid loss, 1 == 8 devices,
angle-based inference, fixed curvature, paper-size config.

As released: ATMG as released: the averaged two-direction angle loss, the released
inference rules and curvature setting, each against a float64 NumPy reference."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from tiny_fixtures import (
  MESH_LAYOUTS,
  assert_one_device_equals_n_devices_float64,
  np_ce,
  np_time,
  random_batch,
  tiny_two_towers,
)

from configs import atmg as atmg_config
from hyperbolic_vl.models import registry as models_registry
from hyperbolic_vl.models import two_towers
from hyperbolic_vl.objectives import atmg as atmg_lib

CONFIG = {
  "name": "atmg",
  "centroid_weight": 0.3,
  "centroid_text_radius": 0.4,
  "centroid_image_radius": 1.1,
  # The paper's readings (loss eq. 11, inference by the angle at the text);
  # the released defaults are tested in test_fidelity_atmg.py.
  "angle_loss": "paper",
  "inference": "paper",
}


# Each test runs its model, loss and scores as ONE jitted computation: run
# eagerly, every jnp op of the towers and the loss on a new shape is its own
# XLA compile (a few hundred per test on CPU).
def forward(model_def, objective, *, scores=False):
  """jit of (params, batch) -> the embeddings, curvature, logit scale and
  loss + metrics; with `scores`, the zero-shot and retrieval scores of the
  first 6 token rows as 3 classes x 2 prompts instead of the loss."""

  def run(params, batch):
    model = model_def.merge(params)
    out = {
      "image": model.encode_image(batch["image"]),
      "text": model.encode_text(batch["tokens"]),
      "curv": model.curv(),
      "scale": model.logit_scale(),
    }
    if scores:
      tangents = model.text_tangent(batch["tokens"][:6]).reshape(3, 2, -1)
      out["classes"] = objective.class_embedding(model, tangents)
      out["zero_shot"] = objective.score(model, out["image"], out["classes"])
      out["i2t"] = objective.score(model, out["image"], out["text"])
      out["t2i"] = objective.score_text_to_image(model, out["image"], out["text"])
    else:
      out["loss"], (out["metrics"], _) = objective.loss(model, {}, batch, rng=None, axis_name=None)
    return out

  return jax.jit(run)


@functools.cache
def _paper_forward():
  """The paper-reading loss on the tiny model: shared by the tests using it."""
  model_def, params = tiny_model()
  return forward(model_def, atmg_lib.AtmgObjective(CONFIG)), params


def tiny_model(seed=0, **kwargs):
  model_def, params = tiny_two_towers(seed, **kwargs)
  if "log_alpha_img" in params:
    # Spread the embeddings away from the origin so angles are well defined.
    dtype = params["log_alpha_img"].dtype
    params["log_alpha_img"] = jnp.asarray(np.log(0.6), dtype)
    params["log_alpha_txt"] = jnp.asarray(np.log(0.3), dtype)
  return model_def, params


# --- float64 references from the papers' formulas -----------------------------
def np_ext(x, y, c):
  """MERU/ATMG eq. 9 for all pairs: exterior angle at x_i towards y_j."""
  inner = c * (x @ y.T - np_time(x, c)[:, None] * np_time(y, c)[None, :])
  num = np_time(y, c)[None, :] + np_time(x, c)[:, None] * inner
  den = np.linalg.norm(x, axis=-1)[:, None] * np.sqrt(np.maximum(inner**2 - 1, 1e-300))
  return np.arccos(np.clip(num / den, -1, 1))


def np_einstein_midpoint(x, c):
  """Eq. 5-6 with the paper's Klein map k = x_space / x_time, gamma = 1/sqrt(1 - c|k|^2)."""
  k = x / np_time(x, c)[:, None]
  gamma = 1 / np.sqrt(1 - c * np.sum(k * k, -1))
  mid_k = (gamma[:, None] * k).sum(0) / gamma.sum()
  # Back to the hyperboloid: space part k / sqrt(c (1 - c |k|^2)) * sqrt(c)... in
  # space-component form x = k x_time, x_time = 1/sqrt(c (1 - c|k|^2)).
  return mid_k / np.sqrt(c * (1 - c * np.sum(mid_k**2)))


def np_dist_origin(x, c):
  return np.arccosh(np.sqrt(c) * np_time(x, c)) / np.sqrt(c)


def np_atmg_loss(image, text, c, scale, cfg):
  alpha = np_ext(text, image, c)  # angle at the text
  beta = np_ext(image, text, c).T  # angle at the image
  angle = np_ce(-scale * alpha) + np_ce(scale * beta)
  text_d = np_dist_origin(np_einstein_midpoint(text, c)[None], c)[0]
  image_d = np_dist_origin(np_einstein_midpoint(image, c)[None], c)[0]
  centroid = abs(text_d - cfg["centroid_text_radius"]) + abs(image_d - cfg["centroid_image_radius"])
  return angle + cfg["centroid_weight"] * centroid, centroid


def test_atmg_loss_matches_float64_reference():
  run, params = _paper_forward()
  out = run(params, random_batch(8))
  image = np.asarray(out["image"], np.float64)
  text = np.asarray(out["text"], np.float64)
  expected, centroid = np_atmg_loss(image, text, float(out["curv"]), float(out["scale"]), CONFIG)
  np.testing.assert_allclose(float(out["metrics"]["loss/centroid"]), centroid, rtol=1e-5)
  np.testing.assert_allclose(float(out["loss"]), expected, rtol=1e-5)


def test_second_term_is_not_the_first_term_again():
  # beta = pi - alpha would make the two CE terms identical; ours differ.
  run, params = _paper_forward()
  metrics = run(params, random_batch(8))["metrics"]
  assert abs(float(metrics["loss/angle_alpha"]) - float(metrics["loss/angle_beta"])) > 1e-3


# The paper's reading: its 1-vs-8 identity repeats the released default's
# gathered path (test_released_loss_one_device_equals_eight): slow tier.
@pytest.mark.slow
@pytest.mark.parametrize("fsdp", MESH_LAYOUTS)
def test_one_device_equals_eight_devices(fsdp):
  def build():
    model_def, params = tiny_model(dtype="float64")
    objective = atmg_lib.AtmgObjective(CONFIG)
    return model_def, params, objective, random_batch(16), None

  grads1 = assert_one_device_equals_n_devices_float64(build, label="atmg", fsdp=fsdp)
  assert float(np.abs(grads1["image_proj"]["kernel"]).max()) > 0
  assert np.isfinite(float(grads1["log_curv"])) and float(abs(grads1["log_curv"])) > 0


def test_score_ranks_by_smallest_mean_exterior_angle():
  model_def, params = tiny_model()
  objective = atmg_lib.AtmgObjective(CONFIG)
  # 3 classes x 2 prompts from the first 6 token rows.
  out = forward(model_def, objective, scores=True)(params, random_batch(8))
  image, classes = np.asarray(out["image"], np.float64), out["classes"]
  assert classes.shape == (3, 2, 16)
  scores = np.asarray(out["zero_shot"])
  c = float(out["curv"])
  per_prompt = (
    np_ext(np.asarray(classes, np.float64).reshape(6, -1), image, c).reshape(3, 2, -1).mean(1).T
  )
  np.testing.assert_allclose(scores, -per_prompt, rtol=1e-4, atol=1e-5)
  np.testing.assert_array_equal(scores.argmax(1), per_prompt.argmin(1))
  # Retrieval: (N, M) = -alpha(text_j, image_i).
  np.testing.assert_allclose(
    np.asarray(out["i2t"]),
    -np_ext(np.asarray(out["text"], np.float64), image, c).T,
    rtol=1e-4,
    atol=1e-5,
  )


def test_fixed_curvature_is_not_a_parameter():
  model_def, params = tiny_model(learn_curv=False, curv_init=2.0)
  assert "log_curv" not in params
  model = model_def.merge(params)
  assert float(model.curv()) == 2.0
  objective = atmg_lib.AtmgObjective(CONFIG)
  batch = random_batch(8)
  grads = jax.jit(
    jax.grad(lambda p: objective.loss(model_def.merge(p), {}, batch, rng=None, axis_name=None)[0])
  )(params)
  assert all(np.isfinite(np.asarray(g)).all() for g in jax.tree.leaves(grads))


def test_config_paper_variant_builds_abstractly():
  config = atmg_config.get_config("vit_s")
  assert config.objective.name == "atmg"
  assert config.objective.centroid_image_radius > config.objective.centroid_text_radius
  model = models_registry.abstract_model(config)
  params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
  assert all(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree.leaves(params))


def spread_tiny_model(dtype="float32"):
  model_def, params = tiny_two_towers(0, dtype=dtype)
  # Spread the embeddings away from the origin so angles are well defined.
  kind = params["log_alpha_img"].dtype
  params["log_alpha_img"] = jnp.asarray(np.log(0.6), kind)
  params["log_alpha_txt"] = jnp.asarray(np.log(0.3), kind)
  return model_def, params


def test_released_loss_matches_float64_reference():
  with jax.enable_x64(True):
    model_def, params = spread_tiny_model("float64")
    params = jax.tree.map(lambda x: np.asarray(x, np.float64), params)  # NumPy: no compile
    batch = random_batch(8)
    batch["image"] = batch["image"].astype(np.float64)
    objective = atmg_lib.AtmgObjective({"name": "atmg"})  # all defaults
    out = forward(model_def, objective)(params, batch)
    metrics = out["metrics"]
    image = np.asarray(out["image"], np.float64)
    text = np.asarray(out["text"], np.float64)
    c, s = float(out["curv"]), float(out["scale"])
  # Text rows: softmax over images of -s * angle at the text; image rows:
  # softmax over texts of +s * angle at the image; averaged; centroid off.
  ce_text = np_ce(-s * np_ext(text, image, c))
  ce_image = np_ce(s * np_ext(image, text, c))
  np.testing.assert_allclose(float(metrics["loss/angle_alpha"]), ce_text, rtol=1e-10)
  np.testing.assert_allclose(float(metrics["loss/angle_beta"]), ce_image, rtol=1e-10)
  np.testing.assert_allclose(float(out["loss"]), 0.5 * (ce_text + ce_image), rtol=1e-10)


@pytest.mark.parametrize("fsdp", MESH_LAYOUTS)
def test_released_loss_one_device_equals_eight(fsdp):
  def build():
    model_def, params = spread_tiny_model("float64")
    return model_def, params, atmg_lib.AtmgObjective({"name": "atmg"}), random_batch(16), None

  assert_one_device_equals_n_devices_float64(build, label="atmg released", fsdp=fsdp)


@pytest.mark.parametrize("rule", ["released", "paper"])
def test_inference_rules_match_float64_reference(rule):
  model_def, params = spread_tiny_model()
  objective = atmg_lib.AtmgObjective({"name": "atmg", "inference": rule})
  out = forward(model_def, objective, scores=True)(params, random_batch(8))
  c = float(out["curv"])
  x64, y64 = np.asarray(out["text"], np.float64), np.asarray(out["image"], np.float64)
  p64 = np.asarray(out["classes"], np.float64).reshape(6, -1)
  at_text = np_ext(x64, y64, c).T  # (N images, M texts)
  at_image = np_ext(y64, x64, c)
  zs_at_text = np_ext(p64, y64, c).T.reshape(-1, 3, 2).mean(-1)
  zs_at_image = np_ext(y64, p64, c).reshape(-1, 3, 2).mean(-1)
  zero_shot, i2t, t2i = (np.asarray(out[key]) for key in ("zero_shot", "i2t", "t2i"))
  # float32 embeddings, angles through arccos: 1e-4 relative / 1e-5 absolute.
  tol = dict(rtol=1e-4, atol=1e-5)
  if rule == "released":
    np.testing.assert_allclose(zero_shot, zs_at_image, **tol)  # largest mean angle at image
    np.testing.assert_allclose(i2t, -at_text, **tol)
    np.testing.assert_allclose(t2i, at_image, **tol)  # largest angle at the image
  else:
    np.testing.assert_allclose(zero_shot, -zs_at_text, **tol)
    np.testing.assert_allclose(i2t, -at_text, **tol)
    np.testing.assert_allclose(t2i, -at_text, **tol)


def test_released_curvature_and_unknown_options():
  config = atmg_config.get_config()
  assert config.model.curv_init == 0.1 and not config.model.learn_curv
  assert config.model.curv_clamp_factor == 5.0
  assert config.objective.centroid_weight == 0.0
  assert (config.objective.angle_loss, config.objective.inference) == ("released", "released")
  # A learned curvature is clamped to [c0 / 5, 5 c0].
  model_def, params = tiny_two_towers(0, curv_init=0.1, curv_clamp_factor=5.0)
  params["log_curv"] = jnp.asarray(np.log(10.0), jnp.float32)
  clamped = two_towers.project_learned_scalars(params, model_def.merge(params))
  np.testing.assert_allclose(float(jnp.exp(clamped["log_curv"])), 0.5, rtol=1e-6)
  with pytest.raises(ValueError, match="objective.inference"):
    atmg_lib.inference_scores(jnp.ones((1, 2)), jnp.ones((1, 2)), 1.0, "nearest")
  with pytest.raises(ValueError, match="objective.angle_loss"):
    atmg_lib.AtmgObjective({"name": "atmg", "angle_loss": "x"}).loss(
      model_def.merge(params), {}, random_batch(4), rng=None, axis_name=None
    )
