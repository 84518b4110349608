"""The optimizer: AdamW with MERU's decay mask, warmup-cosine schedule,
optional clipping, and frozen parameters that get no optimizer state."""

from __future__ import annotations

import re
from collections.abc import Callable

import jax
import optax

LEARNED_SCALAR_PATTERN = re.compile(r"(^|/)log_[a-z_]+$")


def path_str(path) -> str:
  return "/".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path)


def weight_decay_mask(params: dict, decay_gains_biases: bool) -> dict:
  """True where AdamW decays.

  MERU's paper disables decay for gains, biases and learned scalars; its code
  (`gain_bias_decay or weight_decay`) in fact decays gains and biases. Both
  are available via `optim.decay_gains_biases`; learned scalars never decay.
  """

  def decide(path, leaf):
    name = path_str(path)
    if LEARNED_SCALAR_PATTERN.search(name):
      return False
    if decay_gains_biases:
      return True
    return leaf.ndim >= 2 and not name.endswith(("bias", "scale"))

  return jax.tree_util.tree_map_with_path(decide, params)


def learning_rate_schedule(optim_config, total_steps: int) -> optax.Schedule:
  kind = optim_config.get("schedule", "cosine")
  if kind == "constant":
    return optax.constant_schedule(optim_config.lr)
  if kind != "cosine":
    raise ValueError(f"optim.schedule={kind!r}; valid: 'cosine', 'constant'")
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


def make_optimizer(
  optim_config, total_steps: int, params: dict, trainable: Callable[[tuple[str, ...]], bool]
) -> tuple[optax.GradientTransformation, optax.Schedule]:
  schedule = learning_rate_schedule(optim_config, total_steps)
  chain = []
  if optim_config.get("grad_clip_norm"):
    chain.append(optax.clip_by_global_norm(optim_config.grad_clip_norm))
  chain.append(
    optax.adamw(
      schedule,
      b1=optim_config.b1,
      b2=optim_config.b2,
      eps=optim_config.get("eps", 1e-8),
      weight_decay=optim_config.weight_decay,
      mask=weight_decay_mask(params, optim_config.get("decay_gains_biases", False)),
    )
  )
  tx = optax.chain(*chain)
  labels = jax.tree_util.tree_map_with_path(
    lambda path, _: "train" if trainable(tuple(path_str(path).split("/"))) else "frozen", params
  )
  if all(label == "train" for label in jax.tree.leaves(labels)):
    return tx, schedule
  # Frozen parameters get no optimizer state at all (set_to_zero is stateless).
  return optax.multi_transform({"train": tx, "frozen": optax.set_to_zero()}, labels), schedule
