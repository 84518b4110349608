"""EuCLIP: the loss against a float64 NumPy reference written from the
paper's definition (negative squared / plain Euclidean distance of the
unnormalised embeddings as the logit), and 1 device == 8 devices."""

import numpy as np
import pytest
from tiny_fixtures import (
  assert_one_device_equals_n_devices_float64,
  np_ce,
  random_batch,
)
from tiny_fixtures import tiny_two_towers as tiny_model

from hyperbolic_vl import errors
from hyperbolic_vl.objectives import euclip as euclip_lib


def np_euclip_loss(image, text, scale, logit):
  """(CE(-s D(I, T)) + CE(-s D(T, I))) / 2 with D from explicit differences."""
  diff = image[:, None, :] - text[None, :, :]
  squared = np.sum(diff * diff, -1)
  distance = squared if logit == "squared_distance" else np.sqrt(squared)
  return 0.5 * (np_ce(-scale * distance) + np_ce(-scale * distance.T))


def test_euclip_loss_matches_float64_reference():
  import jax

  objectives = {
    logit: euclip_lib.EuclipObjective({"name": "euclip", "logit": logit})
    for logit in euclip_lib.LOGITS
  }

  def losses_and_embeddings(params, batch):
    model = model_def.merge(params)
    losses = {
      logit: objective.loss(model, {}, batch, rng=None, axis_name=None)
      for logit, objective in objectives.items()
    }
    embeddings = (model.encode_image(batch["image"]), model.encode_text(batch["tokens"]))
    return losses, embeddings, model.logit_scale()

  with jax.enable_x64(True):
    model_def, params = tiny_model(geometry="euclidean", dtype="float64")
    batch = random_batch(8)
    # One compiled program: run eagerly, each of the towers' ops compiles alone.
    losses, (image, text), scale = jax.device_get(jax.jit(losses_and_embeddings)(params, batch))
  for logit, (loss, (metrics, _)) in losses.items():
    expected = np_euclip_loss(image, text, float(scale), logit)
    # Both in float64 from the same embeddings: only the expanded form
    # |x|^2 + |y|^2 - 2 x.y against explicit differences separates them.
    np.testing.assert_allclose(float(loss), expected, rtol=1e-10, err_msg=logit)
    np.testing.assert_allclose(
      float(metrics["mean_dist_origin/text"]), np.linalg.norm(text, axis=-1).mean(), rtol=1e-12
    )
  # The embeddings are not normalised: the reference would differ if they were.
  assert abs(np.linalg.norm(image, axis=-1).mean() - 1) > 0.1


def test_euclip_score_ranks_by_the_logit():
  objective = euclip_lib.EuclipObjective({"name": "euclip"})
  image = np.array([[0.0, 0.0], [3.0, 0.0]], np.float32)
  text = np.array([[0.0, 1.0], [2.0, 0.0], [0.0, -3.0]], np.float32)
  # Hand-computed squared distances: row 0 -> 1, 4, 9; row 1 -> 10, 1, 18.
  np.testing.assert_allclose(
    np.asarray(objective.score(None, image, text)), -np.array([[1, 4, 9], [10, 1, 18]]), rtol=1e-6
  )


def test_euclip_refuses_an_unknown_logit():
  with pytest.raises(errors.ConfigError, match="objective.logit='cosine'"):
    euclip_lib.EuclipObjective({"name": "euclip", "logit": "cosine"})


@pytest.mark.parametrize(
  "logit", ["squared_distance", pytest.param("distance", marks=pytest.mark.slow)]
)
def test_one_device_equals_eight_devices(logit):
  def build():
    model_def, params = tiny_model(geometry="euclidean", dtype="float64")
    objective = euclip_lib.EuclipObjective({"name": "euclip", "logit": logit})
    return model_def, params, objective, random_batch(16), None

  grads = assert_one_device_equals_n_devices_float64(build, label=f"euclip {logit}")
  assert float(np.abs(grads["image_proj"]["kernel"]).max()) > 0
  assert float(np.abs(grads["log_logit_scale"])) > 0
