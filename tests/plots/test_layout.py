"""Where the pictures put each embedding, against float64 NumPy references:
the disk radius of a point at a known distance, directions kept for points
in a plane, the sphere view's angle, the cone view's congruence (so cone
membership drawn is membership computed), and interpolation neighbours."""

import numpy as np
import pytest

from hyperbolic_vl.evaluators.metrics import traversal
from hyperbolic_vl.plots import layout

CURV = 0.7


def unit(v):
  return v / np.linalg.norm(v, axis=-1, keepdims=True)


def at_distance(distances, directions, c):
  """Space components of hyperboloid points at geodesic distance d from the
  origin along unit directions: x = sinh(sqrt(c) d) / sqrt(c) * u."""
  return (np.sinh(np.sqrt(c) * distances) / np.sqrt(c))[:, None] * directions


def time(x, c):
  return np.sqrt(1 / c + np.sum(x * x, -1))


def exterior_angle(apex, point, c):
  """MERU eq. 11 in float64: the angle at `apex` between the ray from the
  origin through it (extended) and the geodesic to `point`."""
  inner = c * (apex @ point - time(apex, c) * time(point, c))
  numerator = time(point, c) + time(apex, c) * inner
  denominator = np.linalg.norm(apex) * np.sqrt(max(inner**2 - 1, 1e-300))
  return np.arccos(np.clip(numerator / denominator, -1, 1))


def from_disk(p, c):
  """Poincare disk (radius 1/sqrt(c)) -> hyperboloid space components."""
  return 2 * p / (1 - c * np.sum(p * p, -1, keepdims=True))


def test_disk_radius_is_tanh_of_half_the_scaled_distance():
  rng = np.random.default_rng(0)
  distances = np.array([0.0, 1e-3, 0.3, 1.0, 2.5, 6.0])
  x = at_distance(distances, unit(rng.normal(size=(6, 8))), CURV)
  drawn = layout.disk_layout(layout.Space("lorentz", CURV), x)
  radius = np.linalg.norm(drawn.xy, axis=1)
  expected = np.tanh(np.sqrt(CURV) * distances / 2) / np.sqrt(CURV)
  np.testing.assert_allclose(radius, expected, rtol=1e-12, atol=1e-15)
  np.testing.assert_allclose(drawn.distance, distances, rtol=1e-12, atol=1e-15)
  # The same radius as the Lorentz -> Poincare map |x| / (1 + sqrt(c) x_time).
  poincare = np.linalg.norm(x, axis=1) / (1 + np.sqrt(CURV) * time(x, CURV))
  np.testing.assert_allclose(radius, poincare, rtol=1e-12, atol=1e-15)
  assert radius.max() < layout.Space("lorentz", CURV).boundary_radius


def test_directions_of_points_in_a_plane_are_kept():
  """Embeddings spanning a 2-D plane: the PCA axes span it, so the drawn
  directions differ from the true ones by one rotation (or reflection),
  which keeps every pairwise angle. Tolerance: log_map0 runs in float32 and
  scales each vector by a positive factor; a direction's components carry
  ~1e-7 relative rounding, so cosines agree to ~1e-6."""
  rng = np.random.default_rng(1)
  plane, _ = np.linalg.qr(rng.normal(size=(7, 2)))  # orthonormal columns
  angles = rng.uniform(-np.pi, np.pi, 20)
  directions = np.stack([np.cos(angles), np.sin(angles)], 1) @ plane.T
  x = at_distance(rng.uniform(0.2, 3.0, 20), directions, CURV)
  drawn = unit(layout.disk_layout(layout.Space("lorentz", CURV), x).xy)
  np.testing.assert_allclose(drawn @ drawn.T, np.cos(angles[:, None] - angles[None]), atol=1e-6)


def test_sphere_view_radius_is_the_angle_to_root():
  rng = np.random.default_rng(2)
  root = unit(rng.normal(size=6))
  across = unit(rng.normal(size=(9, 6)))
  across = unit(across - (across @ root)[:, None] * root)
  theta = np.linspace(0.05, 3.0, 9)
  scale = rng.uniform(0.5, 20.0, 9)[:, None]  # norms do not matter to cosines
  x = scale * (np.cos(theta)[:, None] * root + np.sin(theta)[:, None] * across)
  space = layout.Space("euclidean", None, root)
  drawn = layout.disk_layout(space, x)
  np.testing.assert_allclose(np.linalg.norm(drawn.xy, axis=1), theta, rtol=1e-12)
  assert space.boundary_radius == pytest.approx(np.pi)


def test_lorentz_space_needs_a_curvature():
  with pytest.raises(ValueError, match="curvature"):
    layout.Space("lorentz", None)


def test_cone_view_is_congruent_so_drawn_membership_is_computed_membership():
  rng = np.random.default_rng(3)
  c = 1.3
  apex = at_distance(np.array([0.6]), unit(rng.normal(size=(1, 6))), c)[0]
  # Points near the apex's direction and farther out, some inside its cone.
  spread = np.linspace(0.02, 0.6, 40)[:, None]
  directions = unit(apex / np.linalg.norm(apex) + spread * rng.normal(size=(40, 6)))
  points = at_distance(rng.uniform(0.3, 3.5, 40), directions, c)
  cone = layout.cone_layout(apex, points, c)
  true_distance = np.arcsinh(np.sqrt(c) * np.linalg.norm(points, axis=1)) / np.sqrt(c)
  np.testing.assert_allclose(
    np.linalg.norm(cone.xy, axis=1),
    np.tanh(np.sqrt(c) * true_distance / 2) / np.sqrt(c),
    rtol=1e-12,
  )
  # The angle at the origin between apex (drawn on +x) and each point.
  true_angle = np.arccos(np.clip(unit(points) @ unit(apex), -1, 1))
  np.testing.assert_allclose(
    np.abs(np.arctan2(cone.xy[:, 1], cone.xy[:, 0])), true_angle, atol=1e-12
  )
  # Congruent triangles: the exterior angle at the apex, computed from the
  # drawn 2-D points, is the D-dimensional one.
  apex_2d = from_disk(cone.apex_xy, c)
  points_2d = from_disk(cone.xy, c)
  drawn_ext = np.array([exterior_angle(apex_2d, p, c) for p in points_2d])
  true_ext = np.array([exterior_angle(apex, p, c) for p in points])
  np.testing.assert_allclose(drawn_ext, true_ext, atol=1e-9)
  aperture = np.arcsin(min(1.0, 2 * 0.1 / (np.sqrt(c) * np.linalg.norm(apex))))
  assert cone.half_aperture == pytest.approx(aperture, rel=1e-6)  # float32 library
  clear = np.abs(true_ext - aperture) > 1e-5  # away from float32 ties
  np.testing.assert_array_equal(cone.inside[clear], (true_ext <= aperture)[clear])
  assert 0 < cone.inside.sum() < len(points)  # the case exercises both sides
  # The drawn edges are the cone's boundary: exterior angle == half aperture.
  for edge in cone.boundary:
    edge_points = from_disk(edge[1:], c)
    angles = [exterior_angle(apex_2d, p, c) for p in edge_points]
    np.testing.assert_allclose(angles, cone.half_aperture, atol=1e-7)
    assert np.linalg.norm(edge[-1]) >= (1 - 1.1e-3) / np.sqrt(c)


def geodesic_reference(x, y, steps, c):
  """float64 hyperboloid geodesic from x to y (ambient formula)."""
  d = np.arccosh(c * (time(x, c) * time(y, c) - x @ y))
  t = np.linspace(0, 1, steps)[:, None]
  return (np.sinh((1 - t) * d) * x + np.sinh(t * d) * y) / np.sinh(d)


def test_interpolation_neighbours_match_brute_force():
  rng = np.random.default_rng(4)
  start, end = rng.normal(size=(2, 5))
  texts, images = rng.normal(size=(30, 5)), rng.normal(size=(25, 5))
  got = layout.interpolation(
    layout.Space("lorentz", CURV), start, end, 9, {"text": texts, "image": images}
  )
  path = geodesic_reference(start, end, 9, CURV)
  for kind, pool in (("text", texts), ("image", images)):
    distance = np.arccosh(
      np.maximum(1, CURV * (time(path, CURV)[:, None] * time(pool, CURV)[None] - path @ pool.T))
    )
    np.testing.assert_array_equal(got[kind], distance.argmin(axis=1))
  # Euclidean runs walk the great circle and rank by cosine.
  got = layout.interpolation(layout.Space("euclidean"), start, end, 9, {"text": texts})
  a, b = unit(start), unit(end)
  omega = np.arccos(a @ b)
  t = np.linspace(0, 1, 9)[:, None]
  path = (np.sin((1 - t) * omega) * a + np.sin(t * omega) * b) / np.sin(omega)
  np.testing.assert_array_equal(got["text"], (path @ unit(texts).T).argmax(axis=1))
  np.testing.assert_allclose(
    traversal.geodesic_between(start, end, 9, geometry="euclidean"), path, atol=1e-6
  )
