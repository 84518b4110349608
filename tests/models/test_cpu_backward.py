"""The CPU backward pass's rewrites keep autodiff's gradient.

`plain_attention`'s hand-written VJP is checked in float64 against autodiff
of the same softmax(q k^T / sqrt(d) + masks) v written out here, with causal
and key-padding masks and a query whose every key is masked (its weights
are uniform and non-zero, and no gradient may reach the masked logits). The
two agree to float64 rounding (observed 7e-16); 1e-12 leaves room for a
different summation order and still fails a wrong term (O(1e-2)).

`transformer.LayerNorm`'s written-out gradient equals nnx.LayerNorm's
autodiff in float64 (observed 4e-16) on a large-mean input, params too.

`residual_gradient_stored` is an identity in value and gradient, and the
step's compiler options keep its barrier through XLA:CPU's fusion (without
them XLA expands the barrier first and the rewrite silently does nothing;
a jax upgrade that renames the pass fails here).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from hyperbolic_vl.models import attention, transformer
from hyperbolic_vl.training import compilation


def _autodiff_attention(query, key, value, mask, is_causal):
  query, key, value = (jnp.swapaxes(x, 1, 2) for x in (query, key, value))
  logits = jnp.einsum("bhqd,bhkd->bhqk", query, key) / jnp.sqrt(query.shape[-1])
  allowed = jnp.ones(logits.shape, bool)
  if is_causal:
    allowed = allowed & jnp.tril(jnp.ones(logits.shape[-2:], bool))
  if mask is not None:
    allowed = allowed & mask
  logits = jnp.where(allowed, logits, jnp.finfo(logits.dtype).min)
  weights = jax.nn.softmax(logits, axis=-1)
  return jnp.swapaxes(jnp.einsum("bhqk,bhkd->bhqd", weights, value), 1, 2)


@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
@pytest.mark.parametrize("masked", [False, True], ids=["no_mask", "padding_and_empty_row"])
def test_attention_vjp_equals_autodiff_float64(causal, masked):
  with jax.enable_x64(True):
    rng = np.random.default_rng(0)
    q, k, v = (jnp.asarray(rng.normal(size=(3, 7, 2, 4))) for _ in range(3))
    mask = None
    if masked:
      padding = np.arange(7)[None, :] < np.array([7, 4, 0])[:, None]  # example 2: no key at all
      mask = jnp.asarray(padding)[:, None, None, :]
    probe = jnp.asarray(rng.normal(size=(3, 7, 2, 4)))
    ours = lambda q, k, v: jnp.sum(
      probe * jnp.sin(attention.plain_attention(q, k, v, mask=mask, is_causal=causal))
    )
    reference = lambda q, k, v: jnp.sum(probe * jnp.sin(_autodiff_attention(q, k, v, mask, causal)))
    # Both values and gradients as one compiled computation (eagerly, each
    # op of the forward and backward passes is its own compile).
    both = jax.jit(
      lambda q, k, v: [jax.value_and_grad(f, argnums=(0, 1, 2))(q, k, v) for f in (ours, reference)]
    )
    (ours_value, got), (reference_value, expected) = jax.device_get(both(q, k, v))
    np.testing.assert_allclose(ours_value, reference_value, rtol=1e-12)
    for name, a, b in zip("qkv", got, expected, strict=True):
      np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12, err_msg=name)
      assert float(np.abs(b).max()) > 1e-3, name  # the gradient is not trivially zero


def test_residual_gradient_stored_is_an_identity_float64():
  with jax.enable_x64(True):
    f = lambda x: jnp.sum(jnp.tanh(transformer.residual_gradient_stored(x * x)) ** 3)
    g = lambda x: jnp.sum(jnp.tanh(x * x) ** 3)

    # Values and gradients in one compiled computation (one compile, not one per op).
    @jax.jit
    def values_and_gradients():
      x = jnp.linspace(-2.0, 3.0, 12).reshape(3, 4)
      return [jax.value_and_grad(h)(x) for h in (f, g)]

    (f_value, f_gradient), (g_value, g_gradient) = jax.device_get(values_and_gradients())
    assert float(f_value) == float(g_value)
    np.testing.assert_array_equal(f_gradient, g_gradient)


def test_the_step_options_keep_the_barrier_through_cpu_fusion():
  x = np.linspace(-1.0, 1.0, 64, dtype=np.float32)

  def f(x):
    return jnp.sum(jnp.sin(transformer.residual_gradient_stored(jnp.cos(x))) ** 2)

  grad = jax.grad(f)
  kept = jax.jit(grad, compiler_options=compilation.step_compiler_options()).lower(x).compile()
  plain = jax.jit(grad).lower(x).compile()
  assert "opt-barrier" in kept.as_text()
  assert "opt-barrier" not in plain.as_text()
  np.testing.assert_array_equal(kept(x), plain(x))


def test_layer_norm_vjp_equals_nnx_layer_norm_float64():
  with jax.enable_x64(True):
    rng = np.random.default_rng(1)
    make = lambda cls: cls(
      6,
      epsilon=transformer.LAYER_NORM_EPSILON,
      use_fast_variance=False,
      dtype=jnp.float64,
      param_dtype=jnp.float64,
      rngs=nnx.Rngs(0),
    )
    # Built under jit: one compile instead of one per initialiser.
    ours, reference = nnx.jit(lambda: (make(transformer.LayerNorm), make(nnx.LayerNorm)))()
    scale, bias = rng.normal(size=6), rng.normal(size=6)
    for module in (ours, reference):
      module.scale[...] = jnp.asarray(scale)
      module.bias[...] = jnp.asarray(bias)
    x = jnp.asarray(rng.normal(size=(2, 5, 6)) * 3 + 7)  # the residual stream's large mean
    probe = jnp.asarray(rng.normal(size=(2, 5, 6)))
    loss = lambda module, x: jnp.sum(probe * jnp.sin(module(x)))
    # Both losses and gradients as one compiled computation.
    both = nnx.jit(
      lambda ours, reference, x: [
        nnx.value_and_grad(loss, argnums=(0, 1))(module, x) for module in (ours, reference)
      ]
    )
    (got_loss, got), (want_loss, want) = jax.device_get(both(ours, reference, x))
    np.testing.assert_allclose(got_loss, want_loss, rtol=1e-12)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
      np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
      assert float(np.abs(b).max()) > 1e-3
