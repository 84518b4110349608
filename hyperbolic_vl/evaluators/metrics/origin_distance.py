"""Distances to the origin of embeddings, and the order of paired texts and
images along them.

Lorentz models (MERU, ATMG) embed points of the hyperboloid of curvature -c
by their space components x, and d(O, x) = asinh(sqrt(c)|x|) / sqrt(c)
(`lorentz.dist_to_origin`, the run's own c). Euclidean models (CLIP) have
no origin in that sense; their "distance" is the norm of the unnormalised
projected feature. A product of K Lorentz spaces (PHyCLIP; `curv` a (K,)
array) takes the mean of the per-factor distances (the release's l1 product
distance), and its cone figures count (pair, factor) entries: the share of
pairs and factors whose factor point lies inside the factor cone. Those
shares are named with the suffix `_per_factor` (`cone_share_name`), so that
a table across runs never puts them in one column with one space's share of
pairs.
"""

from __future__ import annotations

import numpy as np

from hyperbolic_vl.geometry import lorentz, product


def distance_to_origin(emb, geometry: str, curv: float | None) -> np.ndarray:
  """(..., D) embeddings -> (...) float64 distances to the origin (see the module docstring)."""
  emb = np.asarray(emb)
  if geometry == "lorentz":
    if curv is None:
      raise ValueError("a Lorentz model needs its curvature")
    if np.ndim(curv) == 1:
      return np.asarray(product.dist_to_origin(emb, np.asarray(curv)), np.float64)
    return np.asarray(lorentz.dist_to_origin(emb, curv), np.float64)
  return np.linalg.norm(np.asarray(emb, np.float64), axis=-1)


def inside_cone(general, specific, curv) -> np.ndarray:
  """Whether each specific point lies in its general point's entailment cone
  (exterior angle <= half aperture): (N,) bool for one Lorentz space, (N, K)
  per factor for a product of K spaces (`curv` of shape (K,))."""
  if np.ndim(curv) == 1:
    curvs = np.asarray(curv)
    angle = product.oxy_angle(general, specific, curvs)
    aperture = product.half_aperture(general, curvs)
  else:
    angle = lorentz.oxy_angle(general, specific, curv)
    aperture = lorentz.half_aperture(general, curv)
  return np.asarray(angle) <= np.asarray(aperture)


def cone_share_name(name: str, curv) -> str:
  """The figure name of a cone share: `name` for one Lorentz space (a share
  of pairs), `name + "_per_factor"` for a product of spaces (`curv` of shape
  (K,), a share of (pair, factor) entries)."""
  return f"{name}_per_factor" if np.ndim(curv) == 1 else name


def text_image_order_figures(
  image_emb: np.ndarray, text_emb: np.ndarray, geometry: str, curv: float | None
) -> dict[str, float]:
  """A text nearer the origin than its image (generality), per pair:
  text_closer_fraction, mean_dist_origin/{image,text} and, for Lorentz
  models, inside_cone_fraction (the image inside its text's entailment
  cone; inside_cone_fraction_per_factor for a product of spaces). Euclidean
  "distance" is the norm of the unnormalised feature."""
  if geometry == "lorentz":
    image_d = distance_to_origin(image_emb, geometry, curv)
    text_d = distance_to_origin(text_emb, geometry, curv)
    inside = float(np.mean(inside_cone(text_emb, image_emb, curv)))
    figures = {cone_share_name("inside_cone_fraction", curv): inside}
  else:
    image_d = np.linalg.norm(image_emb, axis=-1)
    text_d = np.linalg.norm(text_emb, axis=-1)
    figures = {}
  figures.update(
    {
      "text_closer_fraction": float(np.mean(text_d < image_d)),
      "mean_dist_origin/image": float(image_d.mean()),
      "mean_dist_origin/text": float(text_d.mean()),
    }
  )
  return figures
