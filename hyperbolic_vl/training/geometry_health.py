"""Degenerate hyperbolic geometry, reported at a run's first step.

Two regimes train without an error and learn nothing hyperbolic:
- at the exponential map's cap (sqrt(c)|v| >= asinh(2^15), e.g. a large
  `model.curv_init`), every point of a direction coincides, distances stop
  depending on the embedding and the entailment loss sits at pi;
- in the flat limit (sqrt(c) d(x, origin) << 1, a tiny curvature or tiny
  initial norms), sinh(r)/r = 1 + r^2/6 is 1 to float32 precision and the
  model is Euclidean in all but name.
The first step's metrics (computed on the initial parameters) already show
either, so the trainer warns then instead of after hours of training.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

# More than half the embeddings at the cap: the batch's geometry is dead.
CAPPED_SHARE = 0.5
# Curvature-scaled radius below which sinh(r)/r - 1 = r^2/6 < 2e-5.
FLAT_RADIUS = 1e-2


def first_step_warnings(metrics: Mapping[str, float]) -> list[str]:
  """Warning lines for the logged metrics of step 1 ("train/..." keys);
  empty when the geometry is healthy or the objective is not hyperbolic."""
  warnings = []
  # A product of Lorentz spaces (PHyCLIP) logs its K curvatures as
  # train/curv/{mean,min,max}: the largest is the nearest to the cap and keeps
  # the flat check conservative.
  curv = metrics.get("train/curv", metrics.get("train/curv/max"))
  capped = metrics.get("train/exp_map_capped_fraction")
  if capped is not None and capped > CAPPED_SHARE:
    warnings.append(
      f"{100 * capped:.0f}% of the first batch's embeddings sit at the exponential "
      f"map's cap (curvature {float('nan') if curv is None else curv:.3g}): distances "
      "no longer depend on the embeddings. Lower model.curv_init or the initial "
      "embedding scale (model.alpha_init)."
    )
  distances = [v for k, v in metrics.items() if k.startswith("train/mean_dist_origin/")]
  if curv is not None and distances and not capped:
    radius = math.sqrt(max(curv, 0.0)) * max(distances)
    if radius < FLAT_RADIUS:
      warnings.append(
        f"the first batch's embeddings lie at curvature-scaled radius {radius:.2g} from "
        f"the origin (< {FLAT_RADIUS}): the geometry is flat to float32 precision. Raise "
        "model.curv_init or the initial embedding scale (model.alpha_init)."
      )
  return warnings
