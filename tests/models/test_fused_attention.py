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

from hyperbolic_vl.models import attention


@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
@pytest.mark.parametrize("padded", [False, True], ids=["no_mask", "key_padding"])
def test_fused_attention_equals_plain_path_float64(causal, padded):
  # Float64 models route through attention.plain_attention, so the fused op
  # is called directly here (as float32 towers call it) against that path.
  with jax.enable_x64(True):
    keys = jax.random.split(jax.random.key(2), 3)
    q, k, v = (jax.random.normal(key, (3, 9, 3, 8), jnp.float64) for key in keys)
    lengths = np.array([9, 6, 2])
    padding = np.arange(9)[None, :] < lengths[:, None] if padded else np.ones((3, 9), bool)
    mask = jnp.asarray(padding)[:, None, None, :] if padded else None

    def fused(q, k, v):
      return jax.nn.dot_product_attention(q, k, v, mask=mask, is_causal=causal)

    def plain(q, k, v):
      return attention.plain_attention(q, k, v, mask=mask, is_causal=causal)

    np.testing.assert_allclose(fused(q, k, v), plain(q, k, v), rtol=1e-6, atol=1e-7)
    # Gradients agree as well (the backward pass is where fused kernels differ).
    loss = lambda f: lambda q, k, v: jnp.sum(f(q, k, v) ** 2)
    fused_grads = jax.grad(loss(fused), argnums=(0, 1, 2))(q, k, v)
    plain_grads = jax.grad(loss(plain), argnums=(0, 1, 2))(q, k, v)
    for got, expected in zip(fused_grads, plain_grads):
      np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)
