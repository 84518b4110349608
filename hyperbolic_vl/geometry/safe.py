"""Singularity-safe elementary functions for hyperbolic geometry.

Why this module exists: the reference PyTorch code (MERU)
guards `acosh`, `asin`, `acos` with `clamp(x, 1 + 1e-8)` and friends. In
float32 `1 + 1e-8 == 1`, so the clamp lands exactly on the singularity. PyTorch
masks clamped elements in the backward pass, but in JAX the derivative of
`clip` is multiplied into the chain rule, giving `0 * inf = NaN` (or `inf`
when the input sits exactly on the singularity). Every function here is a
`jax.custom_jvp` whose value AND derivative are finite for every finite
input, including inputs exactly on, or beyond, the edge of the domain.

All functions upcast bfloat16/float16 inputs to float32 (their spacing near 1
is far too coarse for these ops) and keep float64 inputs in float64.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

__all__ = [
  "compute_dtype",
  "as_compute",
  "prepare",
  "squared_norm",
  "domain_eps",
  "acosh",
  "asin",
  "acos",
  "atanh",
  "safe_norm",
  "safe_sqrt",
]


def compute_dtype(*values) -> jnp.dtype:
  """float64 if any input is float64 (and x64 is enabled), else float32.

  bfloat16 / float16 / integer inputs and Python scalars compute in float32.
  Reads only `.dtype`, so NumPy inputs are not copied to the device here.
  """
  for value in values:
    if jnp.dtype(getattr(value, "dtype", jnp.float32)) == jnp.float64:
      # float32 again when x64 is disabled (JAX has no float64 then).
      return jnp.dtype(jax.dtypes.canonicalize_dtype(jnp.float64))
  return jnp.dtype(jnp.float32)


def as_compute(value, dtype=None) -> jax.Array:
  """Cast `value` to the compute dtype (float32, or float64 if given f64)."""
  dtype = compute_dtype(value) if dtype is None else dtype
  return jnp.asarray(value, dtype=dtype)


def domain_eps(dtype) -> float:
  """Distance from a domain edge at 1 that is still representable.

  1e-7 is about one float32 ulp at 1 (1 + 1e-7 rounds to 1 + 1.19e-7, which
  is != 1, unlike 1e-8). For float64 the ulp is 2.2e-16, so 1e-15 sits a few
  ulps away from 1 and keeps float64 results close to the exact function.
  """
  return 1e-15 if jnp.dtype(dtype) == jnp.float64 else 1e-7


def _inverse_trig_eps(dtype) -> float:
  """Clamp for the derivative of asin/acos: |u| <= 1 - eps.

  1e-6 in float32 (never 1e-8, which rounds to exactly 1), capping the
  derivative 1/sqrt(1 - u^2) at about 707. 1e-12 in float64 (cap ~7e5).
  """
  return 1e-12 if jnp.dtype(dtype) == jnp.float64 else 1e-6


# --------------------------------------------------------------------------
# acosh
# --------------------------------------------------------------------------
@jax.custom_jvp
def _acosh(x):
  # max(x, 1): arguments below 1 only arise from rounding (e.g. -c<x,x>_L of
  # identical points), where the true value is acosh(1) = 0.
  return jnp.arccosh(jnp.maximum(x, 1.0))


@_acosh.defjvp
def _acosh_jvp(primals, tangents):
  (x,), (x_dot,) = primals, tangents
  # z >= 1 + eps keeps (z-1)(z+1) > 0, so the derivative is capped (about
  # 2e3 in float32) instead of infinite at x == 1. Below 1 the capped value
  # continues the derivative (the region below 1 is reached only by rounding).
  z = jnp.maximum(x, 1.0 + domain_eps(x.dtype))
  return _acosh(x), x_dot * jax.lax.rsqrt((z - 1.0) * (z + 1.0))


def acosh(x) -> jax.Array:
  """arccosh(max(x, 1)) with a finite derivative everywhere.

  Derivative: 1/sqrt(z^2 - 1), z = max(x, 1 + eps), eps 1e-7 (f32) /
  1e-15 (f64). Shape preserved.
  """
  return _acosh(as_compute(x))


# --------------------------------------------------------------------------
# asin / acos
# --------------------------------------------------------------------------
def _inverse_trig_derivative(u):
  """1/sqrt(1-u^2) capped inside [-1, 1], and 0 strictly outside.

  Outside [-1, 1] the forward value is the constant asin(+-1), so 0 is the
  true derivative of the clipped function (this is also what PyTorch's clamp
  gives MERU for its half-aperture near the origin). A capped non-zero value
  there would push points near the origin with gradients of order 1/|x|^2.
  """
  eps = _inverse_trig_eps(u.dtype)
  # Clip keeps (1-z)(1+z) >= ~2 eps > 0 so the rsqrt is finite even at |u|=1.
  z = jnp.clip(u, -1.0 + eps, 1.0 - eps)
  inside = jnp.abs(u) <= 1.0
  return jnp.where(inside, jax.lax.rsqrt((1.0 - z) * (1.0 + z)), 0.0)


@jax.custom_jvp
def _asin(x):
  # Clip: beyond +-1 is either rounding or a deliberate saturation (the
  # half-aperture near the origin); the value saturates at +-pi/2.
  return jnp.arcsin(jnp.clip(x, -1.0, 1.0))


@_asin.defjvp
def _asin_jvp(primals, tangents):
  (x,), (x_dot,) = primals, tangents
  return _asin(x), x_dot * _inverse_trig_derivative(x)


@jax.custom_jvp
def _acos(x):
  # Clip: same reason as _asin; the value saturates at 0 / pi.
  return jnp.arccos(jnp.clip(x, -1.0, 1.0))


@_acos.defjvp
def _acos_jvp(primals, tangents):
  (x,), (x_dot,) = primals, tangents
  return _acos(x), -x_dot * _inverse_trig_derivative(x)


def asin(x) -> jax.Array:
  """arcsin(clip(x, -1, 1)); derivative capped near +-1, zero beyond."""
  return _asin(as_compute(x))


def acos(x) -> jax.Array:
  """arccos(clip(x, -1, 1)); derivative capped near +-1, zero beyond."""
  return _acos(as_compute(x))


# --------------------------------------------------------------------------
# atanh
# --------------------------------------------------------------------------
@jax.custom_jvp
def _atanh(x):
  # Clip to +-(1 - eps): atanh(+-1) is infinite; arguments at or beyond 1
  # come from points on / outside the Poincare ball boundary (rounding).
  limit = 1.0 - domain_eps(x.dtype)
  return jnp.arctanh(jnp.clip(x, -limit, limit))


@_atanh.defjvp
def _atanh_jvp(primals, tangents):
  (x,), (x_dot,) = primals, tangents
  limit = 1.0 - domain_eps(x.dtype)
  # Same clip as the forward: 1/(1-z^2) is then at most ~5e6 (f32), finite.
  z = jnp.clip(x, -limit, limit)
  return _atanh(x), x_dot / ((1.0 - z) * (1.0 + z))


def atanh(x) -> jax.Array:
  """arctanh(clip(x, +-(1 - eps))), eps 1e-7 (f32) / 1e-15 (f64)."""
  return _atanh(as_compute(x))


# --------------------------------------------------------------------------
# norms and square roots
# --------------------------------------------------------------------------
def safe_sqrt(x, eps=None) -> jax.Array:
  """sqrt(max(x, eps)); eps defaults to the dtype's smallest normal number.

  The floor keeps the derivative 1/(2 sqrt(.)) finite at 0 (the max passes a
  zero gradient for x < eps, so the result's gradient there is 0, not NaN).
  """
  x = as_compute(x)
  floor = jnp.finfo(x.dtype).tiny if eps is None else eps
  return jnp.sqrt(jnp.maximum(x, floor))


def safe_norm(x, axis=-1, keepdims=False, eps=None) -> jax.Array:
  """Euclidean norm sqrt(max(sum x^2, eps)) with a finite gradient at 0.

  jnp.linalg.norm has a NaN gradient at the zero vector (x / |x| = 0/0);
  here the gradient at 0 is 0. eps defaults to the dtype's smallest normal
  number, so the value is exact for every norm above ~1e-19 (f32).
  Shape: (..., D) -> (...) (or (..., 1) with keepdims).
  """
  x = as_compute(x)
  squared_norm = jnp.sum(x * x, axis=axis, keepdims=keepdims)
  return safe_sqrt(squared_norm, eps)


def prepare(curv, *points):
  """Cast points and curvature to the common compute dtype (f32 or f64)."""
  dtype = compute_dtype(*points)
  return (as_compute(curv, dtype),) + tuple(as_compute(p, dtype) for p in points)


def squared_norm(x, keepdims=False):
  return jnp.sum(x * x, axis=-1, keepdims=keepdims)
