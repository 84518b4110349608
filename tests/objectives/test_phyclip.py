"""PHyCLIP's loss: every logged term and the gradients against a float64
NumPy port of the released `PHyCLIP.forward` (with its eps = 1e-6 clamps)
under l1 and l2 with random per-factor curvatures; K = 1 equals HyCoCLIP;
1 device == 8 devices."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import phyclip_reference as ref
import pytest
from tiny_fixtures import assert_one_device_equals_n_devices_float64, random_batch
from tiny_fixtures import tiny_two_towers as tiny_model

from hyperbolic_vl.objectives import hycoclip as hycoclip_lib
from hyperbolic_vl.objectives import meru as meru_lib
from hyperbolic_vl.objectives import phyclip as phyclip_lib

K, D = 4, 3  # factors, dimensions per factor


class _GivenEmbeddings:
  """A product model whose towers return their inputs: the loss sees exactly
  the embeddings a test draws (space components, K factors).

  Not tiny_fixtures.GivenEmbeddings: it holds log curvatures and the log
  scale (the tests differentiate in them, as the model's parameters are),
  K curvatures, and an alpha per factor."""

  geometry = "lorentz"

  def __init__(self, log_curvs, log_scale):
    self._log_curvs, self._log_scale = jnp.asarray(log_curvs), jnp.asarray(log_scale)

  def encode_image(self, images):
    return images

  def encode_text(self, tokens):
    return tokens

  def curv(self):
    return jnp.exp(self._log_curvs)

  def logit_scale(self):
    return jnp.exp(self._log_scale)

  def alpha(self, kind):
    del kind
    return jnp.ones_like(self._log_curvs)


def random_embeddings(batch_size=6, seed=0, num_factors=K):
  """Four (b, K d) float64 sets, boxes and phrases nearer the origin than
  images and captions (as training pushes them), random directions so that
  every entailment term has (pair, factor) entries inside and outside its cone.
  tiny_fixtures.boxed_embeddings' radii, but scaled by a factor's dimension D,
  not the whole K D."""
  rng = np.random.default_rng(seed)
  draw = lambda radius: radius * rng.normal(size=(batch_size, num_factors * D)) / np.sqrt(D)
  return {"image": draw(1.6), "tokens": draw(1.2), "box_image": draw(1.0), "box_tokens": draw(0.6)}


def random_curvatures(seed=0, num_factors=K):
  return np.random.default_rng(100 + seed).uniform(0.2, 5.0, size=num_factors)


def reference(batch, curvs, scale, metric):
  return ref.phyclip_loss(
    batch["image"], batch["tokens"], batch["box_image"], batch["box_tokens"], curvs, scale, metric
  )


@functools.cache
def loss_terms_and_grads(metric, chunk_size, eps=None):
  """PHyCLIP on given embeddings as one jitted computation: (loss, metrics)
  and the gradients in the embeddings, log c_k and log s (None for a chunked
  or eps-changed setting). One compile per setting serves the value and the
  gradient tests (run op by op, the loss and its gradient compiled ~300
  executables)."""
  settings = {"name": "phyclip", "product_metric": metric, "logit_chunk_size": chunk_size}
  objective = phyclip_lib.PhyclipObjective(settings if eps is None else {**settings, "eps": eps})

  def total(batch, log_curvs, log_scale):
    model = _GivenEmbeddings(log_curvs, log_scale)
    loss, (metrics, _) = objective.loss(model, {}, batch, rng=None, axis_name=None)
    return loss, metrics

  if chunk_size or eps is not None:  # no test reads these settings' gradients
    return jax.jit(lambda *inputs: (total(*inputs), None))
  return jax.jit(jax.value_and_grad(total, argnums=(0, 1, 2), has_aux=True))


def run_objective(batch, log_curvs, log_scale, metric="l1", chunk_size=0, eps=None):
  """((loss, metrics), gradients) of loss_terms_and_grads in float64 NumPy."""
  with jax.enable_x64(True):
    inputs = (
      jax.tree.map(jnp.asarray, batch),
      jnp.asarray(log_curvs, jnp.float64),
      jnp.asarray(log_scale, jnp.float64),
    )
    function = loss_terms_and_grads(metric, chunk_size, eps)
    return jax.tree.map(np.asarray, function(*inputs))


def objective_terms(batch, curvs, scale, **settings):
  (loss, metrics), _ = run_objective(batch, np.log(curvs), np.log(scale), **settings)
  return {**metrics, "loss": loss}


@pytest.mark.parametrize("chunk_size", [0, 4])
@pytest.mark.parametrize("metric", ["l1", "l2"])
def test_loss_and_every_term_match_the_released_formula_in_float64(metric, chunk_size):
  curvs, scale = random_curvatures(), 6.0
  batch = random_embeddings()
  got = objective_terms(batch, curvs, scale, metric=metric, chunk_size=chunk_size)
  expected = reference(batch, curvs, scale, metric)
  for key, value in expected.items():
    np.testing.assert_allclose(float(got[key]), value, rtol=1e-10, err_msg=key)
  # Every entailment term has its hinge active and is below its largest value, pi.
  for key in expected:
    if key.startswith("loss/entailment/"):
      assert 0 < expected[key] < np.pi, key
  np.testing.assert_allclose(got["curv/mean"], curvs.mean(), rtol=1e-12)
  np.testing.assert_allclose(got["curv/min"], curvs.min(), rtol=1e-12)
  np.testing.assert_allclose(got["curv/max"], curvs.max(), rtol=1e-12)
  # l1: the mean over factors of each factor's distance from its origin.
  if metric == "l1":
    per_factor = np.arcsinh(
      np.sqrt(curvs) * np.linalg.norm(ref.factors(batch["image"], K), axis=-1)
    ) / np.sqrt(curvs)
    np.testing.assert_allclose(got["mean_dist_origin/image"], per_factor.mean(), rtol=1e-12)


@pytest.mark.parametrize("metric", ["l1", "l2"])
def test_gradients_match_finite_differences_of_the_released_formula(metric):
  """d loss / d (embeddings, log c_k, log s) against central differences of
  the NumPy reference; h = 1e-6 gives ~1e-10 truncation and rounding error,
  so 1e-6 relative to the largest gradient is a tight bound."""
  batch = random_embeddings(seed=1)
  log_curvs, log_scale = np.log(random_curvatures(1)), np.log(6.0)
  _, grads = run_objective(batch, log_curvs, log_scale, metric=metric)

  def np_loss(batch, log_curvs, log_scale):
    return reference(batch, np.exp(log_curvs), np.exp(log_scale), metric)["loss"]

  def central_difference(perturb, step=1e-6):
    return (np_loss(*perturb(step)) - np_loss(*perturb(-step))) / (2 * step)

  def shifted_batch(key, index, step):
    moved = {k: v.copy() for k, v in batch.items()}
    moved[key][index] += step
    return moved, log_curvs, log_scale

  def shifted_curv(k, step):
    moved = log_curvs.copy()
    moved[k] += step
    return batch, moved, log_scale

  rng = np.random.default_rng(0)
  scale_of = max(np.abs(g).max() for g in jax.tree.leaves(grads))
  for key in batch:
    # 12 random coordinates per set (of 72) keep the test fast.
    for flat in rng.choice(batch[key].size, 12, replace=False):
      index = np.unravel_index(flat, batch[key].shape)
      numeric = central_difference(lambda h, key=key, index=index: shifted_batch(key, index, h))
      assert abs(grads[0][key][index] - numeric) <= 1e-6 * scale_of, (key, index)
  for k in range(K):
    numeric = central_difference(lambda h, k=k: shifted_curv(k, h))
    assert abs(grads[1][k] - numeric) <= 1e-6 * scale_of, ("log_curv", k)
    assert abs(grads[1][k]) > 0
  numeric = central_difference(lambda h: (batch, log_curvs, log_scale + h))
  assert abs(grads[2] - numeric) <= 1e-6 * scale_of


def test_one_factor_with_plain_guards_is_hycoclip():
  """K = 1 and eps = 0: the product geometry is the plain Lorentz geometry,
  so every term equals HyCoCLIP's in float64."""
  batch = random_embeddings(seed=2, num_factors=1)
  hycoclip = hycoclip_lib.HycoclipObjective({"name": "hycoclip"})
  curv, scale = 1.7, 8.0
  got = objective_terms(batch, np.asarray([curv]), scale, eps=0.0)
  with jax.enable_x64(True):
    model = _GivenEmbeddings(np.log(curv), np.log(scale))
    # One jitted computation (run op by op it compiled ~60 executables).
    loss, (expected, _) = jax.jit(
      lambda batch: hycoclip.loss(model, {}, batch, rng=None, axis_name=None)
    )(batch)
  np.testing.assert_allclose(got["loss"], float(loss), rtol=1e-13)
  for key, value in expected.items():
    if key.startswith(("loss/", "mean_dist_origin/")):
      np.testing.assert_allclose(got[key], float(value), rtol=1e-13, err_msg=key)


def test_score_is_the_released_sum_of_inner_products():
  batch = random_embeddings(seed=3)
  curvs = random_curvatures(3)
  objective = phyclip_lib.PhyclipObjective({"name": "phyclip"})
  with jax.enable_x64(True):
    model = _GivenEmbeddings(np.log(curvs), 0.0)
    got = np.asarray(
      jax.jit(lambda x, y: objective.score(model, x, y))(batch["image"], batch["tokens"])
    )
  np.testing.assert_allclose(got, ref.score(batch["image"], batch["tokens"], curvs), rtol=1e-12)


def grounded_batch(batch_size=16):
  batch = random_batch(batch_size)
  boxes = random_batch(batch_size, seed=1)
  return {**batch, "box_image": boxes["image"], "box_tokens": boxes["tokens"]}


# l2 aggregates the same per-factor distances (checked against the reference
# in the push tier): its 1-vs-8 identity is in the slow tier.
@pytest.mark.parametrize("metric", ["l1", pytest.param("l2", marks=pytest.mark.slow)])
def test_one_device_equals_eight_devices(metric):
  objective = phyclip_lib.PhyclipObjective({"name": "phyclip", "product_metric": metric})

  def build():
    # Embed dim 16 in four factors of four, random per-factor curvatures.
    model_def, params = tiny_model(geometry="lorentz", dtype="float64", factor_dim=4)
    params["log_curv"] = jnp.log(jnp.asarray([0.4, 1.0, 2.0, 3.5]))
    # Spread the embeddings so the entailment hinges are active.
    params["log_alpha_img"] = jnp.full((4,), np.log(0.9))
    params["log_alpha_txt"] = jnp.full((4,), np.log(0.6))
    return model_def, params, objective, grounded_batch(), None

  grads = assert_one_device_equals_n_devices_float64(build, label=f"phyclip {metric}")
  assert float(np.abs(grads["image_proj"]["kernel"]).max()) > 0
  assert grads["log_curv"].shape == (4,) and np.all(np.abs(grads["log_curv"]) > 0)


def test_objectives_refuse_models_they_cannot_use():
  with pytest.raises(ValueError, match="needs a product of Lorentz spaces: set model.factor_dim"):
    phyclip_lib.PhyclipObjective({"name": "phyclip"}).check_model_config(
      {"geometry": "lorentz", "factor_dim": 0}
    )
  with pytest.raises(ValueError, match="'meru' works in one Lorentz space; model.factor_dim=8"):
    meru_lib.MeruObjective({"name": "meru"}).check_model_config(
      {"geometry": "lorentz", "factor_dim": 8}
    )
  with pytest.raises(ValueError, match=r"objective.product_metric='max'; valid: 'l1', 'l2'"):
    phyclip_lib.PhyclipObjective({"name": "phyclip", "product_metric": "max"})
