"""Degenerate hyperbolic geometry, reported at a run's first step, and a
collapse during training, reported once per symptom (`CollapseWatch`,
below the first-step checks).

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


# -- collapse during training ----------------------------------------------------
# MERU-style training can end in a collapse that raises no error: the
# curvature runs to its clamp, the texts fall to the origin where their cones
# are half-spaces (the aperture saturates at pi/2, MERU eq. 10), and the
# entailment loss reads ~0 while the hierarchy is gone. The thresholds below
# come from measured tiny runs (docs/training.md#collapse-warning).

# Logged steps in a row a symptom must hold before it is reported.
PATIENCE = 5
# The "event" of the metrics.jsonl row each warning is also written as
# ({"step", "event": "collapse", "message"}), beside the step's figures.
COLLAPSE_EVENT = "collapse"
# |log c - log bound| below this: the curvature sits at its clamp (the
# projection puts it there exactly; float32 rounding leaves ~1e-7).
CURV_AT_BOUND_LOG_TOL = 1e-3
# The entailment loss counted as ~0, and the share of texts whose aperture
# sits at pi/2 counted as saturated.
ENTAIL_NEAR_ZERO = 1e-3
APERTURE_SATURATED_SHARE = 0.5
# MERU's cone of a point at curvature-scaled distance r from the origin is a
# half-space once sinh(r) <= 2K (K = 0.1, MERU eq. 10): texts whose mean
# distance sits inside that radius have fallen onto the origin.
MIN_RADIUS = 0.1
HALF_SPACE_RADIUS = math.asinh(2 * MIN_RADIUS)  # 0.1987


class CollapseWatch:
  """Reads each logged step's metrics; returns each symptom's warning line
  once, the first time it has held for PATIENCE logged steps in a row:
  - curvature: a learned curvature at its clamp ([c0/f, f c0], model config);
  - cones: `loss/entailment` ~0 while most texts' apertures are saturated;
  - text distance: the texts' mean curvature-scaled distance to the origin
    inside the radius where a cone becomes a half-space.
  Objectives without a metric a symptom reads are never warned about it.
  `summary` repeats each warning said, with the step it first fired at,
  for the end of the run."""

  def __init__(self, model_config=None, patience: int = PATIENCE):
    model = dict(model_config or {})
    self.patience = patience
    self.log_curv_bounds = None
    if model.get("geometry", "lorentz") == "lorentz" and model.get("learn_curv", True):
      curv0 = float(model.get("curv_init", 1.0))
      factor = float(model.get("curv_clamp_factor", 10.0))
      if curv0 > 0 and factor >= 1:
        self.log_curv_bounds = (math.log(curv0 / factor), math.log(curv0 * factor))
    self.streaks = {"curvature": 0, "cones": 0, "text distance": 0}
    self.said: set[str] = set()
    self.first_said: list[tuple[int | None, str]] = []  # (step, line), in order

  def _curvature(self, metrics) -> str | None:
    if self.log_curv_bounds is None:
      return None
    values = [
      metrics[k] for k in ("train/curv", "train/curv/min", "train/curv/max") if k in metrics
    ]
    for value in values:
      if not value > 0:
        continue
      for bound, side in zip(self.log_curv_bounds, ("lower", "upper")):
        if abs(math.log(value) - bound) < CURV_AT_BOUND_LOG_TOL:
          return (
            f"the curvature has sat at its {side} clamp ({math.exp(bound):.3g}) for "
            f"{self.patience} logged steps: it no longer adapts (model.curv_clamp_factor "
            "bounds it)"
          )
    return None

  def _cones(self, metrics) -> str | None:
    entail = metrics.get("train/loss/entailment")
    saturated = metrics.get("train/aperture_saturated_fraction")
    if entail is None or saturated is None:
      return None
    if entail < ENTAIL_NEAR_ZERO and saturated > APERTURE_SATURATED_SHARE:
      return (
        f"the entailment loss has been ~0 ({entail:.2g}) for {self.patience} logged steps "
        f"while {100 * saturated:.0f}% of texts' cones are at their widest (aperture saturated; MERU's: half-spaces): "
        "satisfied by collapse, the hierarchy is gone"
      )
    return None

  def _text_distance(self, metrics) -> str | None:
    distance = metrics.get("train/mean_dist_origin/text")
    curv = metrics.get("train/curv")  # one Lorentz space only
    if distance is None or curv is None or not (curv > 0 and math.isfinite(distance)):
      return None
    radius = math.sqrt(curv) * distance
    if radius < HALF_SPACE_RADIUS:
      return (
        f"the texts' mean distance to the origin has been {distance:.3g} (curvature-scaled "
        f"{radius:.3g} < {HALF_SPACE_RADIUS:.3g}, where a cone is a half-space) for "
        f"{self.patience} logged steps: the texts have fallen onto the origin"
      )
    return None

  def update(self, metrics: Mapping[str, float], step: int | None = None) -> list[str]:
    """Warning lines (each symptom at most once per run) for one logged
    step (`step`, kept for `summary`)."""
    warnings = []
    for name, check in (
      ("curvature", self._curvature),
      ("cones", self._cones),
      ("text distance", self._text_distance),
    ):
      message = check(metrics)
      self.streaks[name] = self.streaks[name] + 1 if message else 0
      if message and self.streaks[name] >= self.patience and name not in self.said:
        self.said.add(name)
        warnings.append(f"collapse: {message} (docs/training.md#collapse-warning).")
        self.first_said.append((step, warnings[-1]))
    return warnings

  def summary(self) -> list[str]:
    """The end-of-run summary's lines: each warning said, with the logged
    step it first fired at (a scheduler log that keeps stdout alone keeps
    these); empty for a healthy run."""
    return [f"warning (first at step {step}): {line}" for step, line in self.first_said]
