"""Tests for hyperbolic_vl.geometry (safe, lorentz, poincare).

1. Values against float64 NumPy reference implementations written here from
   textbook formulas (independent of the code where possible: e.g. angles from
   the hyperbolic law of cosines, Poincare/Klein maps from geodesic distances).
2. Geometric properties: round trips, symmetry, triangle inequality, midpoints.
3. Finite values AND finite gradients (w.r.t. points and curvature) for every
   function at the hard inputs: identical points, zero vectors, huge and tiny
   norms, bfloat16 inputs.
"""

from __future__ import annotations

import math
import zlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from model_refs import fast_compile_jit

from hyperbolic_vl.geometry import lorentz, poincare, safe

CURVATURES = (0.1, 1.0, 2.5)
DIM = 8


# ---------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------
def random_points(rng, n, dim=DIM, low=0.1, high=3.0):
  """n vectors with uniformly random directions and norms in [low, high]."""
  directions = rng.normal(size=(n, dim))
  directions /= np.linalg.norm(directions, axis=-1, keepdims=True)
  return directions * rng.uniform(low, high, size=(n, 1))


def random_ball_points(rng, n, c, dim=DIM):
  """Points of the ball of radius 1/sqrt(c), with sqrt(c)|p| in [0.05, 0.9]."""
  return random_points(rng, n, dim, 0.05, 0.9) / math.sqrt(c)


@pytest.fixture(params=["float32", "float64"])
def precision(request):
  """(numpy dtype, relative tolerance); float64 runs inside enable_x64.

  The context manager (not the global config) keeps x64 confined to this
  test: other test modules run in the same process.
  """
  if request.param == "float64":
    with jax.enable_x64(True):
      yield np.float64, 1e-6
  else:
    yield np.float32, 1e-4


class _Jitted:
  """A module's functions, each fast-compiled once per argument shapes and
  dtypes (the curvature traced, so one compile serves every curvature):
  eagerly every op of every call compiles on its own. For the property
  tests; test_reference_table_eager_matches_jit keeps an eager spot check."""

  def __init__(self, module):
    self._module = module

  def __getattr__(self, name):
    function = fast_compile_jit(getattr(self._module, name))
    setattr(self, name, function)
    return function


jitted_lorentz, jitted_poincare = _Jitted(lorentz), _Jitted(poincare)


def assert_relative_close(actual, expected, rtol, vector=False):
  """Relative error check against a float64 reference.

  vector=True: normwise per row, |a - e| / |e| <= rtol (components of a
  vector carry absolute errors ~ eps|vector|, so componentwise relative
  error is meaningless for near-zero components). Otherwise elementwise with
  an absolute floor of 1e-3 * rtol for near-zero values.
  """
  actual = np.asarray(actual, np.float64)
  expected = np.asarray(expected, np.float64)
  assert actual.shape == expected.shape, (actual.shape, expected.shape)
  assert np.all(np.isfinite(actual))
  if vector:
    error = np.linalg.norm(actual - expected, axis=-1)
    scale = np.linalg.norm(expected, axis=-1)
  else:
    error = np.abs(actual - expected)
    scale = np.abs(expected)
  worst = np.max(error / (scale + 1e-3))
  assert worst <= rtol, f"relative error {worst:.3g} > {rtol:.3g}"


# ---------------------------------------------------------------------------
# float64 NumPy references (textbook formulas)
# ---------------------------------------------------------------------------
def np_norm(x, keepdims=False):
  return np.linalg.norm(x, axis=-1, keepdims=keepdims)


def ref_time(x, c):
  return np.sqrt(1.0 / c + np.sum(x * x, -1))


def ref_ambient(x, c):
  """Full hyperboloid coordinates [space, time]."""
  return np.concatenate([x, ref_time(x, c)[..., None]], -1)


def ref_minkowski(a, b):
  return np.sum(a[..., :-1] * b[..., :-1], -1) - a[..., -1] * b[..., -1]


def ref_inner(x, y, c):
  return ref_minkowski(ref_ambient(x, c), ref_ambient(y, c))


def ref_pairwise_inner(x, y, c):
  return ref_inner(x[:, None, :], y[None, :, :], c)


def ref_dist(x, y, c):
  return np.arccosh(np.maximum(-c * ref_inner(x, y, c), 1.0)) / np.sqrt(c)


def ref_pairwise_dist(x, y, c):
  return ref_dist(x[:, None, :], y[None, :, :], c)


def ref_exp_map0(v, c):
  """Ambient exp map at the origin O = (0, 1/sqrt(c)): cosh(r) O + sinh(r) v / r."""
  r = np.sqrt(c) * np_norm(v, keepdims=True)
  origin = np.zeros(v.shape[:-1] + (v.shape[-1] + 1,))
  origin[..., -1] = 1.0 / np.sqrt(c)
  tangent = np.concatenate([v, np.zeros(v.shape[:-1] + (1,))], -1)
  ambient = np.cosh(r) * origin + np.sinh(r) * tangent / r
  return ambient[..., :-1]


def ref_log_map0(x, c):
  sqrt_c = np.sqrt(c)
  distance = np.arccosh(sqrt_c * ref_time(x, c))[..., None]
  return distance * x / (sqrt_c * np_norm(x, keepdims=True))


def ref_dist_to_origin(x, c):
  return ref_dist(np.zeros_like(x), x, c)


def ref_half_aperture(x, c, min_radius=0.1):
  return np.arcsin(np.minimum(2 * min_radius / (np.sqrt(c) * np_norm(x)), 1.0))


def ref_oxy_angle(x, y, c):
  """pi - interior angle at x of the triangle O, x, y (law of cosines)."""
  sqrt_c = np.sqrt(c)
  zeros = np.zeros_like(x)
  side_ox = sqrt_c * ref_dist(zeros, x, c)
  side_xy = sqrt_c * ref_dist(x, y, c)
  side_oy = sqrt_c * ref_dist(np.zeros_like(y), y, c)
  cos_interior = (np.cosh(side_ox) * np.cosh(side_xy) - np.cosh(side_oy)) / (
    np.sinh(side_ox) * np.sinh(side_xy)
  )
  return np.pi - np.arccos(np.clip(cos_interior, -1, 1))


def ref_geodesic(x, y, t, c):
  ambient_x, ambient_y = ref_ambient(x, c), ref_ambient(y, c)
  d = np.arccosh(-c * ref_minkowski(ambient_x, ambient_y))[..., None]
  point = (np.sinh((1 - t) * d) * ambient_x + np.sinh(t * d) * ambient_y) / np.sinh(d)
  return point[..., :-1]


def ref_to_ball(x, c, half):
  """Poincare (half=True) / Klein (half=False) point of a Lorentz point.

  A point at distance d from the origin in direction u sits at radius
  tanh(sqrt(c) d / 2)/sqrt(c) in the Poincare ball and tanh(sqrt(c) d)/sqrt(c)
  in the Klein ball.
  """
  sqrt_c = np.sqrt(c)
  scaled = sqrt_c * ref_dist_to_origin(x, c)[..., None]
  scaled = scaled / 2 if half else scaled
  return np.tanh(scaled) / sqrt_c * x / np_norm(x, keepdims=True)


def ref_from_ball(p, c, half):
  sqrt_c = np.sqrt(c)
  scaled = np.arctanh(sqrt_c * np_norm(p, keepdims=True))
  scaled = 2 * scaled if half else scaled
  return np.sinh(scaled) / sqrt_c * p / np_norm(p, keepdims=True)


def ref_einstein_midpoint(x, c, weights):
  sqrt_c = np.sqrt(c)
  klein = x / (sqrt_c * ref_time(x, c)[:, None])
  gamma = 1 / np.sqrt(1 - c * np.sum(klein**2, -1))
  midpoint = np.sum((weights * gamma)[:, None] * klein, 0) / np.sum(weights * gamma)
  return midpoint / np.sqrt(1 - c * np.sum(midpoint**2))


def ref_mobius_add(x, y, c):
  xy = np.sum(x * y, -1, keepdims=True)
  x2 = np.sum(x * x, -1, keepdims=True)
  y2 = np.sum(y * y, -1, keepdims=True)
  return ((1 + 2 * c * xy + c * y2) * x + (1 - c * x2) * y) / (1 + 2 * c * xy + c**2 * x2 * y2)


def ref_ball_dist(x, y, c):
  sqrt_c = np.sqrt(c)
  return 2 / sqrt_c * np.arctanh(sqrt_c * np_norm(ref_mobius_add(-x, y, c)))


def ref_ball_exp_map0(v, c):
  r = np.sqrt(c) * np_norm(v, keepdims=True)
  return np.tanh(r) * v / r


def ref_ball_log_map0(y, c):
  r = np.sqrt(c) * np_norm(y, keepdims=True)
  return np.arctanh(r) * y / r


def ref_project(x, c, eps=4e-3):
  max_norm = (1 - eps) / np.sqrt(c)
  norm = np_norm(x, keepdims=True)
  return np.where(norm > max_norm, x / norm * max_norm, x)


def ref_inverse_metric_scale(x, c):
  conformal_factor = 2 / (1 - c * np.sum(x * x, -1))
  return 1 / conformal_factor**2


# (name, implementation(x, y, c), reference(x, y, c), inputs, vector-valued)
# inputs: "lorentz" = space components with norms 0.1..3; "ball" = points of
# the Poincare ball; "tangent" = tangent vectors with norms 0.1..3.
T_GRID = np.array([[0.25], [0.5], [1.0]])  # t = 0 is 0/0 in the textbook log map
TWO_STEP_T = np.array([[0.3], [0.8]])
MIDPOINT_WEIGHTS = np.array([0.5, 1.0, 2.0, 0.25, 1.5, 1.0])
REFERENCE_CASES = [
  (
    "time_component",
    lambda x, y, c: lorentz.time_component(x, c),
    lambda x, y, c: ref_time(x, c),
    "lorentz",
    False,
  ),
  ("pairwise_inner", lorentz.pairwise_inner, ref_pairwise_inner, "lorentz", False),
  ("elementwise_inner", lorentz.elementwise_inner, ref_inner, "lorentz", False),
  ("pairwise_dist", lorentz.pairwise_dist, ref_pairwise_dist, "lorentz", False),
  ("elementwise_dist", lorentz.elementwise_dist, ref_dist, "lorentz", False),
  (
    "exp_map0",
    lambda x, y, c: lorentz.exp_map0(x, c),
    lambda x, y, c: ref_exp_map0(x, c),
    "tangent",
    True,
  ),
  (
    "log_map0",
    lambda x, y, c: lorentz.log_map0(x, c),
    lambda x, y, c: ref_log_map0(x, c),
    "lorentz",
    True,
  ),
  (
    "dist_to_origin",
    lambda x, y, c: lorentz.dist_to_origin(x, c),
    lambda x, y, c: ref_dist_to_origin(x, c),
    "lorentz",
    False,
  ),
  (
    "half_aperture",
    lambda x, y, c: lorentz.half_aperture(x, c),
    lambda x, y, c: ref_half_aperture(x, c),
    "lorentz",
    False,
  ),
  ("oxy_angle", lorentz.oxy_angle, ref_oxy_angle, "lorentz", False),
  (
    "pairwise_oxy_angle",
    lorentz.pairwise_oxy_angle,
    lambda x, y, c: ref_oxy_angle(x[:, None, :], y[None, :, :], c),
    "lorentz",
    False,
  ),
  (
    "interpolate_to_origin",
    lambda x, y, c: lorentz.interpolate_to_origin(x[0], T_GRID.astype(x.dtype), c),
    lambda x, y, c: ref_exp_map0(T_GRID * ref_log_map0(x[0], c), c),
    "lorentz",
    True,
  ),
  (
    "geodesic_interpolate",
    lambda x, y, c: lorentz.geodesic_interpolate(x, y, TWO_STEP_T[:, None].astype(x.dtype), c),
    lambda x, y, c: ref_geodesic(x, y, TWO_STEP_T[:, None], c),
    "lorentz",
    True,
  ),
  (
    "to_poincare",
    lambda x, y, c: lorentz.to_poincare(x, c),
    lambda x, y, c: ref_to_ball(x, c, True),
    "lorentz",
    True,
  ),
  (
    "from_poincare",
    lambda x, y, c: lorentz.from_poincare(x, c),
    lambda x, y, c: ref_from_ball(x, c, True),
    "ball",
    True,
  ),
  (
    "to_klein",
    lambda x, y, c: lorentz.to_klein(x, c),
    lambda x, y, c: ref_to_ball(x, c, False),
    "lorentz",
    True,
  ),
  (
    "from_klein",
    lambda x, y, c: lorentz.from_klein(x, c),
    lambda x, y, c: ref_from_ball(x, c, False),
    "ball",
    True,
  ),
  (
    "einstein_midpoint",
    lambda x, y, c: lorentz.einstein_midpoint(x, c, MIDPOINT_WEIGHTS.astype(x.dtype)),
    lambda x, y, c: ref_einstein_midpoint(x, c, MIDPOINT_WEIGHTS),
    "lorentz",
    True,
  ),
  ("poincare.mobius_add", poincare.mobius_add, ref_mobius_add, "ball", True),
  ("poincare.dist", poincare.dist, ref_ball_dist, "ball", False),
  (
    "poincare.pairwise_dist",
    poincare.pairwise_dist,
    lambda x, y, c: ref_ball_dist(x[:, None, :], y[None, :, :], c),
    "ball",
    False,
  ),
  (
    "poincare.exp_map0",
    lambda x, y, c: poincare.exp_map0(x, c),
    lambda x, y, c: ref_ball_exp_map0(x, c),
    "tangent",
    True,
  ),
  (
    "poincare.log_map0",
    lambda x, y, c: poincare.log_map0(x, c),
    lambda x, y, c: ref_ball_log_map0(x, c),
    "ball",
    True,
  ),
  (
    "poincare.project",
    # 1.3x pushes about a third of the points outside the ball.
    lambda x, y, c: poincare.project(1.3 * x, c),
    lambda x, y, c: ref_project(1.3 * x, c),
    "ball",
    True,
  ),
  (
    "poincare.inverse_metric_scale",
    lambda x, y, c: poincare.inverse_metric_scale(x, c),
    lambda x, y, c: ref_inverse_metric_scale(x, c),
    "ball",
    False,
  ),
]


def _reference_inputs(name, inputs, curv):
  # crc32, not hash(): str hashes are salted per process (PYTHONHASHSEED).
  rng = np.random.default_rng(zlib.crc32(f"{name}|{curv}".encode()))
  if inputs == "ball":
    return random_ball_points(rng, 6, curv), random_ball_points(rng, 6, curv)
  return random_points(rng, 6), random_points(rng, 6)


_IMPLEMENTATION_OUTPUTS = {}


def _implementation_outputs(dtype):
  """Outputs of every implementation for every (case, curvature), per dtype.

  All cases run in ONE jit-compiled program (curvature traced): eager mode
  compiles every primitive separately, which made this table the slowest
  part of the file. Cached per dtype; call inside the dtype's x64 context.
  """
  key = np.dtype(dtype).name
  if key not in _IMPLEMENTATION_OUTPUTS:
    inputs = {
      f"{name}|{curv}": tuple(np.asarray(a, dtype) for a in _reference_inputs(name, kind, curv))
      for name, _, _, kind, _ in REFERENCE_CASES
      for curv in CURVATURES
    }
    curvatures = {
      f"{name}|{curv}": np.asarray(curv, dtype)
      for name, *_ in REFERENCE_CASES
      for curv in CURVATURES
    }
    implementations = {name: implementation for name, implementation, *_ in REFERENCE_CASES}

    @fast_compile_jit
    def run_all(inputs, curvatures):
      return {
        key: implementations[key.split("|")[0]](x, y, curvatures[key])
        for key, (x, y) in inputs.items()
      }

    _IMPLEMENTATION_OUTPUTS[key] = jax.device_get(run_all(inputs, curvatures))
  return _IMPLEMENTATION_OUTPUTS[key]


@pytest.mark.parametrize("curv", CURVATURES)
@pytest.mark.parametrize(
  "name, implementation, reference, inputs, vector",
  REFERENCE_CASES,
  ids=[case[0] for case in REFERENCE_CASES],
)
def test_matches_float64_reference(
  precision, curv, name, implementation, reference, inputs, vector
):
  dtype, rtol = precision
  x, y = _reference_inputs(name, inputs, curv)
  expected = reference(x, y, curv)
  actual = _implementation_outputs(dtype)[f"{name}|{curv}"]
  assert actual.dtype == dtype
  assert_relative_close(actual, expected, rtol, vector)


def test_reference_table_eager_matches_jit():
  """The table above runs under jit; spot-check eager mode gives the same."""
  x, y = _reference_inputs("oxy_angle", "lorentz", 1.0)
  eager = lorentz.pairwise_oxy_angle(np.float32(x), np.float32(y), 1.0)
  np.testing.assert_allclose(eager, ref_oxy_angle(x[:, None], y[None], 1.0), rtol=1e-4)


# ---------------------------------------------------------------------------
# safe.py
# ---------------------------------------------------------------------------
def test_naive_clamped_acosh_has_nan_gradient_but_safe_acosh_does_not():
  """Why safe.py exists: a literal port of MERU's clamp NaNs in JAX.

  In float32 1 + 1e-8 == 1, so the clamp sits on the singularity: at a == 1
  the derivative is inf, and just below 1 (what -c<x,x>_L of identical points
  rounds to) clip's zero derivative meets arccosh'(1) = inf: 0 * inf = NaN.
  """

  def naive(a):
    return jnp.arccosh(jnp.clip(a, 1 + 1e-8))

  at_one = jnp.float32(1.0)
  below_one = jnp.nextafter(at_one, jnp.float32(0.0))
  assert not np.isfinite(jax.grad(naive)(at_one))
  assert np.isnan(jax.grad(naive)(below_one))
  for a in (at_one, below_one):
    assert safe.acosh(a) == 0.0
    gradient = jax.grad(safe.acosh)(a)
    assert np.isfinite(gradient) and 1e3 < gradient < 1e4  # capped, ~2e3


def test_safe_functions_match_numpy_inside_domain():
  grid = np.linspace(-0.95, 0.95, 11)
  np.testing.assert_allclose(
    safe.asin(grid.astype(np.float32)), np.arcsin(grid), rtol=1e-6, atol=1e-7
  )
  np.testing.assert_allclose(safe.acos(grid.astype(np.float32)), np.arccos(grid), rtol=1e-6)
  np.testing.assert_allclose(
    safe.atanh(grid.astype(np.float32)), np.arctanh(grid), rtol=1e-5, atol=1e-7
  )
  large = np.linspace(1.01, 20.0, 11)
  np.testing.assert_allclose(safe.acosh(large.astype(np.float32)), np.arccosh(large), rtol=1e-6)
  # Derivatives inside the domain are the exact ones.
  np.testing.assert_allclose(
    jax.vmap(jax.grad(safe.asin))(grid.astype(np.float32)), 1 / np.sqrt(1 - grid**2), rtol=1e-5
  )
  np.testing.assert_allclose(
    jax.vmap(jax.grad(safe.acos))(grid.astype(np.float32)), -1 / np.sqrt(1 - grid**2), rtol=1e-5
  )
  np.testing.assert_allclose(
    jax.vmap(jax.grad(safe.atanh))(grid.astype(np.float32)), 1 / (1 - grid**2), rtol=1e-5
  )
  np.testing.assert_allclose(
    jax.vmap(jax.grad(safe.acosh))(large.astype(np.float32)), 1 / np.sqrt(large**2 - 1), rtol=1e-5
  )


SAFE_FUNCTIONS = (safe.acosh, safe.asin, safe.acos, safe.atanh)


@jax.jit
def _safe_values_and_gradients(edges):
  """(value, derivative) of every safe function at `edges`, one computation
  (eagerly, each op of each function and gradient is its own compile)."""
  return [(function(edges), jax.vmap(jax.grad(function))(edges)) for function in SAFE_FUNCTIONS]


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_safe_functions_finite_at_and_beyond_singularities(dtype):
  edges = np.asarray([-2.0, -1.0, 1.0, 2.0, 0.0], dtype)
  for function, (values, gradients) in zip(SAFE_FUNCTIONS, _safe_values_and_gradients(edges)):
    assert values.dtype == jnp.float32
    assert np.all(np.isfinite(values)), function
    assert np.all(np.isfinite(gradients)), function
  # Beyond +-1 the asin/acos value is constant, so the derivative is 0.
  beyond = np.float32([-2.0, 2.0])
  (_, _), (asin, asin_gradient), (acos, _), _ = _safe_values_and_gradients(beyond)
  assert np.all(asin_gradient == 0.0)
  np.testing.assert_allclose(asin, [-np.pi / 2, np.pi / 2])
  np.testing.assert_allclose(acos, [np.pi, 0.0], atol=1e-7)


def test_safe_functions_float64():
  with jax.enable_x64(True):
    a = jnp.asarray([1.0, 1.5], jnp.float64)
    assert safe.acosh(a).dtype == jnp.float64
    assert np.all(np.isfinite(jax.vmap(jax.grad(safe.acosh))(a)))
    np.testing.assert_allclose(safe.acosh(a), np.arccosh([1.0, 1.5]), rtol=1e-14)
    np.testing.assert_allclose(safe.atanh(jnp.asarray(0.5)), np.arctanh(0.5), rtol=1e-14)


def test_safe_norm_value_and_gradient_at_zero():
  x = jnp.asarray([[3.0, 4.0], [0.0, 0.0]])
  np.testing.assert_allclose(safe.safe_norm(x), [5.0, 0.0], atol=1e-18)
  gradient = jax.grad(lambda x: safe.safe_norm(x).sum())(x)
  np.testing.assert_allclose(gradient, [[0.6, 0.8], [0.0, 0.0]], rtol=1e-6)
  # jnp.linalg.norm is what this replaces: NaN gradient at 0.
  assert np.isnan(jax.grad(lambda x: jnp.linalg.norm(x))(jnp.zeros(2))).all()
  assert safe.safe_norm(x, keepdims=True).shape == (2, 1)
  assert np.all(np.isfinite(jax.grad(lambda v: safe.safe_sqrt(v))(0.0)))


# ---------------------------------------------------------------------------
# lorentz.py properties
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("curv", CURVATURES)
def test_lorentz_exp_log_round_trip(curv):
  v = random_points(np.random.default_rng(1), 8).astype(np.float32)
  x = jitted_lorentz.exp_map0(v, curv)
  np.testing.assert_allclose(jitted_lorentz.log_map0(x, curv), v, rtol=1e-4, atol=1e-5)
  # |v| is the distance from the origin; the point lies on the hyperboloid.
  np.testing.assert_allclose(
    jitted_lorentz.dist_to_origin(x, curv), np.linalg.norm(v, axis=-1), rtol=1e-5
  )
  # <x,x>_L = |x|^2 - x_t^2 cancels: its float32 error is ~eps * x_t^2.
  residual = np.asarray(jitted_lorentz.elementwise_inner(x, x, curv)) + 1 / curv
  assert np.all(np.abs(residual) <= 4e-7 * np.asarray(jitted_lorentz.time_component(x, curv)) ** 2)
  # Small and tiny vectors: the maps are the identity to first order.
  small = np.float32([[1e-12, 0], [1e-6, -2e-6], [0, 0]])
  np.testing.assert_allclose(jitted_lorentz.exp_map0(small, curv), small, rtol=1e-6, atol=0)
  np.testing.assert_allclose(jitted_lorentz.log_map0(small, curv), small, rtol=1e-6, atol=0)


def test_lorentz_exp_map0_caps_radius_like_meru():
  v = jnp.asarray([[100.0, 0.0]])
  x = jitted_lorentz.exp_map0(v, 1.0)
  np.testing.assert_allclose(x, [[2.0**15, 0.0]], rtol=1e-6)


@pytest.mark.parametrize("module", [lorentz, poincare])
def test_exp_map0_jacobian_at_zero_is_identity(module):
  # Forward and reverse mode as one jitted computation (eagerly, each op of
  # each Jacobian is its own compile).
  both_modes = jax.jit(
    lambda v, curvatures: [
      jax.vmap(jacobian_of(module.exp_map0), in_axes=(None, 0))(v, curvatures)
      for jacobian_of in (jax.jacfwd, jax.jacrev)
    ]
  )
  for jacobians in both_modes(np.zeros(3, np.float32), np.float32(CURVATURES)):
    np.testing.assert_allclose(jacobians, np.broadcast_to(np.eye(3), (3, 3, 3)), atol=1e-6)


@pytest.mark.parametrize("curv", CURVATURES)
def test_model_round_trips(curv):
  x = random_points(np.random.default_rng(2), 8).astype(np.float32)
  np.testing.assert_allclose(
    jitted_lorentz.from_poincare(jitted_lorentz.to_poincare(x, curv), curv), x, rtol=1e-4, atol=1e-5
  )
  np.testing.assert_allclose(
    jitted_lorentz.from_klein(jitted_lorentz.to_klein(x, curv), curv), x, rtol=1e-4, atol=1e-5
  )
  # Both balls have radius 1/sqrt(c).
  assert np.all(np.linalg.norm(jitted_lorentz.to_poincare(x, curv), axis=-1) < 1 / np.sqrt(curv))
  assert np.all(np.linalg.norm(jitted_lorentz.to_klein(x, curv), axis=-1) < 1 / np.sqrt(curv))
  # Lorentz and Poincare distances agree (isometry).
  y = random_points(np.random.default_rng(3), 8).astype(np.float32)
  np.testing.assert_allclose(
    jitted_poincare.dist(
      jitted_lorentz.to_poincare(x, curv), jitted_lorentz.to_poincare(y, curv), curv
    ),
    jitted_lorentz.elementwise_dist(x, y, curv),
    rtol=1e-4,
  )


@pytest.mark.parametrize("curv", CURVATURES)
def test_lorentz_distance_symmetric_zero_diagonal_and_triangle(curv):
  x = random_points(np.random.default_rng(4), 8).astype(np.float32)
  distances = np.asarray(jitted_lorentz.pairwise_dist(x, x, curv))
  np.testing.assert_allclose(distances, distances.T, rtol=1e-5, atol=1e-6)
  # Not exactly 0 in float32: -c<x,x>_L = c(x_t^2 - |x|^2) cancels to
  # 1 +- ~1e-6 and acosh(1 + d) ~ sqrt(2 d) turns that into ~1e-3.
  assert np.all(np.abs(np.diag(distances)) < 2e-3)
  # Pairwise and elementwise agree.
  y = random_points(np.random.default_rng(5), 8).astype(np.float32)
  np.testing.assert_allclose(
    np.diag(jitted_lorentz.pairwise_dist(x, y, curv)),
    jitted_lorentz.elementwise_dist(x, y, curv),
    rtol=1e-5,
  )
  np.testing.assert_allclose(
    np.diag(jitted_lorentz.pairwise_inner(x, y, curv)),
    jitted_lorentz.elementwise_inner(x, y, curv),
    rtol=1e-6,
  )
  np.testing.assert_allclose(
    np.diag(jitted_lorentz.pairwise_oxy_angle(x, y, curv)),
    jitted_lorentz.oxy_angle(x, y, curv),
    rtol=1e-5,
    atol=1e-6,
  )
  # Triangle inequality on all triples.
  triangle_slack = distances[:, None, :] - distances[:, :, None] - distances[None, :, :]
  assert np.all(triangle_slack <= 1e-4)


def test_lorentz_float64_identical_points_give_tiny_distance():
  with jax.enable_x64(True):
    x = random_points(np.random.default_rng(6), 8)
    diagonal = np.diag(jitted_lorentz.pairwise_dist(x, x, 1.0))
    assert diagonal.dtype == np.float64
    assert np.all(diagonal < 1e-6)


@jax.jit
def _midpoint_cases(x, curv):
  """Every midpoint and distance test_einstein_midpoint checks, for two
  points x (2, D), as one computation shared by the curvatures (eagerly,
  each op is its own compile)."""
  midpoint = lorentz.einstein_midpoint(x, curv)
  stacked = jnp.stack([x, x[::-1]], axis=0)  # (2 batches, 2 points, D)
  heavy = lorentz.einstein_midpoint(x, curv, weights=jnp.float32([100.0, 1.0]))
  return {
    "single": lorentz.einstein_midpoint(x[:1], curv),
    "batched": lorentz.einstein_midpoint(x[None], curv, axis=0),
    "midpoint": midpoint,
    "to_first": lorentz.elementwise_dist(midpoint, x[0], curv),
    "to_second": lorentz.elementwise_dist(midpoint, x[1], curv),
    "between": lorentz.elementwise_dist(x[0], x[1], curv),
    "geodesic": lorentz.geodesic_interpolate(x[0], x[1], 0.5, curv),
    # Axis handling: points along axis 1 with a weight vector.
    "along_axis_1": lorentz.einstein_midpoint(
      stacked, curv, weights=jnp.float32([1.0, 1.0]), axis=1
    ),
    "heavy_to_first": lorentz.elementwise_dist(heavy, x[0], curv),
  }


@pytest.mark.parametrize("curv", CURVATURES)
def test_einstein_midpoint(curv):
  rng = np.random.default_rng(7)
  x = random_points(rng, 2).astype(np.float32)
  got = _midpoint_cases(x, np.float32(curv))
  midpoint, to_first = got["midpoint"], got["to_first"]
  # Single point: the midpoint is the point itself (also with batch axes).
  np.testing.assert_allclose(got["single"], x[0], rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(got["batched"], x, rtol=1e-5, atol=1e-6)
  # Two points: on the geodesic, equidistant, equal to geodesic t = 0.5.
  np.testing.assert_allclose(to_first, got["to_second"], rtol=1e-4)
  np.testing.assert_allclose(to_first + got["to_second"], got["between"], rtol=1e-4)
  np.testing.assert_allclose(midpoint, got["geodesic"], rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(
    got["along_axis_1"], np.stack([midpoint, midpoint]), rtol=1e-5, atol=1e-6
  )
  # Weighting one point heavily pulls the midpoint towards it.
  assert got["heavy_to_first"] < 0.2 * to_first


@pytest.mark.parametrize("curv", CURVATURES)
def test_exterior_angle_on_and_against_the_ray(curv):
  x = random_points(np.random.default_rng(8), 8, low=0.5, high=2.0).astype(np.float32)
  beyond = jitted_lorentz.interpolate_to_origin(x, 1.7, curv)
  before = jitted_lorentz.interpolate_to_origin(x, 0.4, curv)
  # f32: the numerator y_t + x_t c<x,y>_L cancels (error ~eps x_t |a|) and
  # acos(1 - d) ~ sqrt(2 d) turns a ~1e-5 ratio error into ~5e-3 rad.
  np.testing.assert_allclose(jitted_lorentz.oxy_angle(x, beyond, curv), 0.0, atol=1e-2)
  np.testing.assert_allclose(jitted_lorentz.oxy_angle(x, before, curv), np.pi, atol=1e-2)
  with jax.enable_x64(True):
    x64 = np.asarray(x, np.float64)
    beyond = jitted_lorentz.interpolate_to_origin(x64, 1.7, curv)
    np.testing.assert_allclose(jitted_lorentz.oxy_angle(x64, beyond, curv), 0.0, atol=1e-6)


def test_half_aperture_saturates_and_decreases():
  for curv in CURVATURES:
    norms = np.linspace(0.01, 10.0, 200)
    x = np.stack([norms, np.zeros_like(norms)], -1).astype(np.float32)
    aperture = np.asarray(jitted_lorentz.half_aperture(x, curv))
    assert np.all(np.diff(aperture) <= 0)
    saturated = np.sqrt(curv) * norms <= 0.2  # 2 * min_radius
    np.testing.assert_allclose(aperture[saturated], np.pi / 2)
    assert np.all(np.diff(aperture[~saturated]) < 0)
    np.testing.assert_allclose(jitted_lorentz.half_aperture(np.zeros((1, 2)), curv), [np.pi / 2])


@pytest.mark.parametrize("curv", CURVATURES)
def test_interpolations(curv):
  rng = np.random.default_rng(9)
  x, y = random_points(rng, 1)[0].astype(np.float32), random_points(rng, 1)[0].astype(np.float32)
  steps = np.float32([[0.0], [0.3], [1.0]])
  along_ray = jitted_lorentz.interpolate_to_origin(x, steps, curv)
  assert along_ray.shape == (3, DIM)
  np.testing.assert_allclose(along_ray[0], 0.0, atol=1e-7)
  np.testing.assert_allclose(along_ray[2], x, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(
    jitted_lorentz.dist_to_origin(along_ray, curv),
    steps[:, 0] * jitted_lorentz.dist_to_origin(x, curv),
    rtol=1e-5,
    atol=1e-6,
  )
  path = jitted_lorentz.geodesic_interpolate(x, y, steps, curv)
  np.testing.assert_allclose(path[0], x, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(path[2], y, rtol=1e-4, atol=1e-5)
  total = jitted_lorentz.elementwise_dist(x, y, curv)
  np.testing.assert_allclose(
    jitted_lorentz.elementwise_dist(x, path[1], curv), 0.3 * total, rtol=1e-4
  )
  np.testing.assert_allclose(
    jitted_lorentz.elementwise_dist(path[1], y, curv), 0.7 * total, rtol=1e-4
  )
  # Identical endpoints: the path stays put.
  np.testing.assert_allclose(
    jitted_lorentz.geodesic_interpolate(x, x, steps, curv), np.stack([x] * 3), rtol=1e-5
  )


def test_output_dtypes():
  x = jnp.ones((8, DIM), jnp.bfloat16)
  assert jitted_lorentz.pairwise_dist(x, x, 1.0).dtype == jnp.float32
  assert jitted_lorentz.exp_map0(x, 1.0).dtype == jnp.float32
  assert jitted_poincare.mobius_add(x * 0.1, x * 0.1, 1.0).dtype == jnp.float32
  with jax.enable_x64(True):
    x64 = jnp.ones((8, DIM), jnp.float64)
    assert jitted_lorentz.pairwise_dist(x64, x64, 1.0).dtype == jnp.float64
    assert jitted_poincare.pairwise_dist(x64 * 0.1, x64 * 0.1, 1.0).dtype == jnp.float64
    assert jitted_lorentz.exp_map0(jnp.ones((8, DIM), jnp.float32), 1.0).dtype == jnp.float32


# ---------------------------------------------------------------------------
# poincare.py properties
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("curv", CURVATURES)
def test_poincare_mobius_identities_and_self_distance(curv):
  rng = np.random.default_rng(10)
  x = random_ball_points(rng, 8, curv).astype(np.float32)
  y = random_ball_points(rng, 8, curv).astype(np.float32)
  np.testing.assert_allclose(jitted_poincare.mobius_add(x, -x, curv), 0.0, atol=1e-6)
  np.testing.assert_allclose(jitted_poincare.mobius_add(np.zeros_like(y), y, curv), y, rtol=1e-6)
  np.testing.assert_allclose(jitted_poincare.mobius_add(x, np.zeros_like(x), curv), x, rtol=1e-6)
  # Not exactly 0: safe_norm's floor sqrt(tiny) ~ 1e-19 at x - y = 0.
  assert np.all(jitted_poincare.dist(x, x, curv) < 1e-15)
  distances = np.asarray(jitted_poincare.pairwise_dist(x, x, curv))
  np.testing.assert_allclose(distances, distances.T, rtol=1e-5, atol=1e-6)
  # Gram-matrix cancellation: |x|^2 + |x|^2 - 2<x,x> is ~eps |x|^2, not 0,
  # so |x - x| ~ 3e-4 |x|, and the metric 2/(1 - c|x|^2) scales distances
  # near x (about 10x at sqrt(c)|x| = 0.9).
  conformal_factor = 2 / (1 - curv * np.sum(x * x, -1))
  assert np.all(np.abs(np.diag(distances)) < 1e-3 * conformal_factor)
  np.testing.assert_allclose(
    np.diag(jitted_poincare.pairwise_dist(x, y, curv)), jitted_poincare.dist(x, y, curv), rtol=1e-4
  )
  triangle_slack = distances[:, None, :] - distances[:, :, None] - distances[None, :, :]
  assert np.all(triangle_slack <= 1e-4)


@pytest.mark.parametrize("curv", CURVATURES)
def test_poincare_exp_log_round_trip_and_project(curv):
  rng = np.random.default_rng(11)
  # sqrt(c)|v| <= 2: beyond that tanh is so close to 1 that atanh loses
  # digits in float32 (condition number 1/(1 - tanh^2)).
  v = (random_points(rng, 8, low=0.05, high=2.0) / np.sqrt(curv)).astype(np.float32)
  np.testing.assert_allclose(
    jitted_poincare.log_map0(jitted_poincare.exp_map0(v, curv), curv), v, rtol=1e-4, atol=1e-5
  )
  outside = random_points(rng, 8, low=0.5, high=50.0).astype(np.float32)
  projected = np.asarray(jitted_poincare.project(outside, curv))
  max_norm = (1 - 4e-3) / np.sqrt(curv)
  assert np.all(np.linalg.norm(projected, axis=-1) <= max_norm * (1 + 1e-6))
  inside = random_ball_points(rng, 8, curv).astype(np.float32)
  np.testing.assert_array_equal(jitted_poincare.project(inside, curv), inside)
  # Far exp_map0 outputs land on the boundary in f32; project fixes that.
  far = jitted_poincare.project(jitted_poincare.exp_map0(outside * 10, curv), curv)
  assert np.all(np.isfinite(jitted_poincare.log_map0(far, curv)))


@pytest.mark.parametrize("curv", CURVATURES)
def test_scale_grad_by_inverse_metric(curv):
  rng = np.random.default_rng(12)
  x = jnp.asarray(random_ball_points(rng, 8, curv), jnp.float32)
  upstream = jnp.asarray(rng.normal(size=x.shape), jnp.float32)
  value, pullback = jax.vjp(
    lambda x, c: poincare.scale_grad_by_inverse_metric(x, c), x, jnp.float32(curv)
  )
  np.testing.assert_array_equal(value, x)
  gradient_x, gradient_c = pullback(upstream)
  expected = np.asarray(poincare.inverse_metric_scale(x, curv))[:, None] * np.asarray(upstream)
  np.testing.assert_allclose(gradient_x, expected, rtol=1e-6)
  assert gradient_c == 0.0
  # Inside jax.grad of a loss.
  loss_gradient = jax.grad(
    lambda x: jnp.sum(poincare.scale_grad_by_inverse_metric(x, curv) * upstream)
  )(x)
  np.testing.assert_allclose(loss_gradient, expected, rtol=1e-6)


# ---------------------------------------------------------------------------
# finite values and gradients at the hard inputs, for every function
# ---------------------------------------------------------------------------
STEPS = np.float32([[0.0], [0.5], [1.0]])
FUNCTIONS = [
  ("lorentz.time_component", lambda x, y, c: lorentz.time_component(x, c)),
  ("lorentz.pairwise_inner", lorentz.pairwise_inner),
  ("lorentz.elementwise_inner", lorentz.elementwise_inner),
  ("lorentz.pairwise_dist", lorentz.pairwise_dist),
  ("lorentz.elementwise_dist", lorentz.elementwise_dist),
  ("lorentz.exp_map0", lambda x, y, c: lorentz.exp_map0(x, c)),
  ("lorentz.log_map0", lambda x, y, c: lorentz.log_map0(x, c)),
  ("lorentz.dist_to_origin", lambda x, y, c: lorentz.dist_to_origin(x, c)),
  ("lorentz.half_aperture", lambda x, y, c: lorentz.half_aperture(x, c)),
  ("lorentz.oxy_angle", lorentz.oxy_angle),
  ("lorentz.oxy_angle_reversed", lambda x, y, c: lorentz.oxy_angle(y, x, c)),
  ("lorentz.pairwise_oxy_angle", lorentz.pairwise_oxy_angle),
  ("lorentz.interpolate_to_origin", lambda x, y, c: lorentz.interpolate_to_origin(x[0], STEPS, c)),
  (
    "lorentz.geodesic_interpolate",
    lambda x, y, c: lorentz.geodesic_interpolate(x, y, STEPS[:, None], c),
  ),
  ("lorentz.to_poincare", lambda x, y, c: lorentz.to_poincare(x, c)),
  ("lorentz.from_poincare", lambda x, y, c: lorentz.from_poincare(x, c)),
  ("lorentz.to_klein", lambda x, y, c: lorentz.to_klein(x, c)),
  ("lorentz.from_klein", lambda x, y, c: lorentz.from_klein(x, c)),
  (
    "lorentz.einstein_midpoint",
    lambda x, y, c: lorentz.einstein_midpoint(jnp.concatenate([x, y]), c),
  ),
  ("poincare.mobius_add", poincare.mobius_add),
  ("poincare.dist", poincare.dist),
  ("poincare.pairwise_dist", poincare.pairwise_dist),
  ("poincare.exp_map0", lambda x, y, c: poincare.exp_map0(x, c)),
  ("poincare.log_map0", lambda x, y, c: poincare.log_map0(x, c)),
  ("poincare.project", lambda x, y, c: poincare.project(x, c)),
  ("poincare.inverse_metric_scale", lambda x, y, c: poincare.inverse_metric_scale(x, c)),
  (
    "poincare.scale_grad_by_inverse_metric",
    lambda x, y, c: poincare.scale_grad_by_inverse_metric(x, c),
  ),
  (
    "poincare.dist_after_project",
    lambda x, y, c: poincare.dist(poincare.project(x, c), poincare.project(y, c), c),
  ),
]


def _hard_inputs():
  """(x, y) pairs of shape (4, DIM) that sit on singularities or extremes."""
  rng = np.random.default_rng(13)
  ordinary = random_points(rng, 4).astype(np.float32)
  other = random_points(rng, 4).astype(np.float32)
  with_duplicates = ordinary[[0, 0, 1, 1]]
  zeros = np.zeros_like(ordinary)

  def scaled(points, norm):
    return (points / np.linalg.norm(points, axis=-1, keepdims=True) * norm).astype(np.float32)

  return {
    "identical": (ordinary, ordinary),
    "duplicates": (with_duplicates, with_duplicates[::-1]),
    "zeros": (zeros, zeros),
    "zero_and_point": (zeros, ordinary),
    "huge_1e4": (scaled(ordinary, 1e4), scaled(np.concatenate([ordinary[:2], other[:2]]), 1e4)),
    "tiny_1e-12": (
      scaled(ordinary, 1e-12),
      scaled(np.concatenate([ordinary[:2], other[:2]]), 1e-12),
    ),
    "bfloat16": (jnp.asarray(ordinary, jnp.bfloat16), jnp.asarray(ordinary[::-1], jnp.bfloat16)),
  }


HARD_INPUTS = _hard_inputs()


def _all_values_and_gradients(x, y, c):
  """{name: (value, (d/dx, d/dy, d/dcurv) of sum(value))} for every function."""
  results = {}
  for name, function in FUNCTIONS:

    def summed(x, y, c, function=function):
      value = function(x, y, c)
      return jnp.sum(value), value

    (_, value), gradients = jax.value_and_grad(summed, argnums=(0, 1, 2), has_aux=True)(x, y, c)
    results[name] = (value, gradients)
  return results


# One compiled program for all functions (per input dtype); curv is traced.
# Eager mode would compile each primitive separately and dominate the runtime.
ALL_VALUES_AND_GRADIENTS = fast_compile_jit(_all_values_and_gradients)


@pytest.mark.parametrize("case", list(HARD_INPUTS))
def test_finite_values_and_gradients(case):
  x, y = HARD_INPUTS[case]
  failures = []
  for curv in (0.1, 2.5):
    results = jax.device_get(ALL_VALUES_AND_GRADIENTS(x, y, jnp.float32(curv)))
    for name, (value, gradients) in results.items():
      if not np.all(np.isfinite(np.asarray(value, np.float32))):
        failures.append(f"{name} value (c={curv})")
      for label, gradient in zip(("x", "y", "curv"), gradients):
        if not np.all(np.isfinite(np.asarray(gradient, np.float32))):
          failures.append(f"{name} d/d{label} (c={curv})")
  assert not failures, failures


GRADIENT_CHECKED = [
  "lorentz.pairwise_dist",
  "lorentz.exp_map0",
  "lorentz.log_map0",
  "lorentz.half_aperture",
  "lorentz.pairwise_oxy_angle",
  "lorentz.geodesic_interpolate",
  "lorentz.einstein_midpoint",
  "lorentz.from_klein",
  "poincare.pairwise_dist",
  "poincare.log_map0",
]


def _directional_derivatives(inputs, directions, step):
  """(autodiff, central difference) directional derivatives for each function.

  inputs[name] = (x, y, c); directions[name] = (K directions of (x, y, c)).
  The scalar is a weighted sum of the outputs so every output entry counts.
  """
  functions = dict(FUNCTIONS)
  results = {}
  for name, (x, y, c) in inputs.items():
    function = functions[name]

    def scalar(x, y, c, function=function):
      value = function(x, y, c)
      weights = jnp.arange(1.0, 1.0 + value.size, dtype=value.dtype).reshape(value.shape)
      return jnp.sum(weights * value)

    gradient = jax.grad(scalar, argnums=(0, 1, 2))(x, y, c)
    dx, dy, dc = directions[name]
    autodiff = jax.vmap(
      lambda u, v, w: jnp.sum(gradient[0] * u) + jnp.sum(gradient[1] * v) + gradient[2] * w
    )(dx, dy, dc)
    central = jax.vmap(
      lambda u, v, w: (
        (
          scalar(x + step * u, y + step * v, c + step * w)
          - scalar(x - step * u, y - step * v, c - step * w)
        )
        / (2 * step)
      )
    )(dx, dy, dc)
    results[name] = (autodiff, central)
  return results


def test_gradients_match_finite_differences_float64():
  """The custom_jvp rules and guards give the true derivative off the edges.

  Central differences in float64 with step 1e-6 are accurate to ~1e-9
  relative, so a 1e-6 tolerance catches any wrong derivative rule.
  """
  with jax.enable_x64(True):
    rng = np.random.default_rng(14)
    inputs, directions = {}, {}
    for name in GRADIENT_CHECKED:
      if name.startswith("poincare") or name.endswith("klein"):
        x, y = random_ball_points(rng, 4, 1.5), random_ball_points(rng, 4, 1.5)
      else:
        x, y = random_points(rng, 4), random_points(rng, 4)
      inputs[name] = (x, y, np.float64(1.5))
      # Three random directions in (x, y, curv) space; step 1e-6 keeps
      # perturbed ball points inside the ball.
      directions[name] = (
        rng.normal(size=(3,) + x.shape),
        rng.normal(size=(3,) + y.shape),
        rng.normal(size=3),
      )
    results = jax.device_get(fast_compile_jit(_directional_derivatives)(inputs, directions, 1e-6))
    for name, (autodiff, central) in results.items():
      np.testing.assert_allclose(autodiff, central, rtol=1e-6, err_msg=name)
