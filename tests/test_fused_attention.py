"""Fused attention (jax.nn.dot_product_attention, as the towers call it)
equals the plain softmax(q k^T / sqrt(d)) v path.

On CPU XLA chooses its own implementation; on a GPU the same call may go to
cuDNN: this test pins the function every backend must compute. The plain path
runs in float64. jax.nn.dot_product_attention accumulates its logits in
float32 whatever the input dtype, so the fused side is float32-accurate: with
O(1) logits and outputs of size ~0.1, float32 rounding (6e-8 relative) through
two matmuls and a softmax stays below 1e-7 absolute; we allow 1e-6 relative,
1e-7 absolute (observed: 2e-8). A wrong mask or scale is off by >1e-2.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from hyperbolic_vl.models import transformer


def plain_attention(module, x, allowed):
  """The textbook path: explicit logits, -inf outside `allowed`, softmax."""
  batch, length, width = x.shape
  qkv = module.qkv(x).reshape(batch, length, 3, module.num_heads, module.head_dim)
  q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
  logits = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(module.head_dim)
  probs = jax.nn.softmax(jnp.where(allowed, logits, -jnp.inf), axis=-1)
  return module.out(jnp.einsum("bhqk,bkhd->bqhd", probs, v).reshape(batch, length, width))


@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
@pytest.mark.parametrize("padded", [False, True], ids=["no_mask", "key_padding"])
def test_fused_attention_equals_plain_path_float64(causal, padded):
  with jax.enable_x64(True):
    module = transformer.MultiHeadSelfAttention(
      24, 3, causal=causal, dtype=jnp.float64, param_dtype=jnp.float64, rngs=nnx.Rngs(0)
    )
    module.qkv.bias[...] = jax.random.normal(jax.random.key(1), (72,), jnp.float64)
    x = jax.random.normal(jax.random.key(2), (3, 9, 24), jnp.float64)
    lengths = np.array([9, 6, 2])
    padding = np.arange(9)[None, :] < lengths[:, None] if padded else np.ones((3, 9), bool)
    allowed = np.broadcast_to(padding[:, None, None, :], (3, 3, 9, 9))
    if causal:
      allowed = allowed & np.tril(np.ones((9, 9), bool))
    fused = module(x, mask=jnp.asarray(padding) if padded else None)
    plain = plain_attention(module, x, allowed)
    assert fused.dtype == jnp.float64
    np.testing.assert_allclose(fused, plain, rtol=1e-6, atol=1e-7)
    # Gradients agree as well (the backward pass is where fused kernels differ).
    fused_grad = jax.grad(lambda y: jnp.sum(module(y, mask=padding if padded else None) ** 2))(x)
    plain_grad = jax.grad(lambda y: jnp.sum(plain_attention(module, y, allowed) ** 2))(x)
    np.testing.assert_allclose(fused_grad, plain_grad, rtol=1e-6, atol=1e-6)
