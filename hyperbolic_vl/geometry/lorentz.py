"""Lorentz (hyperboloid) model of hyperbolic space, MERU conventions.

The hyperboloid of curvature -c (c > 0, argument `curv`: a Python float or a
possibly traced scalar) is {z = (z_space, z_time) : <z, z>_L = -1/c, z_time > 0}
with the Lorentz inner product <x, y>_L = <x_space, y_space> - x_time y_time.
A point is stored by its space components x of shape (..., D); the time
component is recomputed as x_time = sqrt(1/c + |x|^2). The origin is x = 0.

Numerics: everything computes in float32 (bfloat16 /
float16 inputs are upcast, float64 inputs stay float64) and returns that
dtype; inner products use Precision.HIGHEST matmuls; singular functions come
from `safe`, so values and gradients are finite everywhere, including for
identical points, the origin, and points with norms from 1e-12 to 1e4.

Where a formula has a better-conditioned exact equivalent it is used, and the
docstring says so (e.g. acosh(sqrt(c) x_time) == asinh(sqrt(c) |x|)).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from hyperbolic_vl.geometry import safe

__all__ = [
  "time_component",
  "pairwise_inner",
  "elementwise_inner",
  "pairwise_dist",
  "elementwise_dist",
  "exp_map0",
  "log_map0",
  "dist_to_origin",
  "half_aperture",
  "oxy_angle",
  "pairwise_oxy_angle",
  "interpolate_to_origin",
  "geodesic_interpolate",
  "to_poincare",
  "from_poincare",
  "to_klein",
  "from_klein",
  "einstein_midpoint",
]

_HIGHEST = jax.lax.Precision.HIGHEST

# Largest curvature-scaled radius sqrt(c)|v| the exponential map accepts, as in
# MERU: sinh(r_max) = 2^15, so |x| <= 2^15 / sqrt(c) and x_time^2 ~ 1e9 stays
# far from float32 overflow while leaving room for any useful embedding.
EXP_MAP_MAX_RADIUS = math.asinh(2.0**15)

# Lower clamp for the curvature-scaled norm r in the sinh(r)/r, asinh(r)/r
# ratios: the ratios tend to 1 as r -> 0 and, with numerator and denominator
# clamped to the same value, evaluate to sinh(1e-8)/1e-8 == 1 exactly in f32
# and f64, with a zero (the true) derivative of the ratio there. 1e-8 keeps
# 1/r^2 in the ratio's derivative far from float32 overflow.
_SMALL_RADIUS = 1e-8


def _time(x, curv):
  # 1/c + |x|^2 > 0 for every c > 0, so no guard is needed.
  return jnp.sqrt(1.0 / curv + safe.squared_norm(x))


def time_component(x, curv) -> jax.Array:
  """x_time = sqrt(1/c + |x|^2). x: (..., D) -> (...)."""
  curv, x = safe.prepare(curv, x)
  return _time(x, curv)


def pairwise_inner(x, y, curv) -> jax.Array:
  """Lorentz inner products of all pairs. x: (N, D), y: (M, D) -> (N, M).

  Leading batch axes are allowed: (..., N, D), (..., M, D) -> (..., N, M).
  The space part is a Precision.HIGHEST matmul: with TF32/bf16 passes the
  cancellation against x_time y_time is off by ~5e-2 at hyperbolic radius 4.
  """
  curv, x, y = safe.prepare(curv, x, y)
  space = jnp.matmul(x, jnp.swapaxes(y, -1, -2), precision=_HIGHEST)
  return space - _time(x, curv)[..., :, None] * _time(y, curv)[..., None, :]


def elementwise_inner(x, y, curv) -> jax.Array:
  """<x_i, y_i>_L for broadcast-compatible x, y: (..., D) -> (...)."""
  curv, x, y = safe.prepare(curv, x, y)
  return jnp.sum(x * y, axis=-1) - _time(x, curv) * _time(y, curv)


def pairwise_dist(x, y, curv) -> jax.Array:
  """Geodesic distances acosh(-c <x, y>_L) / sqrt(c). (N, D), (M, D) -> (N, M).

  For identical points -c<x,x>_L rounds to 1 +- ~1e-6 (f32), and acosh
  amplifies that to a distance of ~1e-3: acosh(1 + d) ~ sqrt(2 d). safe.acosh
  maps arguments below 1 to 0 and keeps the gradient finite (capped ~2e3).
  """
  curv, x, y = safe.prepare(curv, x, y)
  return safe.acosh(-curv * pairwise_inner(x, y, curv)) / jnp.sqrt(curv)


def elementwise_dist(x, y, curv) -> jax.Array:
  """Geodesic distance between x_i and y_i. (..., D), (..., D) -> (...)."""
  curv, x, y = safe.prepare(curv, x, y)
  return safe.acosh(-curv * elementwise_inner(x, y, curv)) / jnp.sqrt(curv)


def exp_map0(v, curv) -> jax.Array:
  """Exponential map at the origin: x = sinh(r) / r * v, r = sqrt(c)|v|.

  v: (..., D) tangent vectors at the origin -> (..., D) space components.
  (MERU eq. 9. Then |x| = sinh(r)/sqrt(c) and x_time = cosh(r)/sqrt(c).)
  r is clamped to [1e-8, asinh(2^15)] in the sinh and to >= 1e-8 in the
  division, as MERU: at v = 0 the map is the identity with Jacobian I.
  """
  curv, v = safe.prepare(curv, v)
  radius = jnp.sqrt(curv) * safe.safe_norm(v, keepdims=True)
  # Lower clamp: see _SMALL_RADIUS (sinh(r)/r -> 1 without 0/0).
  radius_lower = jnp.maximum(radius, _SMALL_RADIUS)
  # Upper clamp only inside sinh: see EXP_MAP_MAX_RADIUS (overflow guard).
  sinh_radius = jnp.sinh(jnp.minimum(radius_lower, EXP_MAP_MAX_RADIUS))
  return sinh_radius / radius_lower * v


def exp_map_capped(x, curv) -> jax.Array:
  """Whether exp_map0 capped each point: sqrt(c)|x| = sinh(EXP_MAP_MAX_RADIUS)
  = 2^15 exactly there, so a capped point is recognised from x alone. The
  1e-5 relative margin is ~100 float32 ulps; an uncapped point that close to
  the cap is as degenerate. (..., D) -> (...) bool."""
  curv, x = safe.prepare(curv, x)
  scaled_norm = jnp.sqrt(curv) * safe.safe_norm(x)
  return scaled_norm >= math.sinh(EXP_MAP_MAX_RADIUS) * (1 - 1e-5)


def log_map0(x, curv) -> jax.Array:
  """Logarithmic map at the origin, inverse of exp_map0. (..., D) -> (..., D).

  v = acosh(sqrt(c) x_time) * x / (sqrt(c)|x|), computed through the exact
  identity acosh(sqrt(c) x_time) = acosh(sqrt(1 + c|x|^2)) = asinh(sqrt(c)|x|):
  in float32 sqrt(1 + c|x|^2) rounds to 1 for |x| < ~3e-4, so the acosh form
  would map small points to 0, while asinh is accurate at every scale.
  """
  curv, x = safe.prepare(curv, x)
  radius = jnp.sqrt(curv) * safe.safe_norm(x, keepdims=True)
  # Lower clamp: see _SMALL_RADIUS (asinh(r)/r -> 1 without 0/0 at x = 0).
  radius_lower = jnp.maximum(radius, _SMALL_RADIUS)
  return jnp.arcsinh(radius_lower) / radius_lower * x


def dist_to_origin(x, curv) -> jax.Array:
  """Distance from the origin, acosh(sqrt(c) x_time)/sqrt(c). (..., D) -> (...).

  Computed as asinh(sqrt(c)|x|)/sqrt(c) (exact identity, see log_map0),
  which is accurate near the origin where the acosh form is not.
  """
  curv, x = safe.prepare(curv, x)
  sqrt_curv = jnp.sqrt(curv)
  return jnp.arcsinh(sqrt_curv * safe.safe_norm(x)) / sqrt_curv


def half_aperture(x, curv, min_radius=0.1) -> jax.Array:
  """Half aperture of the entailment cone at x, MERU eq. 10. (..., D) -> (...).

  asin(2 K / (sqrt(c)|x|)) with K = min_radius. For sqrt(c)|x| <= 2K the
  argument is >= 1 and the aperture saturates at pi/2 with zero gradient
  (safe.asin), matching the clamp in MERU.
  """
  curv, x = safe.prepare(curv, x)
  scaled_norm = jnp.sqrt(curv) * safe.safe_norm(x)
  # Floor 1e-12: far inside the saturated region (any K of interest is
  # >> 1e-12), so the value is unchanged (pi/2); it keeps 1/denominator^2 in
  # the backward pass finite in float32 when |x| sits at safe_norm's ~1e-19.
  scaled_norm = jnp.maximum(scaled_norm, 1e-12)
  return safe.asin(2.0 * min_radius / scaled_norm)


def _exterior_angle(x_time, y_time, x_norm, scaled_inner):
  """Exterior angle at x from its parts (MERU eq. 11); shapes broadcast.

  scaled_inner = c <x, y>_L, so a = -scaled_inner = cosh(sqrt(c) d(x, y)).
  """
  dtype = scaled_inner.dtype
  cosh_dist = -scaled_inner
  # sqrt(a^2 - 1) = sinh(sqrt(c) d(x,y)); (a-1)(a+1) cancels less than a^2-1.
  # Floor eps (1e-7 f32, 1e-15 f64; f32 floors in 1e-7..1e-6 keep the gradient below ~1e3): for x == y
  # the product is ~0 or negative by rounding; the floor keeps the sqrt and
  # its derivative finite.
  sinh_dist = jnp.sqrt(jnp.maximum((cosh_dist - 1.0) * (cosh_dist + 1.0), safe.domain_eps(dtype)))
  numerator = y_time + x_time * scaled_inner
  # Floor 1e-8 (MERU adds 1e-8 here): at x = 0 the angle is undefined and the
  # denominator ~1e-19 would make numerator/denominator^2 in the backward
  # pass overflow; with the floor the ratio saturates the acos instead.
  denominator = jnp.maximum(x_norm * sinh_dist, 1e-8)
  # The ratio leaves [-1, 1] by rounding (y on the ray through x gives ~1);
  # safe.acos clips it and keeps the derivative finite.
  return safe.acos(numerator / denominator)


def oxy_angle(x, y, curv) -> jax.Array:
  """Exterior angle at x between the ray O->x extended and the geodesic x->y.

  MERU eq. 11, elementwise: x, y broadcast-compatible (..., D) -> (...).
  0 when y lies on the geodesic ray from the origin through x, beyond x.
  """
  curv, x, y = safe.prepare(curv, x, y)
  return _exterior_angle(
    _time(x, curv),
    _time(y, curv),
    safe.safe_norm(x),
    curv * elementwise_inner(x, y, curv),
  )


def pairwise_oxy_angle(x, y, curv) -> jax.Array:
  """Exterior angle at x_i towards y_j for all pairs. (N, D), (M, D) -> (N, M)."""
  curv, x, y = safe.prepare(curv, x, y)
  return _exterior_angle(
    _time(x, curv)[..., :, None],
    _time(y, curv)[..., None, :],
    safe.safe_norm(x)[..., :, None],
    curv * pairwise_inner(x, y, curv),
  )


def interpolate_to_origin(x, t, curv) -> jax.Array:
  """Point at fraction t of the geodesic from the origin (t=0) to x (t=1).

  exp_map0(t * log_map0(x)). x: (..., D); t broadcastable against (..., D),
  e.g. shape (T, 1) with x of shape (D,) gives T points, (T, D).
  """
  curv, x = safe.prepare(curv, x)
  t = safe.as_compute(t, x.dtype)
  return exp_map0(t * log_map0(x, curv), curv)


def _sinh_ratio(numerator_arg, denominator_arg):
  """sinh(a)/sinh(b) for b > 0 without overflow for large a, b.

  sinh(a)/sinh(b) = exp(a - b) * expm1(-2a) / expm1(-2b); expm1 keeps the
  ratio accurate for small arguments.
  """
  return (
    jnp.exp(numerator_arg - denominator_arg)
    * jnp.expm1(-2.0 * numerator_arg)
    / jnp.expm1(-2.0 * denominator_arg)
  )


def geodesic_interpolate(x, y, t, curv) -> jax.Array:
  """Point at fraction t of the geodesic from x (t=0) to y (t=1).

  Ambient formula z = sinh((1-t) d)/sinh(d) x + sinh(t d)/sinh(d) y with
  d = sqrt(c) dist(x, y); it is linear, so it applies to space components
  directly. x, y: (..., D); t broadcastable against (..., D) (use a trailing
  singleton axis, e.g. (T, 1)). t outside [0, 1] extrapolates.
  """
  curv, x, y = safe.prepare(curv, x, y)
  t = safe.as_compute(t, x.dtype)
  scaled_dist = safe.acosh(-curv * elementwise_inner(x, y, curv))[..., None]
  # Floor 1e-8: at x == y the ratios are 0/0; their limits are (1-t) and t,
  # and at d = 1e-8 _sinh_ratio differs from them by O(d^2) ~ 1e-17, below
  # rounding. The floor also keeps 1/expm1(-2d)^2 in the backward finite.
  scaled_dist = jnp.maximum(scaled_dist, 1e-8)
  weight_x = _sinh_ratio((1.0 - t) * scaled_dist, scaled_dist)
  weight_y = _sinh_ratio(t * scaled_dist, scaled_dist)
  return weight_x * x + weight_y * y


def to_poincare(x, curv) -> jax.Array:
  """Lorentz -> Poincare ball of radius 1/sqrt(c): p = x / (1 + sqrt(c) x_time).

  (..., D) -> (..., D). The denominator is >= 2, no guard needed.
  """
  curv, x = safe.prepare(curv, x)
  return x / (1.0 + jnp.sqrt(curv) * _time(x, curv))[..., None]


def from_poincare(p, curv) -> jax.Array:
  """Poincare ball (radius 1/sqrt(c)) -> Lorentz: x = 2p / (1 - c|p|^2)."""
  curv, p = safe.prepare(curv, p)
  conformal = 1.0 - curv * safe.squared_norm(p, keepdims=True)
  # Floor eps (1e-7 f32 / 1e-15 f64): points on or outside the boundary
  # (rounding) map to a large finite point instead of inf or a sign flip.
  return 2.0 * p / jnp.maximum(conformal, safe.domain_eps(p.dtype))


def to_klein(x, curv) -> jax.Array:
  """Lorentz -> Klein ball of radius 1/sqrt(c): k = x / (sqrt(c) x_time)."""
  curv, x = safe.prepare(curv, x)
  # sqrt(c) x_time >= 1: no guard needed.
  return x / (jnp.sqrt(curv) * _time(x, curv))[..., None]


def from_klein(k, curv) -> jax.Array:
  """Klein ball (radius 1/sqrt(c)) -> Lorentz: x = k / sqrt(1 - c|k|^2).

  In float32, 1 - c|k|^2 loses all digits for points with |x| >~ 3e3/sqrt(c)
  (it is 1/(c x_time^2)); such points are not recoverable from Klein
  coordinates and come back large but finite.
  """
  curv, k = safe.prepare(curv, k)
  one_minus = 1.0 - curv * safe.squared_norm(k, keepdims=True)
  # Floor eps (1e-7 f32 / 1e-15 f64): boundary points (rounding) stay finite.
  return k / jnp.sqrt(jnp.maximum(one_minus, safe.domain_eps(k.dtype)))


def einstein_midpoint(x, curv, weights=None, axis=0) -> jax.Array:
  """Weighted Einstein midpoint (hyperbolic centroid), ATMG eq. 5-6.

  x: (..., D) points; `axis` indexes the leading (point) axes of x, so the
  result has that axis removed: e.g. (N, D) -> (D,), (N, B, D) with axis=0
  -> (B, D). weights: None (uniform), shape (N,) along `axis`, or
  broadcastable to x.shape[:-1]; non-negative, not all zero.

  Klein coordinates k_i, Lorentz factors gamma_i = 1/sqrt(1 - c|k_i|^2),
  midpoint k = sum w_i gamma_i k_i / sum w_i gamma_i, mapped back. gamma_i is
  evaluated through the exact identity gamma_i = sqrt(c) x_time_i, which
  avoids 1 - c|k_i|^2 cancelling for far points.
  """
  curv, x = safe.prepare(curv, x)
  num_leading = x.ndim - 1
  axis = axis + num_leading if axis < 0 else axis
  klein = to_klein(x, curv)
  lorentz_factor = jnp.sqrt(curv) * _time(x, curv)
  if weights is None:
    weights = jnp.ones(x.shape[axis], x.dtype)
  weights = safe.as_compute(weights, x.dtype)
  if weights.ndim == 1 and num_leading > 1:
    shape = [1] * num_leading
    shape[axis] = weights.shape[0]
    weights = weights.reshape(shape)
  weighted_factor = weights * lorentz_factor
  numerator = jnp.sum(weighted_factor[..., None] * klein, axis=axis)
  denominator = jnp.sum(weighted_factor, axis=axis)[..., None]
  # Floor tiny: only hit when all weights are 0 (then the numerator is 0 too
  # and the midpoint is the origin instead of 0/0).
  denominator = jnp.maximum(denominator, jnp.finfo(x.dtype).tiny)
  return from_klein(numerator / denominator, curv)
