"""UNCHA's loss: every logged term and its gradients against a float64 NumPy
port of the released `UNCHA.forward` (uncha/models.py), the release's
per-GPU means reproduced by `box_reduction="per_device"` on two simulated
ranks with unequal box counts, and 1 device == 8 devices."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from tiny_fixtures import (
  GivenEmbeddings,
  assert_one_device_equals_n_devices_float64,
  np_dist,
  np_half_aperture,
  np_oxy_angle,
  random_batch,
)
from tiny_fixtures import tiny_two_towers as tiny_model

from hyperbolic_vl.objectives import uncha as uncha_lib


# ---------------------------------------------------------------------------
# The released forward in float64 NumPy, one rank at a time, written from its
# code: valid boxes flattened in (example, slot) order, every rank's rows as
# columns, targets offset by the valid boxes of earlier ranks. `eps` is the
# release's clamp constant (uncha/lorentz.py, 1e-8); eps=0 is the formula.
# uncha/lorentz.py is meru/lorentz.py: tiny_fixtures' Lorentz functions,
# given `eps` at every call.
# Stop-gradients read the `frozen` copy of the inputs, so that a finite
# difference of the port, perturbing only `live`, is the release's gradient.
# ---------------------------------------------------------------------------
def np_ce(logits, targets):
  shifted = logits - logits.max(1, keepdims=True)
  log_probs = shifted - np.log(np.exp(shifted).sum(1, keepdims=True))
  return -np.mean(log_probs[np.arange(len(targets)), targets])


def np_softplus(x):
  return np.log1p(np.exp(x))


def np_residual(angle, aperture, tau, factor=0.1):
  value = angle - tau * aperture
  return np.where(value > 0, value + factor * angle, factor * angle)


def np_calibration(residual, frozen_residual, log_u, alpha=10.0):
  u = np.clip(np.exp(log_u), 1e-6, 1e6)
  term = 0.5 * frozen_residual / (u + 1e-6) + 0.5 * log_u
  prob = np.exp(log_u - log_u.max())
  prob /= prob.sum()
  entropy = -(prob * np.log(prob + 1e-8)).sum()
  return (0.5 * residual).mean(), (alpha * (term + entropy)).mean()


def np_uncha_rank(live, frozen, rank, rows, eps=0.0):
  """{logged term: value} of rank `rank` holding rows [rank rows, (rank+1) rows)
  of the global arrays. live/frozen: dicts image, text (B, D), box_image,
  box_text (B, N, D), mask (B, N), c, and (live only) s_g, s_l, s_gl."""
  num_slots, dim = live["mask"].shape[1], live["image"].shape[1]
  here = slice(rank * rows, (rank + 1) * rows)

  def views(arrays):
    valid = arrays["mask"][here].reshape(-1)
    all_valid = arrays["mask"].reshape(-1)
    flat = lambda key, part: arrays[key][part].reshape(-1, dim)
    return {
      "c": arrays["c"],
      "I": arrays["image"][here],
      "T": arrays["text"][here],
      "I_all": arrays["image"],
      "T_all": arrays["text"],
      "Ib": flat("box_image", here)[valid],
      "Tb": flat("box_text", here)[valid],
      "Ib_all": flat("box_image", slice(None))[all_valid],
      "Tb_all": flat("box_text", slice(None))[all_valid],
      "I_par": np.repeat(arrays["image"][here], num_slots, 0)[valid],
      "T_par": np.repeat(arrays["text"][here], num_slots, 0)[valid],
      "I_par_all": np.repeat(arrays["image"], num_slots, 0)[all_valid],
      "T_par_all": np.repeat(arrays["text"], num_slots, 0)[all_valid],
      "offset": int(all_valid[: rows * num_slots * rank].sum()),
    }

  v, f = views(live), views(frozen)
  c = v["c"]
  dist = lambda x, y: np_dist(x, y, c, eps)
  num_boxes = len(v["Ib"])
  targets = np.arange(num_boxes) + v["offset"]
  whole_targets = np.arange(rows) + rows * rank
  w_box = np.clip(np.exp(-0.5 * np_softplus(-np.linalg.norm(f["Ib"], axis=-1))), 0.1, 10.0)
  w_txt = np.clip(np.exp(-0.5 * np_softplus(-np.linalg.norm(f["Tb"], axis=-1))), 0.1, 10.0)
  s_g, s_l, s_gl = live["s_g"], live["s_l"], live["s_gl"]
  out = {
    "loss/contrastive/global": 0.5
    * (
      np_ce(s_g * -dist(v["I"], v["T_all"]), whole_targets)
      + np_ce(s_g * -dist(v["T"], v["I_all"]), whole_targets)
    ),
    "loss/contrastive/local": 0.5
    * (
      np_ce(s_l * -dist(v["Ib"], v["Tb_all"]), targets)
      + np_ce(s_l * -dist(v["Tb"], v["Ib_all"]), targets)
    ),
    "loss/contrastive/global_local": 0.5
    * (
      np_ce(s_gl * (w_box[:, None] * -dist(v["Ib"], v["T_par_all"])), targets)
      + np_ce(s_gl * (w_txt[:, None] * -dist(v["Tb"], v["I_par_all"])), targets)
    ),
  }

  def residual(views_, x, y, tau):
    angle = np_oxy_angle(views_[x], views_[y], views_["c"], eps)
    return np_residual(angle, np_half_aperture(views_[x], views_["c"], eps), tau)

  out["loss/entailment/text_image"] = 0.5 * residual(v, "T", "I", 0.7).mean()
  out["loss/entailment/box_text_box_image"] = 0.5 * residual(v, "Tb", "Ib", 0.7).mean()
  for label, box, par in (("box_image_image", "Ib", "I_par"), ("box_text_text", "Tb", "T_par")):
    log_u = np_softplus(-np.linalg.norm(v[box], axis=-1))
    mean_loss, calibration = np_calibration(
      residual(v, box, par, 1.2), residual(f, box, par, 1.2), log_u
    )
    out[f"loss/entailment/{label}"] = mean_loss
    out[f"loss/calibration/{label}"] = calibration
  out["loss/contrastive"] = sum(
    out[f"loss/contrastive/{k}"] for k in ("global", "local", "global_local")
  )
  out["loss/entailment"] = (
    out["loss/entailment/text_image"]
    + out["loss/entailment/box_text_box_image"]
    + 0.5 * (out["loss/entailment/box_image_image"] + out["loss/entailment/box_text_text"])
    + out["loss/calibration/box_image_image"]
    + out["loss/calibration/box_text_text"]
  )
  out["loss"] = out["loss/contrastive"] + 0.2 * out["loss/entailment"]
  return out


def np_release_average(live, frozen, num_ranks, eps=0.0):
  """DDP's loss: the mean over ranks of each rank's loss (and logged terms)."""
  rows = live["image"].shape[0] // num_ranks
  per_rank = [np_uncha_rank(live, frozen, r, rows, eps) for r in range(num_ranks)]
  return {key: np.mean([terms[key] for terms in per_rank]) for key in per_rank[0]}


# -- the objective on given embeddings -----------------------------------------
class _GivenEmbeddings(GivenEmbeddings):
  """Given embeddings with UNCHA's three logit scales (global, local and
  global-local)."""

  def __init__(self, curv, s_g, s_l, s_gl):
    super().__init__(curv, s_g)
    self._scales = {"global": s_g, "local": s_l, "global_local": s_gl}

  def extra_logit_scale(self, name):
    return jnp.asarray(self._scales[name])


SCALES = dict(s_g=9.0, s_l=12.0, s_gl=7.0)
CURV = 1.3
# Two ranks of three images, five slots each, with 1, 3, 5 and 0, 2, 4 valid
# boxes: unequal box counts per rank (9 and 6), one image without a box.
MASK_COUNTS = (1, 3, 5, 0, 2, 4)


def random_inputs(seed=0, dim=6, counts=MASK_COUNTS, slots=5):
  """Boxes and phrases nearer the origin than images and captions, with
  random directions, norms in [0.3, 1.9] (the half aperture's arc-sine away
  from 1), so that every residual has pairs inside and outside its cone."""
  rng = np.random.default_rng(seed)
  rows = len(counts)

  def draw(shape, radius):
    direction = rng.normal(size=(*shape, dim))
    direction /= np.linalg.norm(direction, axis=-1, keepdims=True)
    return direction * radius * rng.uniform(0.8, 1.2, size=(*shape, 1))

  return {
    "image": draw((rows,), 1.6),
    "text": draw((rows,), 1.2),
    "box_image": draw((rows, slots), 0.9),
    "box_text": draw((rows, slots), 0.5),
    "mask": np.arange(slots)[None, :] < np.asarray(counts)[:, None],
    "c": CURV,
    **SCALES,
  }


def as_batch(inputs):
  return {
    "image": inputs["image"],
    "tokens": inputs["text"],
    "box_image": inputs["box_image"],
    "box_tokens": inputs["box_text"],
    "box_mask": inputs["mask"],
  }


SCALARS = ("c", "s_g", "s_l", "s_gl")


@functools.cache
def loss_terms_and_grads(settings_items):
  """The objective on given embeddings as one jitted computation: (loss,
  metrics) and the gradients in the float inputs and the four scalars. One
  compile per setting serves the value and the gradient tests (run op by
  op, the loss and its gradient compiled ~400 executables)."""
  objective = uncha_lib.UnchaObjective({"name": "uncha", **dict(settings_items)})

  def total(floats, mask, c, s_g, s_l, s_gl):
    model = _GivenEmbeddings(c, s_g, s_l, s_gl)
    batch = {**floats, "box_mask": mask}
    loss, (metrics, _) = objective.loss(model, {}, batch, rng=None, axis_name=None)
    return loss, metrics

  return jax.jit(jax.value_and_grad(total, argnums=(0, 2, 3, 4, 5), has_aux=True))


def run_objective(settings, inputs):
  """((loss, metrics), gradients) of loss_terms_and_grads in float64 NumPy."""
  with jax.enable_x64(True):
    batch = as_batch(inputs)
    floats = {k: jnp.asarray(v) for k, v in batch.items() if k != "box_mask"}
    scalars = [jnp.asarray(inputs[k], jnp.float64) for k in SCALARS]
    result = loss_terms_and_grads(tuple(sorted(settings.items())))(
      floats, jnp.asarray(batch["box_mask"]), *scalars
    )
    return jax.device_get(result)


def objective_terms(settings, inputs):
  (loss, metrics), _ = run_objective(settings, inputs)
  got = {key: float(value) for key, value in metrics.items()}
  got["loss"] = float(loss)
  return got


def test_global_reading_equals_the_release_on_one_rank_holding_the_whole_batch():
  inputs = random_inputs()
  got = objective_terms({}, inputs)
  expected = np_uncha_rank(inputs, inputs, 0, len(MASK_COUNTS))
  for key, value in expected.items():
    np.testing.assert_allclose(got[key], value, rtol=1e-10, err_msg=key)
  # The release's clamps (eps 1e-8 in the arc-cosine, arc-sine and their
  # denominators) move each term by at most ~1e-8 / (|x| sqrt(c^2 <x,y>^2 - 1)),
  # < 1e-6 of it at these points: the same loss to that tolerance.
  with_clamps = np_uncha_rank(inputs, inputs, 0, len(MASK_COUNTS), eps=1e-8)
  np.testing.assert_allclose(got["loss"], with_clamps["loss"], rtol=1e-6)
  # Every residual has an active hinge (not only the 0.1 floor) and the
  # entropy runs over the 15 valid boxes.
  for key in expected:
    if key.startswith("loss/entailment/"):
      assert got[key] > 0.05 * np.pi, key
  np.testing.assert_allclose(got["uncertainty_entropy/box_image_image"], np.log(15), rtol=0.05)
  np.testing.assert_allclose(got["valid_boxes_per_image"], 15 / 6)


def test_per_device_reading_equals_the_release_averaged_over_two_ranks():
  inputs = random_inputs(seed=1)
  got = objective_terms({"box_reduction": "per_device", "rows_per_device": 3}, inputs)
  expected = np_release_average(inputs, inputs, num_ranks=2)
  for key, value in expected.items():
    np.testing.assert_allclose(got[key], value, rtol=1e-10, err_msg=key)
  # The two readings differ: the ranks hold 9 and 6 boxes.
  global_reading = objective_terms({}, inputs)
  assert abs(global_reading["loss/contrastive/local"] - got["loss/contrastive/local"]) > 1e-3


def _reference_gradients(inputs, loss_of_live, step=1e-5):
  """Central differences of the port's loss in every live input (frozen fixed)."""
  grads = {}
  for key in ("image", "text", "box_image", "box_text", "c", "s_g", "s_l", "s_gl"):
    value = np.asarray(inputs[key], np.float64)
    grad = np.zeros_like(value)
    for index in np.ndindex(value.shape):
      shifted = {}
      for sign in (1, -1):
        moved = value.copy()
        moved[index] += sign * step
        shifted[sign] = loss_of_live({**inputs, key: moved if moved.shape else float(moved)})
      grad[index] = (shifted[1] - shifted[-1]) / (2 * step)
    grads[key] = grad
  return grads


@pytest.mark.parametrize(
  "settings, num_ranks",
  [({}, 1), ({"box_reduction": "per_device", "rows_per_device": 3}, 2)],
  ids=["global", "per_device"],
)
def test_gradients_equal_the_release_in_float64(settings, num_ranks):
  """Every input's gradient (embeddings, curvature, the three scales)
  against central differences of the port, whose stop-gradients read the
  unperturbed inputs: the calibration's residual and the row weights pass
  no gradient, the uncertainty l in the calibration does."""
  inputs = random_inputs(seed=2)
  _, (floats, *scalars) = run_objective(settings, inputs)
  got = {
    "image": floats["image"],
    "text": floats["tokens"],
    "box_image": floats["box_image"],
    "box_text": floats["box_tokens"],
    **dict(zip(SCALARS, scalars)),
  }
  reference = _reference_gradients(
    inputs, lambda live: np_release_average(live, inputs, num_ranks)["loss"]
  )
  scale = max(float(np.abs(g).max()) for g in reference.values())
  for key, value in reference.items():
    # Central differences with step 1e-5 on a loss of size ~30: truncation
    # ~1e-10 x the third derivative, rounding ~1e-16 x 30 / 1e-5 = 3e-10.
    np.testing.assert_allclose(
      np.asarray(got[key]), value, rtol=1e-6, atol=1e-7 * scale, err_msg=key
    )
  # Padded slots get no gradient; the calibration's l does (through the
  # box norms), which the port's frozen residual alone would not explain.
  assert not np.asarray(got["box_image"])[~inputs["mask"]].any()
  assert float(np.abs(got["s_gl"])) > 0 and float(np.abs(got["c"])) > 0


def test_calibration_passes_gradient_through_the_uncertainty_only():
  """The calibration term reads the whole image only through its detached
  residual sg(rho): its gradient w.r.t. the whole images is exactly 0, and
  w.r.t. the boxes (through l = softplus(-|x|)) it is not."""
  inputs = random_inputs(seed=3)
  objective = uncha_lib.UnchaObjective({"name": "uncha"})

  def calibration(image, box_image, batch):
    model = _GivenEmbeddings(inputs["c"], 1.0, 1.0, 1.0)
    batch = {**batch, "image": image, "box_image": box_image}
    metrics = objective.loss(model, {}, batch, rng=None, axis_name=None)[1][0]
    return metrics["loss/calibration/box_image_image"]

  with jax.enable_x64(True):
    # One jitted computation (run op by op it compiled ~100 executables).
    d_image, d_box = jax.jit(jax.grad(calibration, argnums=(0, 1)))(
      jnp.asarray(inputs["image"]), jnp.asarray(inputs["box_image"]), as_batch(inputs)
    )
  assert not np.asarray(d_image).any()
  assert np.abs(np.asarray(d_box)[inputs["mask"]]).min() > 0


def multi_box_batch(batch_size=16, slots=3, seed=0):
  """random_batch's whole images and captions, `slots` random box crops and
  phrases per row and a mask with 0 to `slots` valid boxes per row."""
  batch = random_batch(batch_size, seed)
  rng = np.random.default_rng(seed + 1)
  boxes = random_batch(batch_size * slots, seed=seed + 2)
  image_shape = boxes["image"].shape[1:]
  counts = rng.integers(0, slots + 1, size=batch_size)
  counts[0] = slots
  return {
    **batch,
    "box_image": boxes["image"].reshape(batch_size, slots, *image_shape),
    "box_tokens": boxes["tokens"].reshape(batch_size, slots, -1),
    "box_mask": np.arange(slots)[None, :] < counts[:, None],
  }


@pytest.mark.parametrize(
  "settings",
  [
    pytest.param({}, id="global"),
    # The release's grouping is checked against its per-rank average in the
    # push tier; its 1-vs-8 identity is in the slow tier.
    pytest.param(
      {"box_reduction": "per_device", "rows_per_device": 4},
      id="per_device_blocks_of_4",
      marks=pytest.mark.slow,
    ),
  ],
)
def test_one_device_equals_eight_devices(settings):
  """Both readings are device-count free: "global" by construction, the
  per-device blocks because they are fixed rows of the global batch (blocks
  of 4 rows span two devices of 2 rows each)."""
  objective = uncha_lib.UnchaObjective({"name": "uncha", **settings})

  def build():
    model_def, params = tiny_model(
      geometry="lorentz", dtype="float64", extra_logit_scales=uncha_lib.EXTRA_LOGIT_SCALES
    )
    params["log_alpha_img"] = jnp.asarray(np.log(0.6))
    params["log_alpha_txt"] = jnp.asarray(np.log(0.4))
    return model_def, params, objective, multi_box_batch(), None

  grads = assert_one_device_equals_n_devices_float64(build, label=f"uncha {settings}")
  assert float(np.abs(grads["image_proj"]["kernel"]).max()) > 0
  for name in ("log_logit_scale", "log_logit_scale_local", "log_logit_scale_global_local"):
    assert float(np.abs(grads[name])) > 0, name


def test_scales_are_new_params_clamped_and_logged():
  model_def, params = tiny_model(extra_logit_scales=uncha_lib.EXTRA_LOGIT_SCALES)
  np.testing.assert_allclose(float(params["log_logit_scale_local"]), np.log(20.0), rtol=1e-6)
  np.testing.assert_allclose(
    float(params["log_logit_scale_global_local"]), np.log(1 / 0.06), rtol=1e-6
  )
  # Every other model keeps its params: no extra scale without the setting.
  _, plain = tiny_model()
  assert not any(key.startswith("log_logit_scale_") for key in plain)
  objective = uncha_lib.UnchaObjective({"name": "uncha"})
  moved = {**params, "log_logit_scale_local": jnp.asarray(7.0, jnp.float32)}
  # The projection and the logged scalars as one jitted computation.
  projected, metrics = jax.jit(
    lambda params, moved: (
      objective.project_params(moved, model_def.merge(params)),
      objective.scalar_metrics(model_def.merge(params)),
    )
  )(params, moved)
  np.testing.assert_allclose(float(projected["log_logit_scale_local"]), np.log(100.0), rtol=1e-6)
  np.testing.assert_allclose(float(metrics["logit_scale_local"]), 20.0, rtol=1e-5)
  assert objective.fresh_params() == ("log_logit_scale_local", "log_logit_scale_global_local")
  with pytest.raises(ValueError, match="needs model.extra_logit_scales"):
    objective.check_model_config({"geometry": "lorentz"})


def test_bad_settings_fail_naming_the_key():
  with pytest.raises(ValueError, match="box_reduction"):
    uncha_lib.UnchaObjective({"name": "uncha", "box_reduction": "per_rank"})
  with pytest.raises(ValueError, match="rows_per_device=4 must divide the global batch"):
    objective_terms({"box_reduction": "per_device", "rows_per_device": 4}, random_inputs())


def test_paper_variants_carry_the_released_settings_and_scales_never_decay():
  from configs import uncha as uncha_config
  from hyperbolic_vl.training import optimizer

  config = uncha_config.get_config("vit_b")
  data = config.input.data
  assert (data.name, data.max_boxes, tuple(data.crop_scale), data.grayscale_prob) == (
    "world_boxes",
    5,
    (0.8, 1.0),
    0.2,
  )
  assert (config.input.batch_size, config.total_steps, config.optim.lr) == (768, 500_000, 5e-4)
  assert (config.optim.warmup_steps, config.optim.weight_decay) == (4000, 0.2)
  assert config.optim.decay_gains_biases  # the release's `gain_bias_decay or weight_decay`
  assert dict(config.model.extra_logit_scales) == uncha_lib.EXTRA_LOGIT_SCALES
  assert config.objective.box_reduction == "global"
  grit = uncha_config.get_config("vit_s,data=grit").input.data
  assert (grit.name, grit.max_boxes, grit.grayscale_prob) == ("grit", 5, 0.2)
  _, params = tiny_model(extra_logit_scales=uncha_lib.EXTRA_LOGIT_SCALES)
  mask = optimizer.weight_decay_mask(params, decay_gains_biases=True)
  for name in ("log_logit_scale", "log_logit_scale_local", "log_logit_scale_global_local"):
    assert not mask[name], name
