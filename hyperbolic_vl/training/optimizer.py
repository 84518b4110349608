"""The optimizer: AdamW (MERU's recipe, the default) or SGD with momentum
(HCL's released MoCo-v2 recipe), a decay mask, the learning-rate schedule,
optional clipping, and frozen parameters that get no optimizer state.

`optim.name`:
  "adamw"  optax.adamw(b1, b2, eps), decoupled weight decay lr * wd * p
  "sgd"    PyTorch's torch.optim.SGD: g + wd p (L2 decay added to the
           gradient), then heavy-ball momentum m <- mu m + g, p <- p - lr m

`optim.mu_dtype`: "" (the params' dtype) or "bfloat16": the dtype AdamW
keeps its first moment in (SGD its momentum buffer).

`optim.schedule`:
  "cosine"            linear warmup to lr, then cosine to 0 at total_steps
  "constant"          lr throughout
  "cosine_per_epoch"  MoCo's `--cos`: lr constant within an epoch, set at the
                      start of epoch e = step // steps_per_epoch to
                      lr * (1 + cos(pi e / E)) / 2, E = ceil(total_steps /
                      steps_per_epoch); needs optim.steps_per_epoch (filled
                      from the data at start-up, data/run_length.py)
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable

import jax
import jax.numpy as jnp
import optax

from hyperbolic_vl import errors

LEARNED_SCALAR_PATTERN = re.compile(r"(^|/)log_[a-z_]+$")
OPTIMIZERS = ("adamw", "sgd")
SCHEDULES = ("cosine", "constant", "cosine_per_epoch")


def path_str(path) -> str:
  return "/".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path)


def weight_decay_mask(
  params: dict, decay_gains_biases: bool, decay_factor_scalars: bool = False
) -> dict:
  """True where the optimizer decays.

  MERU's paper disables decay for gains, biases and learned scalars; its code
  (`gain_bias_decay or weight_decay`) in fact decays gains and biases. Both
  are available via `optim.decay_gains_biases`. Learned scalars never decay,
  except the per-factor (K,) curvatures and alphas of a product model with
  `optim.decay_factor_scalars` (PHyCLIP's release decays them: its
  exclusion names never match the entries of its ParameterLists).
  """

  def decide(path, leaf):
    name = path_str(path)
    if LEARNED_SCALAR_PATTERN.search(name):
      return decay_factor_scalars and leaf.ndim == 1
    if decay_gains_biases:
      return True
    return leaf.ndim >= 2 and not name.endswith(("bias", "scale"))

  return jax.tree_util.tree_map_with_path(decide, params)


def cosine_per_epoch_schedule(lr: float, steps_per_epoch: int, total_steps: int) -> optax.Schedule:
  """MoCo's per-epoch cosine: step s of epoch e = s // steps_per_epoch takes
  lr (1 + cos(pi e / E)) / 2, E = ceil(total_steps / steps_per_epoch)."""
  epochs = max(math.ceil(total_steps / steps_per_epoch), 1)

  def schedule(step):
    epoch = jnp.floor_divide(jnp.asarray(step), steps_per_epoch)
    return lr * 0.5 * (1.0 + jnp.cos(jnp.pi * epoch / epochs))

  return schedule


def learning_rate_schedule(optim_config, total_steps: int) -> optax.Schedule:
  kind = optim_config.get("schedule", "cosine")
  if kind not in SCHEDULES:
    raise errors.ConfigError(f"optim.schedule={kind!r}; valid: {list(SCHEDULES)}")
  if kind == "constant":
    return optax.constant_schedule(optim_config.lr)
  if kind == "cosine_per_epoch":
    steps_per_epoch = int(optim_config.get("steps_per_epoch", 0) or 0)
    if steps_per_epoch <= 0:
      raise errors.ConfigError(
        "optim.schedule='cosine_per_epoch' needs optim.steps_per_epoch > 0 (set it, or set "
        "epochs and total_steps=0 so that it comes from the data at start-up)"
      )
    return cosine_per_epoch_schedule(optim_config.lr, steps_per_epoch, total_steps)
  warmup = int(optim_config.warmup_steps)
  if warmup >= total_steps:
    warmup = max(total_steps - 1, 0)
  return optax.warmup_cosine_decay_schedule(
    init_value=0.0,
    peak_value=optim_config.lr,
    warmup_steps=warmup,
    decay_steps=max(total_steps, warmup + 1),
    end_value=0.0,
  )


MU_DTYPES = ("", "float32", "bfloat16")


def first_moment_dtype(optim_config):
  """`optim.mu_dtype`: None (the params' dtype), float32 or bfloat16."""
  name = optim_config.get("mu_dtype", "") or ""
  if name not in MU_DTYPES:
    raise errors.ConfigError(f"optim.mu_dtype={name!r}; valid: {list(MU_DTYPES)}")
  return jnp.dtype(name) if name else None


def _base_optimizer(optim_config, schedule, decay_mask) -> optax.GradientTransformation:
  name = optim_config.get("name", "adamw")
  mu_dtype = first_moment_dtype(optim_config)
  if name == "adamw":
    # optax forms each step's moment in float32 from the stored one and the
    # gradient, updates with it, and stores it rounded to mu_dtype.
    return optax.adamw(
      schedule,
      b1=optim_config.b1,
      b2=optim_config.b2,
      eps=optim_config.get("eps", 1e-8),
      weight_decay=optim_config.weight_decay,
      mask=decay_mask,
      mu_dtype=mu_dtype,
    )
  if name == "sgd":
    # torch.optim.SGD (dampening 0, no Nesterov): the decay term joins the
    # gradient before the momentum buffer, whose first value is the gradient.
    return optax.chain(
      optax.add_decayed_weights(optim_config.weight_decay, mask=decay_mask),
      optax.trace(
        decay=optim_config.get("momentum", 0.9), nesterov=False, accumulator_dtype=mu_dtype
      ),
      optax.scale_by_learning_rate(schedule),
    )
  raise errors.ConfigError(f"optim.name={name!r}; valid: {list(OPTIMIZERS)}")


def make_optimizer(
  optim_config, total_steps: int, params: dict, trainable: Callable[[tuple[str, ...]], bool]
) -> tuple[optax.GradientTransformation, optax.Schedule]:
  if total_steps <= 0:
    raise errors.ConfigError(
      f"total_steps={total_steps}: set total_steps > 0, or epochs > 0 with total_steps=0 "
      "(the run length then comes from the data at start-up, data/run_length.py)"
    )
  schedule = learning_rate_schedule(optim_config, total_steps)
  chain = []
  if optim_config.get("grad_clip_norm"):
    chain.append(optax.clip_by_global_norm(optim_config.grad_clip_norm))
  decay_mask = weight_decay_mask(
    params,
    optim_config.get("decay_gains_biases", False),
    optim_config.get("decay_factor_scalars", False),
  )
  chain.append(_base_optimizer(optim_config, schedule, decay_mask))
  tx = optax.chain(*chain)
  labels = jax.tree_util.tree_map_with_path(
    lambda path, _: "train" if trainable(tuple(path_str(path).split("/"))) else "frozen", params
  )
  if all(label == "train" for label in jax.tree.leaves(labels)):
    return tx, schedule
  # Frozen parameters get no optimizer state at all (set_to_zero is stateless).
  return optax.multi_transform({"train": tx, "frozen": optax.set_to_zero()}, labels), schedule
