"""The attention kernels the transformer's self-attention calls: cuDNN's
fused attention on GPUs (sequences padded to the lengths it takes, falling
back to XLA's with one logged reason), XLA's elsewhere, and on CPUs a
softmax attention with hand-written gradients (`models/cpu_gradients.py`).
Which one runs is chosen for the platform being compiled for
(`compile_target`), not the host's.
"""

from __future__ import annotations

import logging

import jax
import jax.numpy as jnp

from hyperbolic_vl.models import compile_target, cpu_gradients

# cuDNN's fused (flash) attention kernel takes half-precision operands and
# head widths that are multiples of 8 up to 128 (jax.nn.dot_product_attention).
CUDNN_DTYPES = (jnp.bfloat16, jnp.float16)
CUDNN_MAX_HEAD_DIM = 128
# Compiled for an H100 (jax 0.10.2, cuDNN 9), the kernel took sequence
# lengths 208, 80 and 256 and refused 197 and 77 (ViT-B/16's and the text
# tower's), as it did on an H200: sequences go to it padded to a multiple.
CUDNN_SEQUENCE_MULTIPLE = 16
_fallbacks_logged: set[str] = set()


def padded_attention(
  query,
  key,
  value,
  *,
  mask=None,
  is_causal=False,
  implementation="cudnn",
  multiple=None,
  attend=None,
) -> jax.Array:
  """`jax.nn.dot_product_attention` on (B, L, H, d) operands padded along L
  to a multiple of `multiple` (default CUDNN_SEQUENCE_MULTIPLE): the padded
  keys are masked out (`key_value_seq_lengths`, cuDNN's own padding mask),
  the padded query rows dropped, so the result is the unpadded operands'
  (with a causal mask too: a real row never sees the padding after it).
  `attend(q, k, v, mask=, is_causal=)` in place of jax's function gets the
  lengths folded into `mask` (the float64 reference in the tests)."""
  multiple = multiple or CUDNN_SEQUENCE_MULTIPLE
  q_length, kv_length = query.shape[1], key.shape[1]
  q_pad, kv_pad = -q_length % multiple, -kv_length % multiple
  if not q_pad and not kv_pad and attend is None:
    return jax.nn.dot_product_attention(
      query, key, value, mask=mask, is_causal=is_causal, implementation=implementation
    )
  pad = lambda x, n: jnp.pad(x, ((0, 0), (0, n), (0, 0), (0, 0)))
  if mask is not None:
    # (B|1, H|1, Lq|1, Lk|1): padded query rows may see every real key;
    # padded keys are hidden by their lengths.
    mask = jnp.asarray(mask, bool)
    rows = q_pad if mask.shape[2] > 1 else 0
    columns = kv_pad if mask.shape[3] > 1 else 0
    mask = jnp.pad(mask, ((0, 0), (0, 0), (0, rows), (0, columns)), constant_values=True)
  query, key, value = pad(query, q_pad), pad(key, kv_pad), pad(value, kv_pad)
  if attend is not None:
    real_keys = (jnp.arange(kv_length + kv_pad) < kv_length)[None, None, None, :]
    mask = real_keys if mask is None else mask & real_keys
    return attend(query, key, value, mask=mask, is_causal=is_causal)[:, :q_length]
  batch = query.shape[0]
  attended = jax.nn.dot_product_attention(
    query,
    key,
    value,
    mask=mask,
    is_causal=is_causal,
    query_seq_lengths=jnp.full((batch,), q_length, jnp.int32),
    key_value_seq_lengths=jnp.full((batch,), kv_length, jnp.int32),
    implementation=implementation,
  )
  return attended[:, :q_length]


def _log_fallback_once(reason: str) -> None:
  if reason not in _fallbacks_logged:
    _fallbacks_logged.add(reason)
    logging.warning("attention: %s; using XLA's attention", reason)


def automatic_attention(query, key, value, *, mask=None, is_causal=False) -> jax.Array:
  """`model.attention_implementation=None`: cuDNN's fused attention on GPUs
  where the operands allow it, else XLA's; each reason for falling back is
  logged once. On CPUs `plain_attention`; on TPUs XLA's (jax's own choice)."""
  if compile_target.platform() == "cpu":
    return plain_attention(query, key, value, mask=mask, is_causal=is_causal)
  if compile_target.platform() != "gpu":
    return jax.nn.dot_product_attention(query, key, value, mask=mask, is_causal=is_causal)
  head_dim = query.shape[-1]
  reason = None
  if query.dtype not in CUDNN_DTYPES:
    reason = f"cuDNN attention needs bfloat16/float16 towers, these compute in {query.dtype}"
  elif head_dim % 8 or head_dim > CUDNN_MAX_HEAD_DIM:
    reason = f"cuDNN attention needs a head width that is a multiple of 8 up to 128, not {head_dim}"
  if reason is None:
    try:
      return padded_attention(query, key, value, mask=mask, is_causal=is_causal)
    except (RuntimeError, ValueError, NotImplementedError) as error:
      reason = f"cuDNN attention is unavailable here ({str(error).splitlines()[0][:160]})"
  _log_fallback_once(reason)
  return jax.nn.dot_product_attention(
    query, key, value, mask=mask, is_causal=is_causal, implementation="xla"
  )


def plain_attention(query, key, value, *, mask=None, is_causal=False) -> jax.Array:
  """softmax(q k^T / sqrt(d) + masks) v with (B, L, H, d) operands, computed
  in the operands' dtype (at least float32); the reference the fused
  `jax.nn.dot_product_attention` must match, and what CPUs run."""
  dtype = query.dtype
  compute = jnp.promote_types(query.dtype, jnp.float32)
  # Heads moved ahead of the sequence once, so that both products and the
  # softmax's reductions (and their transposes in the backward pass) are
  # plain batched (B, H) matrix products over contiguous rows; contracting
  # the (B, L, H, d) operands directly made XLA:CPU transpose around each.
  query, key, value = (jnp.swapaxes(x.astype(compute), 1, 2) for x in (query, key, value))
  allowed = jnp.ones((1, 1, query.shape[2], key.shape[2]), bool)
  if is_causal:
    allowed = allowed & jnp.tril(jnp.ones(allowed.shape[2:], bool))
  if mask is not None:
    allowed = allowed & mask
  attended = cpu_gradients.softmax_attention(query, key, value, allowed)
  return jnp.swapaxes(attended, 1, 2).astype(dtype)
