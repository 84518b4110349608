"""HySAC's loss: every term and the total against a float64 NumPy port of
the released formulas (aimagelab/HySAC hysac/losses.py, hysac/lorentz.py,
hysac/training.py), the local scope against the release's per-rank loss on
2 simulated ranks, the global default 1 device == 8 devices, and the
logit-scale floor."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from tiny_fixtures import (
  GivenEmbeddings,
  as_float64,
  assert_one_device_equals_n_devices_float64,
  np_ce,
  np_dist,
  np_half_aperture,
  np_oxy_angle,
  random_batch,
)
from tiny_fixtures import tiny_two_towers as tiny_model

from hyperbolic_vl.objectives import hysac as hysac_lib
from hyperbolic_vl.training import sharding
from hyperbolic_vl.training import step as step_lib

RELEASE_EPS = 1e-5  # oxy_angle, half_aperture (hysac/lorentz.py)
DIST_EPS = 1e-8  # pairwise_dist's acosh clamp


# ---------------------------------------------------------------------------
# The released loss in float64 NumPy, clamps and eps included, written from
# hysac/losses.py, independent of the geometry module. hysac/lorentz.py is
# meru/lorentz.py with its own eps: tiny_fixtures' Lorentz functions, given
# the release's eps here at every call.
# ---------------------------------------------------------------------------
def np_contrastive(text, image, c, scale):
  """LorentzianCLIPContrastive on one rank's rows."""
  image_logits = -np_dist(image, text, c, DIST_EPS)
  text_logits = -np_dist(text, image, c, DIST_EPS)
  return 0.5 * (np_ce(scale * image_logits) + np_ce(scale * text_logits))


def np_entailment(x, y, c, aperture_scale, eps=RELEASE_EPS):
  angle = np_oxy_angle(x, y, c, eps)
  return np.maximum(angle - aperture_scale * np_half_aperture(x, c, eps), 0).mean()


def np_hysac(emb, c, scale, entail_weight=1.0, aperture_scale=1.0, normalization="release"):
  """{metric: value} of one rank's step (training.py:146-166)."""
  i_s, t_s, i_u, t_u = emb["image"], emb["text"], emb["unsafe_image"], emb["unsafe_text"]
  terms = {
    "loss/contrastive/safe": np_contrastive(t_s, i_s, c, scale),
    "loss/contrastive/unsafe": np_contrastive(t_u, i_u, c, scale),
    "loss/contrastive/safe_text_unsafe_image": np_contrastive(t_s, i_u, c, scale),
    "loss/contrastive/unsafe_text_safe_image": np_contrastive(t_u, i_s, c, scale),
    "loss/entailment/safe": np_entailment(t_s, i_s, c, aperture_scale),
    "loss/entailment/unsafe": np_entailment(t_u, i_u, c, aperture_scale),
    "loss/entailment/safe_image_unsafe_text": np_entailment(i_s, t_u, c, aperture_scale),
  }
  losses = np.array(list(terms.values()))
  lambdas = np.array([1, 1, 1, 1, entail_weight, entail_weight, entail_weight], np.float64)
  if normalization == "release":
    # lambdas / lambdas.sum() (hysac_train.py:129), then / lambdas.numel().
    terms["loss"] = (lambdas / lambdas.sum()) @ losses / lambdas.size
  else:
    terms["loss"] = lambdas @ losses / lambdas.size
  return terms


def random_embeddings(batch_size=6, dim=5, seed=0):
  """Safe content nearer the origin than unsafe, random directions; row 0's
  safe image sits inside the aperture floor's reach (|x| < 0.2, so its
  aperture is the release's capped pi/2 - 4.5e-3) and row 1's unsafe caption
  lies on the ray through its safe image (the angle at its floor)."""
  rng = np.random.default_rng(seed)
  draw = lambda radius: radius * rng.normal(size=(batch_size, dim)) / np.sqrt(dim)
  emb = {"image": draw(1.0), "text": draw(0.7), "unsafe_image": draw(1.6), "unsafe_text": draw(1.3)}
  emb["image"][0] *= 0.05 / np.linalg.norm(emb["image"][0])
  emb["unsafe_text"][1] = 2.5 * emb["image"][1]
  return emb


def as_batch(emb):
  return {
    "image": emb["image"],
    "tokens": emb["text"],
    "unsafe_image": emb["unsafe_image"],
    "unsafe_tokens": emb["unsafe_text"],
  }


def objective_of(**settings):
  return hysac_lib.HysacObjective({"name": "hysac", **settings})


@pytest.mark.parametrize(
  "settings",
  [
    {},
    {"entail_weight": 0.4, "aperture_scale": 0.8},
    {"entail_weight": 0.4, "normalization": "mean"},
  ],
  ids=["release_defaults", "weights", "mean"],
)
def test_every_term_and_the_total_match_the_released_formulas_in_float64(settings):
  curv, scale = 1.3, 1 / 0.07
  objective = objective_of(**settings)
  with jax.enable_x64(True):
    emb = random_embeddings()
    loss, (metrics, _) = objective.loss(
      GivenEmbeddings(curv, scale), {}, as_batch(emb), rng=None, axis_name=None
    )
    got = {key: float(value) for key, value in metrics.items()}
    got["loss"] = float(loss)
  expected = np_hysac(emb, curv, scale, **settings)
  for key, value in expected.items():
    np.testing.assert_allclose(got[key], value, rtol=1e-10, err_msg=key)
  for key in expected:  # every hinge active, none saturated
    if key.startswith("loss/entailment/"):
      assert 0 < got[key] < np.pi, key
  for key in hysac_lib.EMBEDDINGS:
    distances = np.arcsinh(np.sqrt(curv) * np.linalg.norm(emb[key], axis=-1)) / np.sqrt(curv)
    np.testing.assert_allclose(got[f"mean_dist_origin/{key}"], distances.mean(), rtol=1e-10)


def test_release_total_is_the_sum_over_49_at_unit_entailment_weight():
  """Hand figure: lambda = 1 normalised to 1/7 each, then / 7 again."""
  with jax.enable_x64(True):
    emb = random_embeddings(seed=3)
    loss, (metrics, _) = objective_of().loss(
      GivenEmbeddings(0.9, 20.0), {}, as_batch(emb), rng=None, axis_name=None
    )
  seven = [float(v) for k, v in metrics.items() if k.count("/") == 2 and k.startswith("loss/")]
  assert len(seven) == 7
  np.testing.assert_allclose(float(loss), sum(seven) / 49, rtol=1e-12)


def test_the_release_angle_eps_binds_at_its_floors():
  """On a ray the exterior angle is 0 exactly and at least acos(1 - 1e-5) =
  4.47e-3 in the release (its "+ eps" denominator adds more); near the origin the aperture is pi/2 exactly and
  asin(1 - 1e-5) in the release. angle_eps = 0 gives MERU's exact values."""
  with jax.enable_x64(True):
    x = np.asarray([[0.3, -0.4, 0.5]])
    on_ray = hysac_lib.release_oxy_angle(x, 2.0 * x, 1.0, RELEASE_EPS)
    aperture = hysac_lib.release_half_aperture(0.1 * x, 1.0, RELEASE_EPS)
    exact_angle = hysac_lib.release_oxy_angle(x, 2.0 * x, 1.0, 0.0)
    exact_aperture = hysac_lib.release_half_aperture(0.1 * x, 1.0, 0.0)
  np.testing.assert_allclose(
    float(on_ray[0]), np_oxy_angle(x, 2.0 * x, 1.0, RELEASE_EPS)[0], rtol=1e-9
  )
  assert float(on_ray[0]) >= np.arccos(1 - 1e-5)
  np.testing.assert_allclose(float(aperture[0]), np.arcsin(1 - 1e-5), rtol=1e-12)
  assert float(exact_angle[0]) < 1e-6
  np.testing.assert_allclose(float(exact_aperture[0]), np.pi / 2, rtol=1e-12)
  # And in the loss: the eps-free reference differs from the release's.
  emb = random_embeddings()
  release = np_hysac(emb, 1.3, 10.0)["loss/entailment/safe"]
  angle = np_oxy_angle(emb["text"], emb["image"], 1.3, eps=1e-300)
  aperture = np_half_aperture(emb["text"], 1.3, eps=1e-300)
  assert abs(release - np.maximum(angle - aperture, 0).mean()) > 1e-7


def test_the_release_angles_have_finite_gradients_in_float32():
  """The clipped acos/asin inputs keep derivatives <= 1/sqrt(2 eps)."""
  emb = {k: jnp.asarray(v, jnp.float32) for k, v in random_embeddings().items()}

  def total(emb):
    return objective_of().loss(
      GivenEmbeddings(1.0, 10.0), {}, as_batch(emb), rng=None, axis_name=None
    )[0]

  # One compiled program (an eager gradient compiles each of its ~150 operations).
  grads = jax.jit(jax.grad(total))(emb)
  for key, value in grads.items():
    assert np.isfinite(np.asarray(value)).all(), key


def quadruplet_batch(batch_size):
  """random_batch's images and captions as the safe half, a second draw as
  the unsafe half."""
  safe = random_batch(batch_size)
  unsafe = random_batch(batch_size, seed=1)
  return {**safe, "unsafe_image": unsafe["image"], "unsafe_tokens": unsafe["tokens"]}


def spread_model():
  model_def, params = tiny_model(geometry="lorentz", dtype="float64")
  # Spread the embeddings so the entailment hinges are active.
  params["log_alpha_img"] = jnp.asarray(np.log(0.6))
  params["log_alpha_txt"] = jnp.asarray(np.log(0.4))
  return model_def, params


def test_local_scope_is_the_mean_of_the_releases_per_rank_losses_on_2_ranks():
  """contrastive_scope="local" on 2 devices: each device contrasts its own 4
  rows; the step's pmean is the mean of the two ranks' release losses."""
  batch_size, ranks = 8, 2
  with jax.enable_x64(True):
    model_def, params = spread_model()
    params = as_float64(params)
    batch = as_float64(quadruplet_batch(batch_size))
    model = model_def.merge(params)
    # Compiled once (an eager pass compiles each of its operations instead).
    embed = jax.jit(
      lambda p, b: hysac_lib.HysacObjective({"name": "hysac"}).embed(model_def.merge(p), b)
    )
    emb = jax.device_get(embed(params, batch))
    curv, scale = float(model.curv()), float(model.logit_scale())
    # Only the two losses are read: one program computes both sharded losses,
    # without the gradients tiny_fixtures.loss_and_grads would compile too.
    mesh = sharding.make_mesh(2, 1)
    local_loss, global_loss = (
      step_lib.make_sharded_loss(model_def, objective, mesh, fsdp_min_elements=0)
      for objective in (objective_of(contrastive_scope="local"), objective_of())
    )
    both = jax.jit(lambda p, b, rng: (local_loss(p, {}, b, rng)[0], global_loss(p, {}, b, rng)[0]))
    local, global_ = (float(x) for x in both(params, batch, jax.random.key(0)))
  rows = batch_size // ranks
  per_rank = [
    np_hysac({k: v[r * rows : (r + 1) * rows] for k, v in emb.items()}, curv, scale)["loss"]
    for r in range(ranks)
  ]
  np.testing.assert_allclose(local, np.mean(per_rank), rtol=1e-10)
  # The global batch is another loss: every row meets all 8 columns.
  np.testing.assert_allclose(global_, np_hysac(emb, curv, scale)["loss"], rtol=1e-10)
  assert abs(local - global_) > 1e-4


def test_global_scope_one_device_equals_eight_devices():
  def build():
    model_def, params = spread_model()
    return model_def, params, objective_of(), quadruplet_batch(16), None

  grads = assert_one_device_equals_n_devices_float64(build, label="hysac global")
  assert float(np.abs(grads["image_proj"]["kernel"]).max()) > 0
  assert float(np.abs(grads["log_logit_scale"])) > 0


def test_logit_scale_floor_binds_in_the_projection():
  """model.min_logit_scale = 1/0.07 (the release's clamp): a scale pushed
  below comes back to 1/0.07, one above 100 to 100; without the setting
  (every other model) nothing is floored."""
  objective = objective_of()
  floor_def, params = tiny_model(geometry="lorentz", min_logit_scale=1 / 0.07)
  plain_def, _ = tiny_model(geometry="lorentz")
  floor_model, plain_model = floor_def.merge(params), plain_def.merge(params)
  for value, floored, plain in (
    (np.log(5.0), np.log(1 / 0.07), np.log(5.0)),
    (np.log(200.0), np.log(100.0), np.log(100.0)),
    (np.log(30.0), np.log(30.0), np.log(30.0)),
  ):
    params["log_logit_scale"] = jnp.asarray(value, jnp.float32)
    got = objective.project_params(params, floor_model)["log_logit_scale"]
    np.testing.assert_allclose(float(got), floored, rtol=1e-6)
    got = objective.project_params(params, plain_model)["log_logit_scale"]
    np.testing.assert_allclose(float(got), plain, rtol=1e-6)


def test_unknown_scope_fails_with_the_valid_ones():
  with pytest.raises(ValueError, match="contrastive_scope"):
    objective_of(contrastive_scope="per_gpu")
