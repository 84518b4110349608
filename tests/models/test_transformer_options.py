"""Transformer options: `model.attention_implementation=None` (cuDNN's fused
attention on GPUs where it applies, XLA's otherwise, each fallback logged
once) and the three GELUs of `model.activation`."""

import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from hyperbolic_vl import errors
from hyperbolic_vl.models import attention, transformer


def _operands(dtype, head_dim=16):
  keys = jax.random.split(jax.random.key(0), 3)
  return [jax.random.normal(k, (2, 7, 4, head_dim), jnp.float32).astype(dtype) for k in keys]


def test_cpu_takes_plain_attention_silently(caplog):
  # On a CPU the explicit heads-first softmax (faster there), equal to jax's.
  query, key, value = _operands(jnp.float32)
  with caplog.at_level(logging.WARNING):
    out = attention.automatic_attention(query, key, value, is_causal=True)
  expected = jax.nn.dot_product_attention(query, key, value, is_causal=True, implementation="xla")
  # float32 softmax attention two ways: rounding only (|x| ~ 1, 16 terms).
  np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)
  assert not caplog.records


@pytest.mark.parametrize(
  ("dtype", "head_dim", "reason"),
  [
    (jnp.float32, 16, "needs bfloat16/float16 towers"),
    (jnp.bfloat16, 12, "multiple of 8 up to 128, not 12"),
    # On this CPU the kernel itself cannot run: the fallback catches it.
    (jnp.bfloat16, 16, "cuDNN attention is unavailable here"),
  ],
)
def test_on_a_gpu_each_fallback_is_logged_once_and_equals_xla(
  monkeypatch, caplog, dtype, head_dim, reason
):
  monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
  monkeypatch.setattr(attention, "_fallbacks_logged", set())
  query, key, value = _operands(dtype, head_dim)
  with caplog.at_level(logging.WARNING):
    first = attention.automatic_attention(query, key, value, is_causal=True)
    attention.automatic_attention(query, key, value, is_causal=True)
  messages = [r.getMessage() for r in caplog.records if "attention" in r.getMessage()]
  assert len(messages) == 1 and reason in messages[0], messages
  expected = jax.nn.dot_product_attention(query, key, value, is_causal=True, implementation="xla")
  np.testing.assert_array_equal(first, expected)


def test_activation_choices_are_the_three_gelus():
  x = jnp.linspace(-6.0, 6.0, 1001, dtype=jnp.float32)
  exact = 0.5 * x * (1.0 + jax.scipy.special.erf(x / jnp.sqrt(2.0)))
  tanh = 0.5 * x * (1.0 + jnp.tanh(jnp.sqrt(2.0 / jnp.pi) * (x + 0.044715 * x**3)))
  np.testing.assert_allclose(transformer.activation_fn("gelu")(x), exact, atol=1e-6)
  np.testing.assert_allclose(transformer.activation_fn("gelu_tanh")(x), tanh, atol=1e-6)
  np.testing.assert_allclose(
    transformer.activation_fn("quick_gelu")(x), x * jax.nn.sigmoid(1.702 * x), atol=1e-7
  )
  # The tanh form is an approximation: close, not equal (max gap ~5e-4).
  gap = float(jnp.max(jnp.abs(tanh - exact)))
  assert 1e-4 < gap < 1e-3
  with pytest.raises(ValueError, match="activation='relu'"):
    transformer.activation_fn("relu")


def test_an_explicit_cudnn_request_the_kernel_refuses_is_one_config_line():
  # Here the kernel refuses because there is no cuDNN; on an H200 jax 0.11
  # refused ViT-B/16's 197 tokens the same way (a NotImplementedError).
  attention = transformer.MultiHeadSelfAttention(
    64, 4, attention_implementation="cudnn", dtype=jnp.bfloat16, rngs=nnx.Rngs(0)
  )
  with pytest.raises(errors.ConfigError, match=r"attention_implementation='cudnn' cannot run"):
    attention(jnp.ones((2, 7, 64), jnp.bfloat16))
