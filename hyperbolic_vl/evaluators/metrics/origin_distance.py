"""Distances to the origin of embeddings, and the order of paired texts and
images along them.

Lorentz models (MERU, ATMG) embed points of the hyperboloid of curvature -c
by their space components x, and d(O, x) = asinh(sqrt(c)|x|) / sqrt(c)
(`lorentz.dist_to_origin`, the run's own c). Euclidean models (CLIP) have
no origin in that sense; their "distance" is the norm of the unnormalised
projected feature.
"""

from __future__ import annotations

import numpy as np

from hyperbolic_vl.geometry import lorentz


def distance_to_origin(emb, geometry: str, curv: float | None) -> np.ndarray:
  """(..., D) embeddings -> (...) float64 distances to the origin (see the module docstring)."""
  emb = np.asarray(emb)
  if geometry == "lorentz":
    if curv is None:
      raise ValueError("a Lorentz model needs its curvature")
    return np.asarray(lorentz.dist_to_origin(emb, curv), np.float64)
  return np.linalg.norm(np.asarray(emb, np.float64), axis=-1)


def text_image_order_figures(
  image_emb: np.ndarray, text_emb: np.ndarray, geometry: str, curv: float | None
) -> dict[str, float]:
  """A text nearer the origin than its image (generality), per pair:
  text_closer_fraction, mean_dist_origin/{image,text} and, for Lorentz
  models, inside_cone_fraction (the image inside its text's entailment
  cone). Euclidean "distance" is the norm of the unnormalised feature."""
  if geometry == "lorentz":
    image_d = np.asarray(lorentz.dist_to_origin(image_emb, curv))
    text_d = np.asarray(lorentz.dist_to_origin(text_emb, curv))
    angle = np.asarray(lorentz.oxy_angle(text_emb, image_emb, curv))
    aperture = np.asarray(lorentz.half_aperture(text_emb, curv))
    figures = {"inside_cone_fraction": float(np.mean(angle <= aperture))}
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
