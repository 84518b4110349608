"""cuDNN's fused attention takes sequences padded to a multiple of 16
(`attention.padded_attention`; it refused ViT-B/16's 197 and the text
tower's 77 tokens): padded, masked and sliced, attention and whole towers
equal the unpadded ones in float64 on CPU."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tiny_fixtures

from hyperbolic_vl.models import attention, transformer


def operands(length, seed=0):
  keys = jax.random.split(jax.random.key(seed), 3)
  return tuple(jax.random.normal(k, (3, length, 2, 8), jnp.float64) for k in keys)


@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
@pytest.mark.parametrize("masked", [False, True], ids=["no_mask", "key_padding"])
def test_padded_attention_equals_unpadded_float64(causal, masked):
  """Values and gradients: the padding changes nothing but rounding (float64:
  agreement to 1e-12; a padded key that leaked in moves them by ~1e-1)."""
  with jax.enable_x64(True):
    q, k, v = operands(13)
    mask = None
    if masked:
      lengths = np.array([13, 7, 3])
      mask = jnp.asarray(np.arange(13)[None, :] < lengths[:, None])[:, None, None, :]

    def padded(q, k, v):
      return attention.padded_attention(
        q, k, v, mask=mask, is_causal=causal, multiple=16, attend=attention.plain_attention
      )

    def plain(q, k, v):
      return attention.plain_attention(q, k, v, mask=mask, is_causal=causal)

    # Values and gradients from one compiled function per side.
    def value_and_grads(f):
      loss = lambda q, k, v: jnp.sum(jnp.sin(f(q, k, v)))
      return jax.jit(lambda q, k, v: (f(q, k, v), jax.grad(loss, argnums=(0, 1, 2))(q, k, v)))

    got = jax.tree.leaves(value_and_grads(padded)(q, k, v))
    expected = jax.tree.leaves(value_and_grads(plain)(q, k, v))
    for g, e in zip(got, expected, strict=True):
      np.testing.assert_allclose(g, e, rtol=0, atol=1e-12)


@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
def test_the_kernels_padding_lengths_equal_unpadded(causal):
  """The call the GPU makes (lengths as jax's `*_seq_lengths`, here on XLA's
  implementation): float32 logits whatever the input, so float32-accurate as
  in test_fused_attention.py (1e-6 relative, 1e-7 absolute)."""
  with jax.enable_x64(True):
    q, k, v = operands(13, seed=1)
    got = attention.padded_attention(q, k, v, is_causal=causal, implementation="xla")
    expected = attention.plain_attention(q, k, v, is_causal=causal)
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-7)


@pytest.mark.slow
def test_towers_with_padded_attention_equal_unpadded_float64(monkeypatch):
  """Both tiny towers in float64 with every attention padded to 16 (their
  sequences are 5 and 8 long) against the same towers unpadded."""
  with jax.enable_x64(True):
    model_def, params = tiny_fixtures.tiny_two_towers(seed=3, dtype="float64")
    params = tiny_fixtures.as_float64(params)
    batch = tiny_fixtures.random_batch(4, seed=5)

    def embed(params, images, tokens):
      model = model_def.merge(params)
      return model.encode_image(images), model.encode_text(tokens)

    inputs = (params, jnp.asarray(batch["image"]), jnp.asarray(batch["tokens"]))
    unpadded = jax.jit(embed)(*inputs)

    def padded(self, query, key, value, mask, causal):
      return attention.padded_attention(
        query, key, value, mask=mask, is_causal=causal, attend=attention.plain_attention
      )

    monkeypatch.setattr(transformer.MultiHeadSelfAttention, "_attend", padded)
    for got, expected in zip(jax.jit(embed)(*inputs), unpadded, strict=True):
      assert got.dtype == jnp.float64
      np.testing.assert_allclose(got, expected, rtol=0, atol=1e-12)
