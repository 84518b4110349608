"""Where the pictures put each embedding: 2-D coordinates, no drawing.

Everything here is NumPy (plus the geometry functions); the figures in this
package only draw what these functions return, so the tests can check the
geometry of a picture without reading pixels.

The disk view (`disk_layout`) draws each embedding at its exact distance from
the space's centre and in the direction of a 2-D projection:

- Lorentz models: the Poincare disk of curvature -c, i.e. radius 1/sqrt(c).
  A point at geodesic distance d from the origin is drawn at disk radius
  tanh(sqrt(c) d / 2) / sqrt(c), which is exactly where the Lorentz ->
  Poincare map puts it (`lorentz.to_poincare`), so distances to the origin
  read correctly. Its direction is that of its tangent vector at the origin
  (`lorentz.log_map0`) projected onto the first two principal axes of all
  the tangent vectors drawn together (PCA, centred). Only the radius is
  exact: a projection from D dimensions to 2 cannot keep every angle.
- Euclidean models (CLIP) score by cosine, so their embeddings live on the
  unit sphere. The sphere is drawn in the azimuthal equidistant projection
  around a centre point (the run's [ROOT], by default the normalised mean of
  everything drawn, MERU's CLIP [ROOT]): a point at angle theta from the
  centre is drawn at radius theta (the boundary circle, radius pi, is the
  centre's antipode), its direction from the PCA of the sphere's tangent
  vectors at the centre (the sphere's log map). Both views are "distance from
  the root as radius", so MERU and CLIP compare side by side.

The cone view (`cone_layout`) is exact instead of projected: around one
apex (a text), it draws each other point at its true distance from the
origin and at its true angle at the origin from the apex. The origin, the
apex and a point span a hyperbolic plane, and the drawing is that plane, so
the triangle (origin, apex, point) is drawn congruent: the exterior angle at
the apex, hence entailment-cone membership (MERU eq. 10-11), is the one the
loss computes in D dimensions. Only the side of the apex's axis a point is
drawn on is a choice (the sign of its first principal component orthogonal
to the apex).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from hyperbolic_vl import errors
from hyperbolic_vl.evaluators.metrics import traversal
from hyperbolic_vl.geometry import lorentz

LORENTZ = "lorentz"


@dataclasses.dataclass(frozen=True)
class Space:
  """How to read a model's embeddings: its geometry ("lorentz" or
  "euclidean"), curvature (Lorentz) and [ROOT] ((D,), Euclidean; None: the
  normalised mean of the embeddings drawn)."""

  geometry: str
  curv: float | None = None
  root: np.ndarray | None = None

  def __post_init__(self):
    if self.geometry == LORENTZ and not (self.curv and self.curv > 0):
      raise ValueError(f"a Lorentz space needs a curvature c > 0, got curv={self.curv!r}")

  @classmethod
  def of(cls, model, root: np.ndarray | None = None) -> Space:
    """The space of a `hyperbolic_vl.load` model (any `Predictor`); `root`
    overrides a Euclidean model's [ROOT] (see `traversal.clip_root`)."""
    if model.geometry == LORENTZ:
      if np.ndim(model.curv) == 1:
        raise errors.ConfigError(
          "the plots draw one Lorentz space on the Poincare disk; this run's model is a "
          f"product of {len(model.curv)} spaces (model.factor_dim)"
        )
      return cls(LORENTZ, float(model.curv))
    if root is None:
      root = model.root_embedding()
    return cls(model.geometry, None, None if root is None else np.asarray(root, np.float64))

  @property
  def is_lorentz(self) -> bool:
    return self.geometry == LORENTZ

  @property
  def boundary_radius(self) -> float:
    """Radius of the circle the view is drawn inside."""
    return 1.0 / np.sqrt(self.curv) if self.is_lorentz else np.pi

  @property
  def distance_name(self) -> str:
    return "distance to the origin" if self.is_lorentz else "angle to [ROOT] (radians)"


@dataclasses.dataclass(frozen=True)
class DiskLayout:
  """xy: (N, 2) drawn positions; distance: (N,) the distance each radius
  encodes; axes: (2, D) the projection's directions in the tangent space."""

  xy: np.ndarray
  distance: np.ndarray
  axes: np.ndarray
  space: Space


def _unit(x: np.ndarray) -> np.ndarray:
  x = np.asarray(x, np.float64)
  return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-300)


def sphere_center(space: Space, embeddings: np.ndarray) -> np.ndarray:
  """The Euclidean view's centre: the space's [ROOT], or the normalised mean
  of the normalised embeddings (MERU's CLIP [ROOT] over what is drawn)."""
  if space.root is not None:
    return _unit(space.root)
  return _unit(_unit(embeddings).mean(axis=0))


def distance_from_center(space: Space, embeddings: np.ndarray) -> np.ndarray:
  """(N, D) -> (N,): geodesic distance to the origin (Lorentz) or angle to
  the centre on the unit sphere (Euclidean), in float64."""
  embeddings = np.asarray(embeddings, np.float64)
  if space.is_lorentz:
    return np.arcsinh(np.sqrt(space.curv) * np.linalg.norm(embeddings, axis=-1)) / np.sqrt(
      space.curv
    )
  center = sphere_center(space, embeddings)
  return np.arccos(np.clip(_unit(embeddings) @ center, -1.0, 1.0))


# The geometry below runs compiled whole: op by op, each of its operations
# would be its own XLA compile (a plot command draws a few views).
_log_map0 = jax.jit(lorentz.log_map0)


@jax.jit
def _aperture_and_exterior_angles(apex, points, curv, min_radius):
  """The half-aperture of apex's cone and the exterior angle at apex towards
  each point (N,)."""
  return lorentz.half_aperture(apex, curv, min_radius), lorentz.oxy_angle(apex[None], points, curv)


def tangent_vectors(space: Space, embeddings: np.ndarray) -> np.ndarray:
  """(N, D) tangent vectors at the centre: `lorentz.log_map0` (Lorentz) or
  the unit sphere's log map at the centre (Euclidean)."""
  if space.is_lorentz:
    return np.asarray(_log_map0(jnp.asarray(embeddings, jnp.float32), space.curv), np.float64)
  center = sphere_center(space, embeddings)
  unit = _unit(embeddings)
  off_center = unit - (unit @ center)[:, None] * center
  return _unit(off_center) * distance_from_center(space, embeddings)[:, None]


def principal_axes(vectors: np.ndarray, count: int = 2) -> np.ndarray:
  """(count, D) first principal axes of the rows (centred PCA), each signed
  so that its largest-magnitude entry is positive (a stable orientation)."""
  vectors = np.asarray(vectors, np.float64)
  _, _, rows = np.linalg.svd(vectors - vectors.mean(axis=0), full_matrices=False)
  axes = rows[:count]
  if len(axes) < count:  # fewer points than axes: complete with zeros
    axes = np.concatenate([axes, np.zeros((count - len(axes), vectors.shape[1]))])
  signs = np.sign(axes[np.arange(count), np.argmax(np.abs(axes), axis=1)])
  return axes * np.where(signs == 0, 1.0, signs)[:, None]


def disk_radius(space: Space, distance: np.ndarray) -> np.ndarray:
  """Drawn radius of a point at `distance` (see the module docstring)."""
  distance = np.asarray(distance, np.float64)
  if space.is_lorentz:
    sqrt_curv = np.sqrt(space.curv)
    return np.tanh(sqrt_curv * distance / 2.0) / sqrt_curv
  return distance


def disk_layout(space: Space, embeddings: np.ndarray, axes: np.ndarray | None = None) -> DiskLayout:
  """Disk-view positions of (N, D) embeddings; `axes` (2, D) fixes the
  projection (e.g. to draw a second set in the same frame), by default the
  principal axes of these embeddings' tangent vectors."""
  embeddings = np.asarray(embeddings)
  if embeddings.ndim != 2 or not len(embeddings):
    raise ValueError(f"embeddings must be a non-empty (N, D) array, got {embeddings.shape}")
  tangents = tangent_vectors(space, embeddings)
  axes = principal_axes(tangents) if axes is None else np.asarray(axes, np.float64)
  projected = tangents @ axes.T
  length = np.linalg.norm(projected, axis=1, keepdims=True)
  # A tangent orthogonal to both axes has no drawable direction: put it on
  # the first axis (its radius is still exact).
  direction = np.where(length > 1e-12, projected / np.maximum(length, 1e-300), [1.0, 0.0])
  distance = distance_from_center(space, embeddings)
  return DiskLayout(disk_radius(space, distance)[:, None] * direction, distance, axes, space)


# -- the cone view ---------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class ConeLayout:
  """apex_xy (2,) and xy (N, 2) in the Poincare disk of radius 1/sqrt(c);
  half_aperture of the apex's cone; inside (N,): the points the cone
  contains, computed in D dimensions (MERU's exterior angle <= aperture);
  boundary (2, K, 2): the cone's two edges, geodesic rays from the apex."""

  apex_xy: np.ndarray
  xy: np.ndarray
  half_aperture: float
  inside: np.ndarray
  boundary: np.ndarray
  curv: float


def _lorentz_point_2d(distance: float, direction: np.ndarray, curv: float):
  """Ambient (x1, x2, time) coordinates of the 2-D hyperboloid point at
  `distance` from the origin along the unit `direction` (2,)."""
  sqrt_curv = np.sqrt(curv)
  return np.array(
    [
      *(np.sinh(sqrt_curv * distance) / sqrt_curv * direction),
      np.cosh(sqrt_curv * distance) / sqrt_curv,
    ]
  )


def _to_disk(ambient: np.ndarray, curv: float) -> np.ndarray:
  """Ambient hyperboloid points (..., 3) -> Poincare disk (..., 2)."""
  return ambient[..., :2] / (1.0 + np.sqrt(curv) * ambient[..., 2:])


def cone_edges(apex_distance: float, half_aperture: float, curv: float, samples: int = 64):
  """(2, samples, 2): the geodesic rays leaving the apex (on the +x axis at
  `apex_distance`) at +-half_aperture from the outward radial direction,
  drawn until they are within 1e-3 of the disk's edge."""
  sqrt_curv = np.sqrt(curv)
  apex = _lorentz_point_2d(apex_distance, np.array([1.0, 0.0]), curv)
  # Unit tangents at the apex (ambient, <u, u>_L = 1, <u, apex>_L = 0): the
  # outward radial direction and the one perpendicular to it.
  radial = np.array([np.cosh(sqrt_curv * apex_distance), 0.0, np.sinh(sqrt_curv * apex_distance)])
  across = np.array([0.0, 1.0, 0.0])
  # Long enough to come within 1e-3 of the edge (tanh(r/2) >= 1 - 1e-3 when
  # r >= 2 atanh(1 - 1e-3) ~ 7.6 in curvature-scaled units).
  length = (2 * np.arctanh(1 - 1e-3) + sqrt_curv * apex_distance) / sqrt_curv
  s = np.linspace(0.0, length, samples)[:, None]
  edges = []
  for sign in (1.0, -1.0):
    tangent = np.cos(half_aperture) * radial + sign * np.sin(half_aperture) * across
    ray = np.cosh(sqrt_curv * s) * apex + np.sinh(sqrt_curv * s) / sqrt_curv * tangent
    edges.append(_to_disk(ray, curv))
  return np.stack(edges)


def cone_layout(
  apex: np.ndarray, points: np.ndarray, curv: float, min_radius: float = 0.1
) -> ConeLayout:
  """The exact 2-D view of `points` (N, D) around the entailment cone of
  `apex` (D,) (see the module docstring); `min_radius` is MERU's K."""
  apex = np.asarray(apex, np.float64)
  points = np.asarray(points, np.float64)
  apex_distance = float(distance_from_center(Space(LORENTZ, curv), apex[None])[0])
  distance = distance_from_center(Space(LORENTZ, curv), points)
  apex_unit = _unit(apex)
  unit = _unit(points)
  angle_at_origin = np.arccos(np.clip(unit @ apex_unit, -1.0, 1.0))
  across = unit - (unit @ apex_unit)[:, None] * apex_unit
  side_axis = principal_axes(across, 1)[0] if len(points) > 1 else np.zeros_like(apex)
  side = np.where(across @ side_axis < 0, -1.0, 1.0)
  direction = np.stack([np.cos(angle_at_origin), side * np.sin(angle_at_origin)], axis=1)
  radius = disk_radius(Space(LORENTZ, curv), distance)[:, None]
  aperture, exterior = _aperture_and_exterior_angles(
    jnp.asarray(apex, jnp.float32), jnp.asarray(points, jnp.float32), curv, min_radius
  )
  aperture, exterior = float(aperture), np.asarray(exterior)
  return ConeLayout(
    apex_xy=np.array([disk_radius(Space(LORENTZ, curv), apex_distance), 0.0]),
    xy=radius * direction,
    half_aperture=aperture,
    inside=exterior <= aperture,
    boundary=cone_edges(apex_distance, aperture, curv),
    curv=float(curv),
  )


def interpolation(
  space: Space, start: np.ndarray, end: np.ndarray, steps: int, candidates: dict[str, np.ndarray]
) -> dict[str, np.ndarray]:
  """Nearest candidate (index) of each kind at each of `steps` points on the
  geodesic from `start` to `end`: {kind: (steps,) indices}, e.g. candidates
  {"text": text_emb, "image": image_emb}."""
  path = traversal.geodesic_between(start, end, steps, geometry=space.geometry, curv=space.curv)
  return {
    kind: traversal.nearest(path, pool, geometry=space.geometry, curv=space.curv)
    for kind, pool in candidates.items()
  }
