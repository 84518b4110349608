"""Products of Lorentz spaces (geometry/product.py), in float64.

1. K = 1 with eps = 0 is today's Lorentz geometry exactly.
2. With K factors, random per-factor curvatures and the release's eps = 1e-6
   clamps, every function equals a NumPy port of PHyCLIP's released
   formulas (tests/fixtures/phyclip_reference.py).
3. Values and gradients stay finite at the vertex and for identical points.
"""

import jax
import jax.numpy as jnp
import numpy as np
import phyclip_reference as ref
import pytest

from hyperbolic_vl.geometry import lorentz, product

K, D = 4, 3  # four factors of three dimensions: embeddings of width 12


def random_setup(seed=0, n=5, m=6):
  rng = np.random.default_rng(seed)
  curvs = rng.uniform(0.2, 5.0, size=K)
  draw = lambda rows, radius: radius * rng.normal(size=(rows, K * D))
  return curvs, draw(n, 1.2), draw(m, 0.8)


def test_one_factor_is_the_lorentz_geometry_exactly():
  with jax.enable_x64(True):
    curv, x, y = 1.7, *random_setup(n=5, m=5)[1:]
    x, y = x[:, :D], y[:, :D]
    curvs = np.asarray([curv])

    # All pairs as one jitted computation (eagerly, each op is its own compile).
    @jax.jit
    def all_pairs(x, y, curvs, curv):
      return [
        (product.pairwise_dist(x, y, curvs), lorentz.pairwise_dist(x, y, curv)),
        (product.pairwise_dist(x, y, curvs, "l2"), lorentz.pairwise_dist(x, y, curv)),
        (product.elementwise_dist(x, y, curvs), lorentz.elementwise_dist(x, y, curv)),
        (product.pairwise_score(x, y, curvs), lorentz.pairwise_inner(x, y, curv)),
        (product.exp_map0(x, curvs), lorentz.exp_map0(x, curv)),
        (product.log_map0(x, curvs), lorentz.log_map0(x, curv)),
        (product.oxy_angle(x, y, curvs)[:, 0], lorentz.oxy_angle(x, y, curv)),
        (product.half_aperture(x, curvs)[:, 0], lorentz.half_aperture(x, curv)),
        (product.dist_to_origin(x, curvs), lorentz.dist_to_origin(x, curv)),
      ]

    for got, expected in all_pairs(x, y, curvs, curv):
      # Bit for bit but for l2's sqrt(mean(d^2)) of one d: 1 ulp.
      np.testing.assert_allclose(np.asarray(got), np.asarray(expected), rtol=1e-15, atol=0)


def test_split_and_merge_take_consecutive_components():
  x = jnp.arange(12.0).reshape(1, 12)
  factors = product.split(x, 4)
  assert factors.shape == (1, 4, 3)
  np.testing.assert_array_equal(factors[0, 1], [3.0, 4.0, 5.0])
  np.testing.assert_array_equal(product.merge(factors), x)
  with pytest.raises(ValueError, match="width 12 does not split into 5 factors"):
    product.split(x, 5)


@pytest.mark.parametrize("aggregation", ["l1", "l2"])
def test_distances_equal_the_released_formulas_with_random_curvatures(aggregation):
  curvs, x, y = random_setup(seed=1)
  with jax.enable_x64(True):
    # The three as one jitted computation (eagerly, each op is its own compile).
    got, per_factor, elementwise = jax.device_get(
      jax.jit(
        lambda x, y, curvs: (
          product.pairwise_dist(x, y, curvs, aggregation, eps=ref.RELEASE_EPS),
          product.factor_pairwise_dist(x, y, curvs, eps=ref.RELEASE_EPS),
          product.elementwise_dist(x, y[:5], curvs, aggregation, eps=1e-6),
        )
      )(x, y, curvs)
    )
  expected_per_factor = ref.pairwise_dist(ref.factors(x, K), ref.factors(y, K), curvs)
  np.testing.assert_allclose(per_factor, expected_per_factor, rtol=1e-12)
  expected = ref.combine(expected_per_factor, aggregation)
  np.testing.assert_allclose(got, expected, rtol=1e-12)
  np.testing.assert_allclose(elementwise, np.diag(expected[:, :5]), rtol=1e-12)


def test_score_is_the_sum_of_per_factor_inner_products():
  curvs, x, y = random_setup(seed=2)
  with jax.enable_x64(True):
    got = np.asarray(product.pairwise_score(x, y, curvs))
    inner = np.asarray(product.factor_elementwise_inner(x, y[:5], curvs))
  np.testing.assert_allclose(got, ref.score(x, y, curvs), rtol=1e-12)
  np.testing.assert_allclose(inner.sum(-1), np.diag(got[:, :5]), rtol=1e-12)


def test_maps_at_the_origin_equal_the_release_and_invert_each_other():
  curvs, v, _ = random_setup(seed=3)
  with jax.enable_x64(True):
    lifted = np.asarray(product.exp_map0(v, curvs, eps=ref.RELEASE_EPS))
    back = np.asarray(product.log_map0(lifted, curvs))
    per_factor_origin = np.asarray(product.factor_dist_to_origin(lifted, curvs))
  np.testing.assert_allclose(lifted, ref.exp_map0(ref.factors(v, K), curvs).reshape(v.shape), 1e-12)
  np.testing.assert_allclose(back, v, rtol=1e-11)
  # A factor's distance from its origin is sqrt(c_k)|v_k| / sqrt(c_k) = |v_k|.
  np.testing.assert_allclose(per_factor_origin, np.linalg.norm(ref.factors(v, K), axis=-1), 1e-11)


def test_cones_equal_the_released_formulas_with_their_clamps():
  curvs, x, y = random_setup(seed=4, n=6, m=6)
  # Row 0: a point well inside the min_radius ball of every factor, where the
  # release's clamp holds the aperture at asin(1 - eps) < pi/2. Row 1: y on
  # the ray through x, beyond it, where the angle sits at the clamp's floor.
  x[0] *= 1e-3
  y[1] = 1.5 * x[1]
  with jax.enable_x64(True):
    angle = np.asarray(product.oxy_angle(x, y, curvs, eps=ref.RELEASE_EPS))
    aperture = np.asarray(product.half_aperture(x, curvs, eps=ref.RELEASE_EPS))
  expected_angle = ref.oxy_angle(ref.factors(x, K), ref.factors(y, K), curvs)
  expected_aperture = ref.half_aperture(ref.factors(x, K), curvs)
  np.testing.assert_allclose(angle, expected_angle, rtol=1e-10)
  np.testing.assert_allclose(aperture, expected_aperture, rtol=1e-12)
  np.testing.assert_allclose(aperture[0], np.arcsin(1 - 1e-6), rtol=1e-15)
  # On the ray the true angle is 0; the clamp floors it at acos(1 - eps) =
  # 1.4e-3 rad, and the "+ eps" in the denominator lifts it a little above.
  assert np.all(angle[1] >= np.arccos(1 - 1e-6) * (1 - 1e-9)) and np.all(angle[1] < 2e-3)


@pytest.mark.parametrize("eps", [0.0, 1e-6])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_finite_values_and_gradients_at_the_vertex_and_for_identical_points(eps, dtype):
  curvs = np.asarray([0.3, 1.0, 2.0, 4.5])
  origin = np.zeros((2, K * D))
  _, x, _ = random_setup(seed=5, n=2)

  def everything(x, y, log_curvs):
    c = jnp.exp(log_curvs)
    return (
      product.pairwise_dist(x, y, c, "l1", eps).sum()
      + product.pairwise_dist(x, y, c, "l2", eps).sum()
      + product.oxy_angle(x, y, c, eps).sum()
      + product.half_aperture(x, c, eps=eps).sum()
      + product.exp_map0(x, c, eps).sum()
      + product.pairwise_score(x, y, c).sum()
    )

  with jax.enable_x64(dtype == np.float64):
    # One jitted value-and-grad for the four (equal-shaped) input pairs:
    # eagerly, each op of the forward and backward pass is its own compile.
    value_and_grad = jax.jit(jax.value_and_grad(everything, argnums=(0, 1, 2)))
    for a, b in ((origin, origin), (origin, x), (x, x), (x, origin)):
      args = (np.asarray(a, dtype), np.asarray(b, dtype), np.asarray(np.log(curvs), dtype))
      value, grads = value_and_grad(*args)
      assert np.isfinite(float(value))
      for grad in grads:
        assert np.all(np.isfinite(np.asarray(grad)))


def test_bad_curvature_shapes_and_aggregations_fail_clearly():
  with pytest.raises(ValueError, match=r"needs a \(K,\) curvature vector"):
    product.pairwise_dist(jnp.zeros((2, 4)), jnp.zeros((2, 4)), 1.0)
  with pytest.raises(ValueError, match=r"aggregation='max'; valid: \['l1', 'l2'\]"):
    product.aggregate(jnp.zeros((3, 2)), "max")
