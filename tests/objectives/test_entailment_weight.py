"""The entailment term's weight (objectives/entailment_weight.py): the
learned weight's param is excluded from weight decay, clamped, linked from
the objective's setting, and receives the gradient of
r(t) * (lambda e^s L_entail - s / 2); the warm-up's value at steps 0, N/2, N."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from tiny_fixtures import assert_one_device_equals_n_devices_float64, random_batch
from tiny_fixtures import tiny_two_towers as tiny_model

from configs import hycoclip as hycoclip_config
from configs import meru as meru_config
from hyperbolic_vl import errors, objectives
from hyperbolic_vl.models import two_towers
from hyperbolic_vl.objectives import entailment_weight
from hyperbolic_vl.objectives import meru as meru_lib
from hyperbolic_vl.runs import run_dir
from hyperbolic_vl.training import optimizer


@pytest.fixture(scope="module")
def learned_model():
  """The float64 tiny model with the learned weight, built once for the file."""
  with jax.enable_x64(True):
    return tiny_model(dtype="float64", learned_entail_weight=True)


def test_weight_decay_mask_excludes_the_log_weight(learned_model):
  _, params = learned_model
  assert params["log_entail_weight"].shape == ()
  for gains_biases in (False, True):
    for factor_scalars in (False, True):
      mask = optimizer.weight_decay_mask(params, gains_biases, factor_scalars)
      assert mask["log_entail_weight"] is False or not bool(mask["log_entail_weight"])
      assert bool(mask["image_proj"]["kernel"])  # the mask decays something


def test_learned_weight_is_clamped_to_a_factor_100_of_lambda(learned_model):
  model_def, params = learned_model
  params = dict(params)
  with jax.enable_x64(True):  # the fixture's float64 params, clamped in float64
    params["log_entail_weight"] = jnp.asarray(7.0)  # e^7 > 100
    projected = two_towers.project_learned_scalars(params, model_def.module)
    np.testing.assert_allclose(float(projected["log_entail_weight"]), np.log(100.0), rtol=1e-15)
    params["log_entail_weight"] = jnp.asarray(-7.0)
    projected = two_towers.project_learned_scalars(params, model_def.module)
    np.testing.assert_allclose(float(projected["log_entail_weight"]), -np.log(100.0), rtol=1e-15)


@pytest.mark.parametrize("steps, expected", [(0, 0.0), (5, 0.5), (10, 1.0), (25, 1.0)])
def test_warmup_factor_at_0_half_and_n_steps(steps, expected):
  assert float(entailment_weight.warmup_factor(steps, 10)) == expected
  assert float(entailment_weight.warmup_factor(steps, 0)) == 1.0  # no warm-up


def test_warmup_counts_steps_in_aux_and_scales_the_term():
  settings = meru_lib.MeruSettings(entail_weight=0.2, entail_warmup_steps=10)
  aux = entailment_weight.init_aux(settings)
  entail = jnp.asarray(0.7)
  values = []
  for _ in range(11):
    term, metrics, aux = entailment_weight.weighted_entailment(settings, None, aux, entail)
    values.append((float(term), float(metrics["entail_weight"])))
  # Hand-computed: r(t) = t / 10 at the t-th call (counting from 0), then 1.
  np.testing.assert_allclose([v[0] for v in values], [0.14 * t / 10 for t in range(11)], rtol=1e-6)
  np.testing.assert_allclose([v[1] for v in values], [0.02 * t for t in range(11)], rtol=1e-6)
  assert int(aux[entailment_weight.STEP_KEY]) == 11
  # Without a warm-up nor a learned weight: no counter, no extra metric.
  assert entailment_weight.init_aux(meru_lib.MeruSettings()) == {}


def test_config_links_the_model_param_to_the_objective_setting():
  config = meru_config.get_config("tiny")
  assert config.model.learned_entail_weight is False
  config.objective.entail_weight_learned = True  # what --config.objective... sets
  assert config.model.learned_entail_weight is True
  assert hycoclip_config.get_config("tiny").model.learned_entail_weight is False
  # A hand-built model config without the param is refused in one line.
  objective = objectives.get({"name": "meru", "entail_weight_learned": True})
  with pytest.raises(errors.ConfigError, match="model.learned_entail_weight=True"):
    objective.check_model_config({"geometry": "lorentz"})
  with pytest.raises(errors.ConfigError, match="entail_warmup_steps"):
    objectives.get({"name": "meru", "entail_warmup_steps": -1})
  # Workdirs saved before these settings existed still resume.
  assert run_dir._absent_means("objective.entail_weight_learned", False)
  assert run_dir._absent_means("model.learned_entail_weight", False)
  assert run_dir._absent_means("objective.entail_warmup_steps", 0)
  assert not run_dir._absent_means("objective.entail_warmup_steps", 100)


def _meru_build(model=None, warmup_steps=4, step=2, log_factor=0.3):
  model_def, params = model or tiny_model(dtype="float64", learned_entail_weight=True)
  params = dict(params)
  # Spread the embeddings so the entailment term is live.
  params["log_alpha_img"] = jnp.asarray(np.log(0.6))
  params["log_alpha_txt"] = jnp.asarray(np.log(0.3))
  params["log_entail_weight"] = jnp.asarray(log_factor)
  objective = meru_lib.MeruObjective(
    {
      "name": "meru",
      "entail_weight": 0.2,
      "entail_weight_learned": True,
      "entail_warmup_steps": warmup_steps,
    }
  )
  aux = {entailment_weight.STEP_KEY: jnp.asarray(step, jnp.int32)}
  return model_def, params, objective, random_batch(8), aux


def test_gradient_reaches_the_log_weight_float64(learned_model):
  """d total / d s = r (lambda e^s L - 1/2), with L the logged entailment loss."""
  with jax.enable_x64(True):
    model_def, params, objective, batch, aux = _meru_build(learned_model)

    def loss(p):
      return objective.loss(model_def.merge(p), aux, batch, rng=None, axis_name=None)

    (total, (metrics, new_aux)), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
  r, s, lam = 2 / 4, 0.3, 0.2
  entail = float(metrics["loss/entailment"])
  assert entail > 0.01  # the branch is live
  np.testing.assert_allclose(
    float(grads["log_entail_weight"]), r * (lam * np.exp(s) * entail - 0.5), rtol=1e-10
  )
  np.testing.assert_allclose(
    float(total),
    float(metrics["loss/contrastive"]) + r * (lam * np.exp(s) * entail - s / 2),
    rtol=1e-12,
  )
  np.testing.assert_allclose(float(metrics["entail_weight"]), r * lam * np.exp(s), rtol=1e-12)
  assert int(new_aux[entailment_weight.STEP_KEY]) == 3


@pytest.mark.slow
def test_one_device_equals_eight_devices_with_learned_weight_and_warmup():
  assert_one_device_equals_n_devices_float64(_meru_build, label="meru learned weight")
