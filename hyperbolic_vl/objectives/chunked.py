"""Contrastive cross-entropy for huge global batches, in column blocks.

The N-pair loss of CLIP/MERU needs, per device, the log-sum-exp of every
local row's logits against all B gathered columns. Written plainly that is a
(b, B) logits matrix per direction, plus its softmax for the backward pass:
at a 64k global batch on 8 devices, 8k x 64k float32 = 2 GiB each. Here the
columns are visited in blocks of `chunk` with a streaming (online) log-sum-exp,
and the backward pass is a custom VJP that recomputes each (b, chunk) block
and its softmax from the saved (b,) log-sum-exp. No more than one
(b, chunk) block of logits (and its cotangent) is live at a time.

The logits are any differentiable function of a row block, a column block and
a pytree of parameters (logit scale, curvature, ...):

  logits_fn(rows (b, D), columns (c, D), params) -> (b, c)

so the same code serves cosine logits (CLIP), negative Lorentz distances
(MERU) or any other pairwise score. `chunk_size=0` keeps the plain
materialised path, which is also the reference the chunked one is tested
against.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from hyperbolic_vl.objectives import base

LogitsFn = Callable[[jax.Array, jax.Array, Any], jax.Array]


def _padded_columns(columns: jax.Array, chunk: int) -> tuple[jax.Array, int, int]:
  """(B, ...) -> (num_blocks * chunk, ...) columns, B and num_blocks.

  A ragged last block is filled with copies of column 0, so the padded logits
  are as finite as any real one; they are masked out of every sum. Blocks are
  then sliced by index inside the loops (no stacked copy of the columns).
  """
  num_columns = columns.shape[0]
  num_blocks = -(-num_columns // chunk)
  pad = num_blocks * chunk - num_columns
  if pad:
    filler = jnp.broadcast_to(columns[:1], (pad, *columns.shape[1:]))
    columns = jnp.concatenate([columns, filler], axis=0)
  return columns, num_columns, num_blocks


def _block(columns: jax.Array, index, chunk: int) -> jax.Array:
  return jax.lax.dynamic_slice_in_dim(columns, index * chunk, chunk, axis=0)


def _block_logits(logits_fn, rows, block, params, block_index, num_columns):
  logits = logits_fn(rows, block, params)
  chunk = block.shape[0]
  valid = block_index * chunk + jnp.arange(chunk) < num_columns
  return jnp.where(valid[None, :], logits, -jnp.inf)


def _streaming_logsumexp(logits_fn, chunk, rows, columns, params):
  columns, num_columns, num_blocks = _padded_columns(columns, chunk)

  def block_stats(index):
    block = _block(columns, index, chunk)
    logits = _block_logits(logits_fn, rows, block, params, index, num_columns)
    block_max = logits.max(axis=1)
    return block_max, jnp.sum(jnp.exp(logits - block_max[:, None]), axis=1)

  def visit(carry, index):
    running_max, running_sum = carry
    block_max, block_sum = block_stats(index)
    new_max = jnp.maximum(running_max, block_max)
    running_sum = running_sum * jnp.exp(running_max - new_max) + block_sum * jnp.exp(
      block_max - new_max
    )
    return (new_max, running_sum), None

  # The first block (always holding a real column) seeds the carry, so the
  # carry has the same type as the body's output, shard_map's per-axis
  # variance included, whatever the inputs' variance is.
  init = block_stats(0)
  (running_max, running_sum), _ = jax.lax.scan(visit, init, jnp.arange(1, num_blocks))
  return running_max + jnp.log(running_sum)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def chunked_logsumexp(
  logits_fn: LogitsFn, chunk: int, rows: jax.Array, columns: jax.Array, params: Any
) -> jax.Array:
  """log sum_j exp(logits_fn(rows, columns, params))[i, j] per row, shape (b,)."""
  return _streaming_logsumexp(logits_fn, chunk, rows, columns, params)


def _chunked_logsumexp_fwd(logits_fn, chunk, rows, columns, params):
  lse = _streaming_logsumexp(logits_fn, chunk, rows, columns, params)
  return lse, (rows, columns, params, lse)


def _chunked_logsumexp_bwd(logits_fn, chunk, residuals, lse_cotangent):
  # d lse_i / d logits_ij = softmax_ij = exp(logits_ij - lse_i): recompute each
  # block, weight its softmax by the incoming cotangent and pull it back
  # through logits_fn; row and parameter gradients accumulate over blocks,
  # column gradients come out block by block.
  rows, columns, params, lse = residuals
  padded, num_columns, num_blocks = _padded_columns(columns, chunk)

  def block_grads(index):
    logits, pullback = jax.vjp(
      lambda r, c, p: _block_logits(logits_fn, r, c, p, index, num_columns),
      rows,
      _block(padded, index, chunk),
      params,
    )
    weights = jnp.exp(logits - lse[:, None]) * lse_cotangent[:, None]
    return pullback(weights.astype(logits.dtype))

  def visit(carry, index):
    rows_grad, columns_grad, params_grad = carry
    d_rows, d_block, d_params = block_grads(index)
    columns_grad = jax.lax.dynamic_update_slice_in_dim(columns_grad, d_block, index * chunk, 0)
    params_grad = jax.tree.map(jnp.add, params_grad, d_params)
    return (rows_grad + d_rows, columns_grad, params_grad), None

  # Seeded with the first block for the same reason as the forward pass; the
  # column gradient is one buffer updated in place, block by block.
  rows_grad, first_block_grad, params_grad = block_grads(0)
  columns_grad = jnp.zeros_like(padded).at[:chunk].set(first_block_grad)
  (rows_grad, columns_grad, params_grad), _ = jax.lax.scan(
    visit, (rows_grad, columns_grad, params_grad), jnp.arange(1, num_blocks)
  )
  return rows_grad, columns_grad[:num_columns], params_grad


chunked_logsumexp.defvjp(_chunked_logsumexp_fwd, _chunked_logsumexp_bwd)


def paired_logits(logits_fn: LogitsFn, rows: jax.Array, partners: jax.Array, params) -> jax.Array:
  """logits_fn(rows[i], partners[i]) for each i, shape (b,), without a (b, b) matrix."""
  return jax.vmap(lambda r, c: logits_fn(r[None], c[None], params)[0, 0])(rows, partners)


def cross_entropy(
  logits_fn: LogitsFn,
  rows: jax.Array,
  columns: jax.Array,
  positives: jax.Array,
  params: Any,
  chunk_size: int,
) -> jax.Array:
  """Mean over rows of  lse_j logits(r_i, c_j) - logits(r_i, p_i).

  `positives[i]` is row i's positive column (it must also be among `columns`,
  as each device's own rows are in the all-gathered columns).
  """
  lse = chunked_logsumexp(logits_fn, int(chunk_size), rows, columns, params)
  return jnp.mean(lse - paired_logits(logits_fn, rows, positives, params))


def symmetric_contrastive(
  logits_fn: LogitsFn,
  params: Any,
  image: jax.Array,
  text: jax.Array,
  all_image: jax.Array,
  all_text: jax.Array,
  axis_name: str | None,
  chunk_size: int = 0,
) -> jax.Array:
  """(CE(image -> all texts) + CE(text -> all images)) / 2 over local rows.

  image, text: (b, D) this device's pairs; all_image, all_text: (B, D) the
  gathered columns (`base.gather_columns`). chunk_size=0 materialises the
  two (b, B) logits matrices; chunk_size > 0 never holds more than one
  (b, chunk_size) block of them.
  """
  if chunk_size < 0:
    raise ValueError(f"logit_chunk_size must be >= 0, got {chunk_size}")
  if not chunk_size:
    return base.symmetric_contrastive(
      logits_fn(image, all_text, params), logits_fn(text, all_image, params), axis_name
    )
  image_to_text = cross_entropy(logits_fn, image, all_text, text, params, chunk_size)
  text_to_image = cross_entropy(logits_fn, text, all_image, image, params, chunk_size)
  return 0.5 * (image_to_text + text_to_image)


def blockwise_sum(
  block_sum: Callable[[jax.Array, jax.Array], jax.Array], columns: jax.Array, chunk_size: int
) -> jax.Array:
  """sum over column blocks of block_sum(block (chunk, ...), valid (chunk,) bool),
  differentiable; chunk_size=0 (or wider than the columns): one call on all.

  For losses that are plain sums over pairs (the sigmoid loss), so no
  streaming normaliser is needed: each block's terms are recomputed in the
  backward pass (a rematerialised scan), so at most one block's logits and
  cotangents are live. `block_sum` must ignore the entries of a padded last
  block where `valid` is False.
  """
  num_columns = columns.shape[0]
  if not chunk_size or chunk_size >= num_columns:
    return block_sum(columns, jnp.ones((num_columns,), bool))
  padded, num_columns, num_blocks = _padded_columns(columns, chunk_size)

  @jax.checkpoint
  def one_block(index):
    valid = index * chunk_size + jnp.arange(chunk_size) < num_columns
    return block_sum(_block(padded, index, chunk_size), valid)

  def visit(total, index):
    return total + one_block(index), None

  # Seeded with the first block, as the streaming log-sum-exp is (its type,
  # shard_map's variance included, is the body's).
  total, _ = jax.lax.scan(visit, one_block(0), jnp.arange(1, num_blocks))
  return total


def blockwise_mean(
  score_fn: Callable[[jax.Array, jax.Array], jax.Array],
  rows: jax.Array,
  columns: jax.Array,
  chunk_size: int,
) -> jax.Array:
  """mean_ij score_fn(rows, columns)[i, j] in (b, chunk) blocks; no gradient.

  For monitoring figures over all pairs (e.g. MERU's clamped fraction) that
  would otherwise bring back the (b, B) matrix the chunked loss avoids.
  """
  rows, columns = jax.lax.stop_gradient((rows, columns))
  if not chunk_size:
    return jnp.mean(score_fn(rows, columns))
  columns, num_columns, num_blocks = _padded_columns(columns, chunk_size)

  def block_sum(index):
    valid = index * chunk_size + jnp.arange(chunk_size) < num_columns
    scores = score_fn(rows, _block(columns, index, chunk_size))
    return jnp.sum(jnp.where(valid[None, :], scores, 0))

  sums = jax.lax.map(block_sum, jnp.arange(num_blocks))
  return jnp.sum(sums) / (rows.shape[0] * num_columns)
