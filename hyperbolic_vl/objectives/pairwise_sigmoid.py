"""The pairwise sigmoid loss (SigLIP, Zhai et al. 2023) on any pairwise logits.

Every (image i, text j) pair of the global batch is its own binary problem:
the positive pairs (i == j) should score high, every other pair low,

  L = (1 / B) sum_ij -log sigmoid(y_ij z_ij),  y_ij = +1 if i == j else -1,
  z_ij = logits_fn(image_i, text_j) (already scaled and biased).

With -log sigmoid(-z) = softplus(z) and softplus(-z) = softplus(z) - z this is

  L = (1 / B) [ sum_ij softplus(z_ij) - sum_i z_ii ]:

every pair scored as a negative, then each positive's own logit subtracted
(open_clip's chunked SigLipLoss uses the same identity). No label matrix is
needed, and the pair sum splits into column blocks freely. SigLIP's logits
are t * cos + b (CLIP); here they may be any pairwise score, e.g. MERU's
-s * d_L(x, y) + b. The sum covers every pair once (the loss is symmetric in
its two modalities: no second direction). Each device returns its local
rows' sum over all columns over its b rows; the mean over devices (the
trainer's pmean) is L.

Nothing is normalised over a row, so the columns need not all be present at
once. Two ways of visiting them give the same loss and gradients:

  gathered: all-gather the text columns (`base.gather_columns`) and score
    them against the local rows, as the softmax losses do.
  ring: each device scores its own texts, then passes its current text
    block to the next device (`jax.lax.ppermute`) and scores what it
    received, D - 1 times: no (B, D) gather, (b, b) blocks. The loop body is
    rematerialised, so the backward pass keeps only the block each step
    received and passes the blocks around again.

Either way `chunk_size` > 0 scores the columns in (b, chunk_size) blocks
(`chunked.blockwise_sum`), so no wider logits block is ever live.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from hyperbolic_vl import errors
from hyperbolic_vl.objectives import base, chunked
from hyperbolic_vl.objectives import settings as settings_lib

COLUMN_VISITS = ("gathered", "ring")
PAIRWISE_LOSSES = ("softmax", "sigmoid")

LogitsFn = Callable[[jax.Array, jax.Array, Any], jax.Array]


def negatives_sum(
  logits_fn: LogitsFn, params: Any, rows: jax.Array, columns: jax.Array, chunk_size: int = 0
) -> jax.Array:
  """sum_ij softplus(logits_fn(rows, columns)_ij): every pair scored as a negative."""

  def block_sum(block, valid):
    terms = jax.nn.softplus(logits_fn(rows, block, params))
    return jnp.sum(jnp.where(valid[None, :], terms, 0))

  return chunked.blockwise_sum(block_sum, columns, chunk_size)


def ring_size(axis_name) -> int:
  """Devices along `axis_name` (a name or a tuple of names, as under fsdp)."""
  if axis_name is None:
    return 1
  names = axis_name if isinstance(axis_name, tuple) else (axis_name,)
  size = 1
  for name in names:
    size *= jax.lax.axis_size(name)
  return size


def ring_sum(block_fn: Callable, columns: jax.Array, axis_name):
  """sum over every device's column block of block_fn(block), own block first.

  Blocks travel around the ring of all devices along `axis_name` (for a
  tuple of axes, their row-major linear order, as `axis_index` numbers
  them): after step k a device holds the block of the device k before it.
  The scan body is rematerialised, so differentiating keeps one received
  block per step and no logits.
  """
  total = block_fn(columns)
  num_devices = ring_size(axis_name)
  if num_devices == 1:
    return total
  to_next = [(source, (source + 1) % num_devices) for source in range(num_devices)]

  @jax.checkpoint
  def visit(carry, _):
    block, total = carry
    block = jax.lax.ppermute(block, axis_name, to_next)
    total = jax.tree.map(jnp.add, total, block_fn(block))
    return (block, total), None

  (_, total), _ = jax.lax.scan(visit, (columns, total), None, length=num_devices - 1)
  return total


def sigmoid_contrastive(
  logits_fn: LogitsFn,
  params: Any,
  image: jax.Array,
  text: jax.Array,
  axis_name,
  *,
  columns: str = "gathered",
  chunk_size: int = 0,
  all_text: jax.Array | None = None,
) -> jax.Array:
  """SigLIP's loss of the local images against every text of the global batch.

  image, text: (b, D) this device's pairs; `all_text`: the gathered texts
  when the caller has them already (columns="gathered").
  """
  if chunk_size < 0:
    raise ValueError(f"logit_chunk_size must be >= 0, got {chunk_size}")
  if columns == "ring":
    negatives = ring_sum(
      lambda block: negatives_sum(logits_fn, params, image, block, chunk_size), text, axis_name
    )
  elif columns == "gathered":
    if all_text is None:
      all_text = base.gather_columns(text, axis_name)
    negatives = negatives_sum(logits_fn, params, image, all_text, chunk_size)
  else:
    raise errors.ConfigError(f"objective.sigmoid_columns={columns!r}; valid: {COLUMN_VISITS}")
  positives = jnp.sum(chunked.paired_logits(logits_fn, image, text, params))
  return (negatives - positives) / image.shape[0]


def check_settings(settings) -> None:
  """The checks of an objective offering `pairwise_loss` (its Settings' __post_init__)."""
  settings_lib.check_choice(settings, "pairwise_loss", PAIRWISE_LOSSES)
  settings_lib.check_choice(settings, "sigmoid_columns", COLUMN_VISITS)


def check_model_config(settings, model_config) -> None:
  """A learned logit bias exactly when the sigmoid loss is on."""
  bias_init = dict(model_config).get("logit_bias_init")
  if settings.pairwise_loss == "sigmoid" and bias_init is None:
    raise errors.ConfigError(
      "objective.pairwise_loss='sigmoid' learns a logit bias: set model.logit_bias_init "
      "(SigLIP: -10, with model.logit_scale_init=10)"
    )
  if settings.pairwise_loss != "sigmoid" and bias_init is not None:
    raise errors.ConfigError(
      f"model.logit_bias_init={bias_init} adds a logit bias only the sigmoid loss uses "
      "(objective.pairwise_loss='sigmoid')"
    )
