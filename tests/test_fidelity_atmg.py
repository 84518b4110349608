"""ATMG as released: the averaged two-direction angle loss, the released
inference rules and curvature setting, each against a float64 NumPy reference."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from tiny_fixtures import (
  assert_one_device_equals_n_devices_float64,
  np_ce,
  np_time,
  random_batch,
  tiny_two_towers,
)

from configs import atmg as atmg_config
from hyperbolic_vl.models import two_towers
from hyperbolic_vl.objectives import atmg as atmg_lib


def np_ext(x, y, c):
  """Exterior angle at x_i towards y_j (MERU/ATMG eq. 9), float64, all pairs."""
  inner = c * (x @ y.T - np_time(x, c)[:, None] * np_time(y, c)[None, :])
  num = np_time(y, c)[None, :] + np_time(x, c)[:, None] * inner
  den = np.linalg.norm(x, axis=-1)[:, None] * np.sqrt(np.maximum(inner**2 - 1, 1e-300))
  return np.arccos(np.clip(num / den, -1, 1))


def tiny_model(dtype="float32"):
  model_def, params = tiny_two_towers(0, dtype=dtype)
  # Spread the embeddings away from the origin so angles are well defined.
  kind = params["log_alpha_img"].dtype
  params["log_alpha_img"] = jnp.asarray(np.log(0.6), kind)
  params["log_alpha_txt"] = jnp.asarray(np.log(0.3), kind)
  return model_def, params


def embeddings(model, batch):
  image = np.asarray(model.encode_image(batch["image"]), np.float64)
  text = np.asarray(model.encode_text(batch["tokens"]), np.float64)
  return image, text


def test_released_loss_matches_float64_reference():
  with jax.enable_x64(True):
    model_def, params = tiny_model("float64")
    model = model_def.merge(jax.tree.map(lambda x: jnp.asarray(x, jnp.float64), params))
    batch = random_batch(8)
    batch["image"] = jnp.asarray(batch["image"], jnp.float64)
    objective = atmg_lib.AtmgObjective({"name": "atmg"})  # all defaults
    loss, (metrics, _) = objective.loss(model, {}, batch, rng=None, axis_name=None)
    image, text = embeddings(model, batch)
    c, s = float(model.curv()), float(model.logit_scale())
  # Text rows: softmax over images of -s * angle at the text; image rows:
  # softmax over texts of +s * angle at the image; averaged; centroid off.
  ce_text = np_ce(-s * np_ext(text, image, c))
  ce_image = np_ce(s * np_ext(image, text, c))
  np.testing.assert_allclose(float(metrics["loss/angle_alpha"]), ce_text, rtol=1e-10)
  np.testing.assert_allclose(float(metrics["loss/angle_beta"]), ce_image, rtol=1e-10)
  np.testing.assert_allclose(float(loss), 0.5 * (ce_text + ce_image), rtol=1e-10)


def test_released_loss_one_device_equals_eight():
  def build():
    model_def, params = tiny_model("float64")
    return model_def, params, atmg_lib.AtmgObjective({"name": "atmg"}), random_batch(16), None

  assert_one_device_equals_n_devices_float64(build, label="atmg released")


@pytest.mark.parametrize("rule", ["released", "paper"])
def test_inference_rules_match_float64_reference(rule):
  model_def, params = tiny_model()
  model = model_def.merge(params)
  objective = atmg_lib.AtmgObjective({"name": "atmg", "inference": rule})
  batch = random_batch(8)
  image = model.encode_image(batch["image"])
  text = model.encode_text(batch["tokens"])
  classes = objective.class_embedding(
    model, model.text_tangent(batch["tokens"][:6]).reshape(3, 2, -1)
  )
  c = float(model.curv())
  x64, y64 = np.asarray(text, np.float64), np.asarray(image, np.float64)
  p64 = np.asarray(classes, np.float64).reshape(6, -1)
  at_text = np_ext(x64, y64, c).T  # (N images, M texts)
  at_image = np_ext(y64, x64, c)
  zs_at_text = np_ext(p64, y64, c).T.reshape(-1, 3, 2).mean(-1)
  zs_at_image = np_ext(y64, p64, c).reshape(-1, 3, 2).mean(-1)
  zero_shot = np.asarray(objective.score(model, image, classes))
  i2t = np.asarray(objective.score(model, image, text))
  t2i = np.asarray(objective.score_text_to_image(model, image, text))
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
