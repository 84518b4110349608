"""Poincare ball model of curvature -c: the open ball of radius 1/sqrt(c).

Points are arrays of shape (..., D). The HCL paper parameterises the ball by
its radius r; then c = 1 / r^2. The argument `curv` (c in the formulas, the
same name as in `lorentz`) may be a Python float or a (possibly traced) scalar.

Numerics as in `lorentz`: float32 compute (bf16/f16 upcast, f64 kept),
Precision.HIGHEST matmuls, singular functions from `safe`. Keep points
strictly inside the ball with `project` (eps 4e-3 in float32, as geoopt):
close to the boundary 1 - c|x|^2 has no correct digits left in float32.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from hyperbolic_vl.geometry import safe

__all__ = [
  "mobius_add",
  "dist",
  "pairwise_dist",
  "exp_map0",
  "log_map0",
  "project",
  "inverse_metric_scale",
  "scale_grad_by_inverse_metric",
]

_HIGHEST = jax.lax.Precision.HIGHEST

# Lower clamp for sqrt(c)|v| in the tanh(r)/r and atanh(r)/r ratios: both tend
# to 1 as r -> 0; clamping numerator and denominator to the same 1e-8 gives
# exactly 1 (and a zero derivative of the ratio) instead of 0/0 at v = 0.
_SMALL_RADIUS = 1e-8

# Floor for the Mobius denominators 1 + 2c<x,y> + c^2|x|^2|y|^2 (and the
# distance's 1 - 2c<x,y> + c^2|x|^2|y|^2). Both are >= (1 - c|x||y|)^2 > 0
# inside the ball and only reach 0 for two boundary points; the floor keeps
# that case (and 1/den^2 in the backward pass, 1e30) finite, as geoopt.
_DENOMINATOR_FLOOR = 1e-15


def mobius_add(x, y, curv) -> jax.Array:
  """Mobius addition x (+) y. x, y broadcast-compatible (..., D) -> (..., D).

  ((1 + 2c<x,y> + c|y|^2) x + (1 - c|x|^2) y) / (1 + 2c<x,y> + c^2|x|^2|y|^2)
  """
  curv, x, y = safe.prepare(curv, x, y)
  inner = jnp.sum(x * y, axis=-1, keepdims=True)
  x_sq = safe.squared_norm(x, keepdims=True)
  y_sq = safe.squared_norm(y, keepdims=True)
  numerator = (1.0 + 2.0 * curv * inner + curv * y_sq) * x + (1.0 - curv * x_sq) * y
  denominator = 1.0 + 2.0 * curv * inner + curv * curv * x_sq * y_sq
  # Floor: see _DENOMINATOR_FLOOR.
  return numerator / jnp.maximum(denominator, _DENOMINATOR_FLOOR)


def _dist_from_parts(curv, diff_norm, inner, x_sq, y_sq):
  """2/sqrt(c) atanh(sqrt(c) |(-x) (+) y|) from Euclidean invariants.

  Uses |(-x) (+) y| = |x - y| / sqrt(1 - 2c<x,y> + c^2 |x|^2 |y|^2), which is
  exactly 0 for identical points when |x - y| is computed directly.
  """
  gyro_denominator = 1.0 - 2.0 * curv * inner + curv * curv * x_sq * y_sq
  # Floor: see _DENOMINATOR_FLOOR.
  gyro_denominator = jnp.maximum(gyro_denominator, _DENOMINATOR_FLOOR)
  sqrt_c = jnp.sqrt(curv)
  # safe.atanh clips the argument below 1 (points at the boundary).
  return 2.0 / sqrt_c * safe.atanh(sqrt_c * diff_norm / jnp.sqrt(gyro_denominator))


def dist(x, y, curv) -> jax.Array:
  """Geodesic distance between x_i and y_i. (..., D), (..., D) -> (...).

  d = 2/sqrt(c) atanh(sqrt(c) |(-x) (+) y|) (equivalently
  acosh(1 + 2c|x-y|^2 / ((1-c|x|^2)(1-c|y|^2))) / sqrt(c)).
  """
  curv, x, y = safe.prepare(curv, x, y)
  return _dist_from_parts(
    curv,
    safe.safe_norm(x - y),
    jnp.sum(x * y, axis=-1),
    safe.squared_norm(x),
    safe.squared_norm(y),
  )


def pairwise_dist(x, y, curv) -> jax.Array:
  """Distances of all pairs. x: (N, D), y: (M, D) -> (N, M).

  |x_i - y_j|^2 comes from a HIGHEST-precision Gram matrix,
  |x|^2 + |y|^2 - 2<x,y>, which cancels for (near-)duplicates: the diagonal
  of pairwise_dist(x, x) is ~sqrt(eps)|x| times the conformal factor
  2/(1 - c|x|^2) (~1e-3, up to ~1e-2 near the boundary, in f32), not 0.
  Use `dist` (direct |x - y|, exactly 0 for x == y) for matched pairs.
  """
  curv, x, y = safe.prepare(curv, x, y)
  inner = jnp.matmul(x, jnp.swapaxes(y, -1, -2), precision=_HIGHEST)
  x_sq = safe.squared_norm(x)[..., :, None]
  y_sq = safe.squared_norm(y)[..., None, :]
  # safe_sqrt: the rounded squared difference can be slightly negative for
  # duplicates; the floor maps it to ~0 with a finite (zero) gradient.
  diff_norm = safe.safe_sqrt(x_sq + y_sq - 2.0 * inner)
  return _dist_from_parts(curv, diff_norm, inner, x_sq, y_sq)


def exp_map0(v, curv) -> jax.Array:
  """Exponential map at the origin: tanh(sqrt(c)|v|) v / (sqrt(c)|v|).

  (..., D) -> (..., D). For sqrt(c)|v| >~ 9 tanh rounds to 1 in float32 and
  the result lies on the boundary: apply `project` afterwards.
  """
  curv, v = safe.prepare(curv, v)
  radius = jnp.sqrt(curv) * safe.safe_norm(v, keepdims=True)
  # Lower clamp: see _SMALL_RADIUS.
  radius = jnp.maximum(radius, _SMALL_RADIUS)
  return jnp.tanh(radius) / radius * v


def log_map0(y, curv) -> jax.Array:
  """Logarithmic map at the origin: atanh(sqrt(c)|y|) y / (sqrt(c)|y|).

  (..., D) -> (..., D). safe.atanh clips sqrt(c)|y| below 1 for boundary points.
  """
  curv, y = safe.prepare(curv, y)
  radius = jnp.sqrt(curv) * safe.safe_norm(y, keepdims=True)
  # Lower clamp: see _SMALL_RADIUS.
  radius = jnp.maximum(radius, _SMALL_RADIUS)
  return safe.atanh(radius) / radius * y


def project(x, curv, eps=4e-3) -> jax.Array:
  """Rescale points with |x| > (1 - eps)/sqrt(c) onto that radius.

  (..., D) -> (..., D); points already inside are returned unchanged. eps
  4e-3 is geoopt's float32 value: at that radius 1 - c|x|^2 ~ 8e-3 still has
  ~5 correct digits in float32 (use a smaller eps, e.g. 1e-5, for float64).
  """
  curv, x = safe.prepare(curv, x)
  max_norm = (1.0 - eps) / jnp.sqrt(curv)
  norm = safe.safe_norm(x, keepdims=True)
  # max_norm / max(norm, max_norm) = min(1, max_norm / norm): never divides
  # by a small norm, so there is no 0/0 at x = 0 and no where() needed.
  return x * (max_norm / jnp.maximum(norm, max_norm))


def inverse_metric_scale(x, curv) -> jax.Array:
  """(1 - c|x|^2)^2 / 4 = 1 / lambda_x^2, the Riemannian gradient rescale.

  (..., D) -> (...). The Riemannian gradient is inverse_metric_scale(x) times
  the Euclidean gradient (Nickel & Kiela's RSGD).
  """
  curv, x = safe.prepare(curv, x)
  return (1.0 - curv * safe.squared_norm(x)) ** 2 / 4.0


@jax.custom_vjp
def _scale_grad(x, curv):
  return x


def _scale_grad_fwd(x, curv):
  return x, (x, curv)


def _scale_grad_bwd(residuals, cotangent):
  x, curv = residuals
  # c only enters the backward rule, not the value: its cotangent is 0.
  return cotangent * inverse_metric_scale(x, curv)[..., None], jnp.zeros_like(curv)


_scale_grad.defvjp(_scale_grad_fwd, _scale_grad_bwd)


def scale_grad_by_inverse_metric(x, curv) -> jax.Array:
  """Identity on x whose backward multiplies the cotangent by (1 - c|x|^2)^2/4.

  (..., D) -> (..., D) (upcast to float32 like every function here). Wrap a
  ball-valued parameter with it so plain SGD/Adam on the Euclidean gradient
  performs the RSGD rescale; the gradient with respect to c is zero.
  """
  curv, x = safe.prepare(curv, x)
  return _scale_grad(x, curv)


# HCL's lift of a Euclidean feature onto the ball of radius r.
BALL_CLIPS = ("point", "tangent")
# Largest point norm on the ball, as a fraction of r, for ball_clip="point".
BOUNDARY_FRACTION = 1.0 - 1e-3


def to_ball(
  v: jax.Array,
  radius: float,
  eps: float,
  scale_grad: bool,
  input_scale: float = 1.0,
  clip: str = "point",
) -> jax.Array:
  """z = exp_0^c(s v), c = 1/r^2, kept inside the ball; optional RSGD rescale.

  clip="point" (default; HCL's released code): the point is projected back
  to norm (1 - 1e-3) r when the map puts it farther out, so embeddings can
  approach the boundary where the inverse metric slows their gradients.
  clip="tangent" (our earlier reading): the tangent norm is clipped at r - eps
  before the map, which caps |z| at tanh(1 - eps/r) r ~ 0.76 r.

  s = input_scale (HCL's objective.hyp_input_scale): a fixed factor like MERU's
  alpha. The MoCo head's outputs have norms ~sqrt(embed_dim) > r at init, and
  clipped vectors have a zero gradient along their norm, so without it every
  embedding sits at the clip radius and the norm can carry no information.
  """
  if clip not in BALL_CLIPS:
    raise ValueError(f"ball_clip={clip!r}; valid: {BALL_CLIPS}")
  curv = 1.0 / radius**2
  v = v * input_scale
  if clip == "tangent":
    norm = safe.safe_norm(v, keepdims=True)
    v = v * jnp.minimum(1.0, (radius - eps) / norm)
  z = exp_map0(v, curv)
  if clip == "point":
    norm = safe.safe_norm(z, keepdims=True)
    z = z * jnp.minimum(1.0, BOUNDARY_FRACTION * radius / norm)
  if scale_grad:
    z = scale_grad_by_inverse_metric(z, curv)
  return z
