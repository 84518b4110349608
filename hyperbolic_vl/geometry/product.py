"""Products of Lorentz spaces (PHyCLIP, Yoshikawa and Matsubara, ICLR 2026).

An embedding of width D = K d is K factors of d dimensions: factor k holds
the components [k d, (k+1) d) and lives on its own hyperboloid of curvature
-c_k. Points are stored flat, (..., D), as every model here returns them;
`split` views them as (..., K, d). Curvatures are a vector `curvs` of shape
(K,), and K is read from it.

Every per-factor function is `jax.vmap` over the factor axis of the
function of the same name in `lorentz` (one scalar curvature per factor),
so values and gradients stay finite wherever `lorentz`'s do (identical
points, the origin, any norm).

`eps`: 0 (the default) gives `lorentz`'s guards exactly, so K = 1 equals the
plain Lorentz functions. eps > 0 applies PHyCLIP's released clamps on top
(`lorentz_eps`, 1e-6 in its configs): the acosh argument at >= 1 + eps, the
asin / acos inputs in [-1 + eps, 1 - eps], eps added to the aperture's and
the exterior angle's denominators, the sinh^2 under the angle's root at
>= eps and the exponential map's radius at >= eps. In float32 these bind:
no angle is below acos(1 - 1e-6) = 1.4e-3 rad, no half aperture above
pi/2 - 1.4e-3, no distance below acosh(1 + 1e-6) = 1.4e-3 / sqrt(c). A
clamped entry has a zero derivative, as PyTorch's clamp gives the release.

Aggregation of per-factor distances d_k into one distance:
  "l1"  (1/K) sum_k d_k                 (the release's default)
  "l2"  sqrt((1/K) sum_k d_k^2)
and the score PHyCLIP's evaluation ranks by is the sum of the per-factor
Lorentz inner products, sum_k <x_k, y_k>_{L, c_k} (`pairwise_score`), which
is not monotone in either aggregated distance.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from hyperbolic_vl.geometry import lorentz, safe

__all__ = [
  "AGGREGATIONS",
  "num_factors",
  "split",
  "merge",
  "exp_map0",
  "log_map0",
  "exp_map_capped",
  "factor_pairwise_inner",
  "factor_elementwise_inner",
  "pairwise_score",
  "factor_pairwise_dist",
  "factor_elementwise_dist",
  "aggregate",
  "pairwise_dist",
  "elementwise_dist",
  "factor_dist_to_origin",
  "dist_to_origin",
  "half_aperture",
  "oxy_angle",
]

AGGREGATIONS = ("l1", "l2")


def num_factors(curvs) -> int:
  """K, the length of the curvature vector (a 1-D array)."""
  shape = jnp.shape(curvs)
  if len(shape) != 1:
    raise ValueError(f"product geometry needs a (K,) curvature vector, got shape {shape}")
  return shape[0]


def split(x, num_factors: int) -> jax.Array:
  """(..., K d) -> (..., K, d); factor k is components [k d, (k+1) d)."""
  width = x.shape[-1]
  if width % num_factors:
    raise ValueError(f"an embedding of width {width} does not split into {num_factors} factors")
  return jnp.reshape(x, x.shape[:-1] + (num_factors, width // num_factors))


def merge(x) -> jax.Array:
  """(..., K, d) -> (..., K d), the inverse of `split`."""
  return jnp.reshape(x, x.shape[:-2] + (x.shape[-2] * x.shape[-1],))


def _factors_first(x, curvs) -> jax.Array:
  """(..., K d) -> (K, ..., d): the factor axis leading, for vmap."""
  return jnp.moveaxis(split(x, num_factors(curvs)), -2, 0)


def _factors_last(values) -> jax.Array:
  """(K, ...) -> (..., K)."""
  return jnp.moveaxis(values, 0, -1)


def _prepared(curvs, *points):
  curvs, *points = safe.prepare(curvs, *points)
  return (curvs, *(_factors_first(p, curvs) for p in points))


# -- maps at the origin -------------------------------------------------------
def _exp_map0_release(v, curv, eps):
  # The release: sinh(clamp(r, eps, r_max)) v / clamp(r, eps), r = sqrt(c)|v|.
  radius = jnp.sqrt(curv) * safe.safe_norm(v, keepdims=True)
  radius_lower = jnp.maximum(radius, eps)
  sinh_radius = jnp.sinh(jnp.minimum(radius_lower, lorentz.EXP_MAP_MAX_RADIUS))
  return sinh_radius / radius_lower * v


def exp_map0(v, curvs, eps: float = 0.0) -> jax.Array:
  """Per-factor exponential map at the origin. (..., K d) -> (..., K d)."""
  curvs, factors = _prepared(curvs, v)
  if eps:
    lifted = jax.vmap(lambda f, c: _exp_map0_release(f, c, eps))(factors, curvs)
  else:
    lifted = jax.vmap(lorentz.exp_map0)(factors, curvs)
  return merge(jnp.moveaxis(lifted, 0, -2))


def log_map0(x, curvs) -> jax.Array:
  """Per-factor logarithmic map at the origin, inverse of `exp_map0`.
  (..., K d) -> (..., K d). (The release's log map keeps eps 1e-8 and only
  its analyses call it; `lorentz.log_map0` needs no floor of its own.)"""
  curvs, factors = _prepared(curvs, x)
  return merge(jnp.moveaxis(jax.vmap(lorentz.log_map0)(factors, curvs), 0, -2))


def exp_map_capped(x, curvs) -> jax.Array:
  """Whether exp_map0 capped each factor (`lorentz.exp_map_capped`). (..., K d) -> (..., K)."""
  curvs, factors = _prepared(curvs, x)
  return _factors_last(jax.vmap(lorentz.exp_map_capped)(factors, curvs))


# -- inner products and the score -------------------------------------------
def factor_pairwise_inner(x, y, curvs) -> jax.Array:
  """<x_k, y_k>_{L, c_k} of all pairs per factor. (N, K d), (M, K d) -> (K, N, M)."""
  curvs, xs, ys = _prepared(curvs, x, y)
  return jax.vmap(lorentz.pairwise_inner)(xs, ys, curvs)


def factor_elementwise_inner(x, y, curvs) -> jax.Array:
  """<x_k, y_k>_{L, c_k} of broadcast-compatible points. (..., K d) -> (..., K)."""
  curvs, xs, ys = _prepared(curvs, x, y)
  return _factors_last(jax.vmap(lorentz.elementwise_inner)(xs, ys, curvs))


def pairwise_score(x, y, curvs) -> jax.Array:
  """PHyCLIP's evaluation score sum_k <x_k, y_k>_{L, c_k}. (N, K d), (M, K d) -> (N, M)."""
  return factor_pairwise_inner(x, y, curvs).sum(axis=0)


# -- distances ---------------------------------------------------------------
def _acosh_dist(cosh_arg, curv, eps):
  # The release clamps the acosh argument at 1 + eps (a zero derivative
  # below it, as PyTorch's clamp); safe.acosh keeps the derivative finite.
  return safe.acosh(jnp.maximum(cosh_arg, 1.0 + eps)) / jnp.sqrt(curv)


def factor_pairwise_dist(x, y, curvs, eps: float = 0.0) -> jax.Array:
  """Per-factor distances of all pairs. (N, K d), (M, K d) -> (K, N, M)."""
  curvs, xs, ys = _prepared(curvs, x, y)
  if not eps:
    return jax.vmap(lorentz.pairwise_dist)(xs, ys, curvs)

  def one_factor(a, b, c):
    return _acosh_dist(-c * lorentz.pairwise_inner(a, b, c), c, eps)

  return jax.vmap(one_factor)(xs, ys, curvs)


def factor_elementwise_dist(x, y, curvs, eps: float = 0.0) -> jax.Array:
  """Per-factor distance of x_i and y_i. (..., K d), (..., K d) -> (..., K)."""
  curvs, xs, ys = _prepared(curvs, x, y)
  if not eps:
    return _factors_last(jax.vmap(lorentz.elementwise_dist)(xs, ys, curvs))

  def one_factor(a, b, c):
    return _acosh_dist(-c * lorentz.elementwise_inner(a, b, c), c, eps)

  return _factors_last(jax.vmap(one_factor)(xs, ys, curvs))


def aggregate(distances, aggregation: str = "l1", axis: int = -1) -> jax.Array:
  """Per-factor distances -> one distance: "l1" their mean, "l2" the root
  of the mean of their squares; `axis` is the factor axis."""
  if aggregation == "l1":
    return jnp.mean(distances, axis=axis)
  if aggregation == "l2":
    # safe_sqrt: the derivative of sqrt at 0 (all factors at distance 0)
    # would be infinite; the floor (smallest normal) leaves every other
    # value exact and gives a zero derivative there.
    return safe.safe_sqrt(jnp.mean(distances * distances, axis=axis))
  raise ValueError(f"aggregation={aggregation!r}; valid: {list(AGGREGATIONS)}")


def pairwise_dist(x, y, curvs, aggregation: str = "l1", eps: float = 0.0) -> jax.Array:
  """Product distance of all pairs. (N, K d), (M, K d) -> (N, M)."""
  return aggregate(factor_pairwise_dist(x, y, curvs, eps), aggregation, axis=0)


def elementwise_dist(x, y, curvs, aggregation: str = "l1", eps: float = 0.0) -> jax.Array:
  """Product distance of x_i and y_i. (..., K d) -> (...)."""
  return aggregate(factor_elementwise_dist(x, y, curvs, eps), aggregation)


def factor_dist_to_origin(x, curvs) -> jax.Array:
  """Each factor's distance from its origin. (..., K d) -> (..., K)."""
  curvs, xs = _prepared(curvs, x)
  return _factors_last(jax.vmap(lorentz.dist_to_origin)(xs, curvs))


def dist_to_origin(x, curvs, aggregation: str = "l1") -> jax.Array:
  """Product distance from the origin (all factors' origins). (..., K d) -> (...)."""
  return aggregate(factor_dist_to_origin(x, curvs), aggregation)


# -- entailment cones ----------------------------------------------------------
def _half_aperture_release(x, curv, min_radius, eps):
  # The release: asin(clamp(2K / (sqrt(c)|x| + eps), -1 + eps, 1 - eps)).
  ratio = 2.0 * min_radius / (jnp.sqrt(curv) * safe.safe_norm(x) + eps)
  return safe.asin(jnp.clip(ratio, -1.0 + eps, 1.0 - eps))


def half_aperture(x, curvs, min_radius: float = 0.1, eps: float = 0.0) -> jax.Array:
  """Per-factor half aperture of the entailment cone at x. (..., K d) -> (..., K)."""
  curvs, xs = _prepared(curvs, x)
  if eps:
    per_factor = jax.vmap(lambda a, c: _half_aperture_release(a, c, min_radius, eps))
  else:
    per_factor = jax.vmap(lambda a, c: lorentz.half_aperture(a, c, min_radius=min_radius))
  return _factors_last(per_factor(xs, curvs))


def _oxy_angle_release(x, y, curv, eps):
  # The release's law of cosines: acos(clamp(num / (|x| sqrt(max(a^2 - 1,
  # eps)) + eps), -1 + eps, 1 - eps)), a = -c <x, y>_L; (a-1)(a+1) is the
  # same a^2 - 1 with less cancellation.
  x_time = lorentz.time_component(x, curv)
  y_time = lorentz.time_component(y, curv)
  scaled_inner = curv * lorentz.elementwise_inner(x, y, curv)
  numerator = y_time + scaled_inner * x_time
  sinh_dist = jnp.sqrt(jnp.maximum((scaled_inner - 1.0) * (scaled_inner + 1.0), eps))
  ratio = numerator / (safe.safe_norm(x) * sinh_dist + eps)
  return safe.acos(jnp.clip(ratio, -1.0 + eps, 1.0 - eps))


def oxy_angle(x, y, curvs, eps: float = 0.0) -> jax.Array:
  """Per-factor exterior angle at x_k towards y_k. (..., K d) -> (..., K)."""
  curvs, xs, ys = _prepared(curvs, x, y)
  if eps:
    per_factor = jax.vmap(lambda a, b, c: _oxy_angle_release(a, b, c, eps))
  else:
    per_factor = jax.vmap(lorentz.oxy_angle)
  return _factors_last(per_factor(xs, ys, curvs))
