"""Gradients written out for XLA:CPU, each equal to autodiff's (float64,
tests/models/test_cpu_backward.py and tests/models/test_towers.py) but
shaped so that XLA:CPU neither copies nor recomputes what autodiff's form
made it: the dense layers' weight gradient, LayerNorm's, softmax
attention's, and a barrier that stores the residual stream's gradient.
`models/transformer.py` routes to them on a CPU only; GPUs and TPUs keep
autodiff's. Why each costs less: docs/performance.md."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp


def varying_axes(x: jax.Array) -> frozenset:
  # Mesh axes that a value inside shard_map is typed as varying over (the
  # attribute moved between jax versions); empty outside shard_map.
  aval = jax.typeof(x)
  if hasattr(aval, "vma"):
    return frozenset(aval.vma)
  mat = getattr(aval, "mat", None)
  return frozenset(mat.varying) if mat is not None else frozenset()


def _cast_to_varying(operand: jax.Array, axes: frozenset) -> jax.Array:
  missing = tuple(sorted(axes - varying_axes(operand)))
  return jax.lax.pcast(operand, missing, to="varying") if missing else operand


def common_varying(*operands: jax.Array) -> tuple[jax.Array, ...]:
  """The operands, each cast to vary over the union of their mesh axes.

  Inside the step's shard_map the params are typed as replicated (or, with
  mesh.fsdp, as varying over the fsdp axis once gathered) and the
  activations as varying over the batch axes; a custom_vjp must return each
  gradient typed like its input, and the cotangent varies over all of them,
  so every operand enters it varying over the union (for the params this
  cast's transpose, a sum over the devices, is what autodiff inserts
  anyway)."""
  union = frozenset().union(*(varying_axes(operand) for operand in operands))
  return tuple(_cast_to_varying(operand, union) for operand in operands)


def contract_last(x: jax.Array, kernel: jax.Array) -> jax.Array:
  return jax.lax.dot_general(x, kernel, (((x.ndim - 1,), (0,)), ((), ())))


@jax.custom_vjp
def linear(x: jax.Array, kernel: jax.Array, bias: jax.Array) -> jax.Array:
  """x @ kernel + bias over x's last axis; the gradient is autodiff's, only
  the weight gradient's product is written differently (`_linear_bwd`)."""
  return contract_last(x, kernel) + bias


def _linear_fwd(x, kernel, bias):
  return linear(x, kernel, bias), (x, kernel)


def _linear_bwd(residuals, cotangent):
  x, kernel = residuals
  dx = jax.lax.dot_general(cotangent, kernel, (((cotangent.ndim - 1,), (1,)), ((), ())))
  rows = x.reshape(-1, x.shape[-1])
  cotangent_rows = cotangent.reshape(-1, cotangent.shape[-1])
  # The weight gradient as (cotangent^T x)^T, not x^T cotangent: autodiff's
  # form makes XLA:CPU copy the cotangent into a transposed layout for its
  # matmul, and the cotangent is usually a long fused chain (GELU's and the
  # LayerNorms' backward, the residual sums) that the copy recomputes, once
  # per consumer. With the cotangent as the left operand both operands are
  # read as they are stored, and only the small (out, in) result is
  # transposed. Same products and sums, so the same gradient.
  kernel_t = jax.lax.dot_general(cotangent_rows, rows, (((0,), (0,)), ((), ())))
  return dx, kernel_t.T, cotangent_rows.sum(axis=0)


linear.defvjp(_linear_fwd, _linear_bwd)


# LayerNorm over the last axis with the gradient written out: dx =
# rstd (g' - mean(g') - x_hat mean(g' x_hat)) with g' = g * scale, two row
# reductions, where autodiff of the two-pass variance reduced (and
# re-broadcast) once per term it chains through. Same forward operations,
# in the same order, as nnx.LayerNorm's.
@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def normalized_rows(x, scale, bias, epsilon):
  return _normalized_rows_fwd(x, scale, bias, epsilon)[0]


def _normalized_rows_fwd(x, scale, bias, epsilon):
  mean = jnp.mean(x, axis=-1, keepdims=True)
  centered = x - mean
  rstd = jax.lax.rsqrt(jnp.mean(centered * centered, axis=-1, keepdims=True) + epsilon)
  return centered * (rstd * scale) + bias, (centered, rstd, scale)


def _normalized_rows_bwd(epsilon, residuals, cotangent):
  del epsilon
  centered, rstd, scale = residuals
  normalized = centered * rstd
  width = cotangent.shape[-1]
  cotangent_rows = cotangent.reshape(-1, width)
  scale_grad = jnp.sum(cotangent_rows * normalized.reshape(-1, width), axis=0)
  bias_grad = jnp.sum(cotangent_rows, axis=0)
  scaled = cotangent * scale
  x_grad = rstd * (
    scaled
    - jnp.mean(scaled, axis=-1, keepdims=True)
    - normalized * jnp.mean(scaled * normalized, axis=-1, keepdims=True)
  )
  return x_grad, scale_grad, bias_grad


normalized_rows.defvjp(_normalized_rows_fwd, _normalized_rows_bwd)


# The gradient is autodiff's, written out: the backward pass reuses the
# stored attention weights where autodiff's recomputed the softmax's
# exponentials. The softmax's row sums stay sum_k P dP, as autodiff forms
# them: dO . O is the same sum in exact arithmetic, but its rounding left the
# logits' gradient rows summing to ~1e-16 instead of cancelling, noise that
# AdamW turns into visible updates of the key biases (whose exact gradient
# is zero; tests/train/test_fsdp.py).
@jax.custom_vjp
def softmax_attention(query, key, value, allowed):
  return _softmax_attention_fwd(query, key, value, allowed)[0]


def _softmax_attention_fwd(query, key, value, allowed):
  """(B, H, L, d) operands, `allowed` broadcastable to (B, H, L, L)."""
  logits = jnp.einsum("bhqd,bhkd->bhqk", query, key)
  logits = logits / jnp.sqrt(jnp.asarray(query.shape[-1], query.dtype))
  logits = jnp.where(allowed, logits, jnp.finfo(query.dtype).min)
  weights = jax.nn.softmax(logits, axis=-1)
  attended = jnp.einsum("bhqk,bhkd->bhqd", weights, value)
  return attended, (query, key, value, allowed, weights)


def _softmax_attention_bwd(residuals, cotangent):
  query, key, value, allowed, weights = residuals
  value_grad = jnp.einsum("bhqk,bhqd->bhkd", weights, cotangent)
  weights_grad = jnp.einsum("bhqd,bhkd->bhqk", cotangent, value)
  row_sums = jnp.sum(weights * weights_grad, axis=-1, keepdims=True)
  logits_grad = weights * (weights_grad - row_sums)
  # Masked logits were replaced by a constant: no gradient reaches them (a
  # row with every key masked has uniform, non-zero weights).
  logits_grad = jnp.where(allowed, logits_grad, 0)
  logits_grad = logits_grad / jnp.sqrt(jnp.asarray(query.shape[-1], query.dtype))
  query_grad = jnp.einsum("bhqk,bhkd->bhqd", logits_grad, key)
  key_grad = jnp.einsum("bhqk,bhqd->bhkd", logits_grad, query)
  return query_grad, key_grad, value_grad, None


softmax_attention.defvjp(_softmax_attention_fwd, _softmax_attention_bwd)


@jax.custom_vjp
def stored_cotangent(x: jax.Array) -> jax.Array:
  return x


def _stored_cotangent_fwd(x):
  return x, None


def _stored_cotangent_bwd(_, cotangent):
  return (jax.lax.optimization_barrier(cotangent),)


stored_cotangent.defvjp(_stored_cotangent_fwd, _stored_cotangent_bwd)
