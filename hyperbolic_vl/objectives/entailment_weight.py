"""The entailment term's weight: fixed (the papers' lambda), learned, and/or
warmed up from 0; shared by every objective that adds `lambda * L_entail`
to a contrastive loss (MERU, HMID-Net, HyCoCLIP, PHyCLIP, UNCHA).

  term = r(t) * (w * L_entail - learned * s / 2),   w = lambda * exp(s)

lambda is `objective.entail_weight`. With `objective.entail_weight_learned`
the model holds s = `log_entail_weight` (init 0, so w starts at lambda; a
log-space scalar, so w stays positive, weight decay passes it by and it is
clamped to [-log 100, log 100] after each update, models/two_towers.py).
A learned weight on a term that is never negative would simply fall to 0:
the -s/2 is the homoscedastic-uncertainty regulariser of Kendall, Gal &
Cipolla (CVPR 2018) with w = 1 / (2 sigma^2), whose minimum over s sits at
w = 1 / (2 L_entail): the weight grows while the cones are satisfied and
shrinks while they are violated, and cannot run to 0. Its value lambda only
sets where s starts.

r(t) = min(t / N, 1) with N = `objective.entail_warmup_steps` (0: r = 1), t
the number of steps taken, counted in aux (`entail_weight_step`) because an
objective holds no call-order state: the entailment term is off at step 0,
half on at N / 2 and fully on from N.

Logged: `entail_weight` (r(t) * w, the weight the step applied) beside the
unweighted `loss/entailment`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp

from hyperbolic_vl import errors

STEP_KEY = "entail_weight_step"
PARAM = "log_entail_weight"
# A learned weight stays within this factor of lambda either way.
MAX_FACTOR = 100.0
LOG_FACTOR_BOUNDS = (-math.log(MAX_FACTOR), math.log(MAX_FACTOR))


@dataclasses.dataclass(frozen=True)
class EntailmentWeightSettings:
  """The settings an objective with an entailment term adds to its own
  (a mixin of its `Settings`; `entail_weight` itself stays the objective's,
  with the paper's default)."""

  # Learn w = lambda * exp(s) with s a model param (`log_entail_weight`),
  # regularised by -s / 2 (Kendall et al. 2018). Configs built with
  # configs/common.py make model.learned_entail_weight follow this value.
  entail_weight_learned: bool = False
  # N > 0: the entailment term ramps linearly from 0 at step 0 to full at
  # step N; 0: on from the start.
  entail_warmup_steps: int = 0

  def check_entailment_weight(self) -> None:
    steps = self.entail_warmup_steps
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
      raise errors.ConfigError(
        f"objective.entail_warmup_steps must be an integer >= 0, got {steps!r}"
      )


def check_model_config(settings, model_config: Mapping[str, Any]) -> None:
  """A learned weight needs its param in the model."""
  if settings.entail_weight_learned and not dict(model_config).get("learned_entail_weight"):
    raise errors.ConfigError(
      "objective.entail_weight_learned=True needs the model's log_entail_weight param: set "
      "model.learned_entail_weight=True (configs built with configs/common.py set it with the "
      "objective's setting)"
    )


def fresh_params(settings) -> tuple[str, ...]:
  """A run with a learned weight started from one without keeps s = 0."""
  return (PARAM,) if settings.entail_weight_learned else ()


def init_aux(settings) -> dict:
  """The warm-up's step counter, only when there is a warm-up (so every
  other run's aux and checkpoint keep their layout)."""
  return {STEP_KEY: jnp.zeros((), jnp.int32)} if settings.entail_warmup_steps > 0 else {}


class EntailmentWeightHooks:
  """The two objective hooks every objective with this weight shares; put it
  before `base.Objective` among the objective's bases."""

  def fresh_params(self) -> tuple[str, ...]:
    return fresh_params(self.settings)

  def init_aux(self, model, params, rng, context=None) -> dict:
    del model, params, rng, context
    return init_aux(self.settings)


def warmup_factor(step, warmup_steps: int) -> jax.Array:
  """r(t) = min(t / N, 1); 1 when N = 0."""
  if warmup_steps <= 0:
    return jnp.ones((), jnp.float32)
  return jnp.minimum(jnp.asarray(step, jnp.float32) / warmup_steps, 1.0)


def weighted_entailment(settings, model, aux: dict, entail: jax.Array):
  """(term to add to the loss, metrics, next aux) for the unweighted
  entailment loss `entail` (see the module docstring)."""
  weight = jnp.asarray(settings.entail_weight, entail.dtype)
  regulariser = jnp.zeros((), entail.dtype)
  if settings.entail_weight_learned:
    log_factor = model.log_entail_weight_factor().astype(entail.dtype)
    weight = weight * jnp.exp(log_factor)
    regulariser = -0.5 * log_factor
  term = weight * entail + regulariser
  new_aux = aux
  if settings.entail_warmup_steps > 0:
    ramp = warmup_factor(aux[STEP_KEY], settings.entail_warmup_steps).astype(entail.dtype)
    term, weight = ramp * term, ramp * weight
    new_aux = {**aux, STEP_KEY: aux[STEP_KEY] + 1}
  # Logged only where it varies, so a fixed-weight run logs what it did.
  varies = settings.entail_weight_learned or settings.entail_warmup_steps > 0
  metrics = {"entail_weight": weight} if varies else {}
  return term, metrics, new_aux
