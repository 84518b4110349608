"""Training curves from a run's `metrics.jsonl`: every loss term, the
curvature, logit scale, alphas, clamped fractions and evaluation figures,
one panel per family, so a glance tells whether a run behaves (the
curvature settling rather than collapsing, the entailment term falling,
clamps staying near zero).
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence

import numpy as np

from hyperbolic_vl.plots import style
from hyperbolic_vl.runs import metrics_io

# Panels in drawing order: (title, does this metric name belong here). A
# name goes to the first panel that takes it; names no panel takes (e.g.
# throughput) are not drawn.
PANELS: tuple[tuple[str, object], ...] = (
  # The total and its direct terms (contrastive, entailment, ...); objectives
  # with sub-terms (HyCoCLIP's four of each) get a second panel for those.
  (
    "loss terms",
    lambda name: name == "train/loss" or name.count("/") == 2 and name.startswith("train/loss/"),
  ),
  ("loss sub-terms", lambda name: name.startswith("train/loss/")),
  ("curvature", lambda name: name == "train/curv"),
  ("logit scale", lambda name: name == "train/logit_scale"),
  ("alphas (projection scales)", lambda name: name.startswith("train/alpha")),
  (
    "clamped fractions",
    lambda name: name.startswith("train/") and name.endswith("fraction") and "wait" not in name,
  ),
  (
    "distance to origin",
    lambda name: name.startswith(("train/mean_dist_origin", "eval/mean_dist_origin")),
  ),
  ("evaluation", lambda name: name.startswith("eval/")),
)


def read_curves(source) -> dict[str, tuple[np.ndarray, np.ndarray]]:
  """{metric: (steps, values)}, steps increasing, from a workdir, a
  metrics.jsonl path or a list of records; non-finite values (logged as
  strings) become NaN."""
  if isinstance(source, str | os.PathLike):
    path = os.fspath(source)
    if os.path.isdir(path):
      path = os.path.join(path, "metrics.jsonl")
    records = metrics_io.read_metrics_file(path)
  else:
    records = list(source)
  # A step logged twice (a finished run started again re-evaluates its last
  # step) keeps its latest value: one point per step.
  by_step: dict[str, dict[int, float]] = {}
  for record in records:
    step = record.get("step")
    if step is None:
      continue
    for name, value in record.items():
      if name == "step":
        continue
      try:
        value = float(value)
      except (TypeError, ValueError):
        continue
      by_step.setdefault(name, {})[int(step)] = value if math.isfinite(value) else math.nan
  return {
    name: (np.asarray(sorted(values)), np.asarray([values[s] for s in sorted(values)], np.float64))
    for name, values in by_step.items()
  }


def panel_of(name: str) -> str | None:
  for title, belongs in PANELS:
    if belongs(name):
      return title
  return None


def training_curves(source, *, title: str | None = None, skip: Sequence[str] = ()):
  """One panel per family of metrics present in `source` (see
  `read_curves`), each metric a line over training steps with its last value
  in the legend. Evaluation figures logged at most twice (a short run's
  final evaluation) show as bars of their last values.
  Returns the figure; raises ValueError when nothing drawable was logged."""
  curves = {k: v for k, v in read_curves(source).items() if k not in skip}
  panels: dict[str, list[str]] = {}
  for name in sorted(curves):
    panel = panel_of(name)
    if panel is not None:
      panels.setdefault(panel, []).append(name)
  order = [p for p, _ in PANELS if p in panels]
  if not order:
    raise ValueError("no training or evaluation metrics to draw")
  # Line panels two per row; final evaluation bars (often 15-30 figures) on
  # a full-width last row as tall as their count needs.
  bars = "evaluation" in panels and max(len(curves[n][0]) for n in panels["evaluation"]) <= 2
  line_panels = [p for p in order if not (bars and p == "evaluation")]
  columns = 2 if len(line_panels) > 1 else 1
  rows = math.ceil(len(line_panels) / columns)
  bar_height = 0.6 + 0.16 * len(panels["evaluation"]) if bars else 0.0
  heights = [2.6] * rows + ([bar_height] if bars else [])
  figure = style.new_figure(5.0 * max(columns, 2 if bars else 1), sum(heights))
  grid = figure.add_gridspec(len(heights), columns, height_ratios=heights)
  for index, panel in enumerate(line_panels):
    ax = figure.add_subplot(grid[index // columns, index % columns])
    _lines(ax, panels[panel], curves)
    _dress(ax, panel)
  if bars:
    ax = figure.add_subplot(grid[-1, :])
    _final_values(ax, panels["evaluation"], curves)
    _dress(ax, "evaluation")
  if title:
    figure.suptitle(title, fontsize=11)
  return figure


def _dress(ax, panel: str) -> None:
  ax.set_title(panel, fontsize=10)
  ax.tick_params(labelsize=7)
  ax.grid(alpha=0.3)


def _lines(ax, names: list[str], curves) -> None:
  for index, name in enumerate(names):
    steps, values = curves[name]
    short = name.removeprefix("train/")  # evaluation figures keep "eval/"
    ax.plot(
      steps,
      values,
      marker="o" if len(steps) < 3 else None,
      ms=3,
      lw=1.2,
      color=style.series_color(index),
      ls="-" if index < len(style.SERIES_COLORS) else "--",  # colours repeat past 7
      label=f"{short} ({values[-1]:.4g})",
      gid=name,
    )
  ax.set_xlabel("step", fontsize=8)
  if len(names) > 4:  # a long legend goes under the panel, not over its lines
    ax.legend(fontsize=6.5, frameon=False, ncols=2, loc="upper center", bbox_to_anchor=(0.5, -0.2))
  else:
    ax.legend(fontsize=6.5, frameon=False)


def _final_values(ax, names: list[str], curves) -> None:
  """Figures evaluated once or twice (the end of a short run): their last
  values as labelled horizontal bars, easier to read than lone markers."""
  values = [curves[name][1][-1] for name in names]
  rows = np.arange(len(names))
  bars = ax.barh(rows, values, color=style.IMAGE_COLOR, alpha=0.8, gid="eval_bars")
  for bar, name in zip(bars, names):
    bar.set_gid(name)
  ax.set_yticks(rows, [name.split("/", 1)[-1] for name in names], fontsize=6.5)
  ax.invert_yaxis()
  for row, value in zip(rows, values):
    ax.text(value, row, f" {value:.3g}", va="center", fontsize=6.5)
  step = max(int(curves[name][0][-1]) for name in names)
  ax.set_xlabel(f"value at step {step}", fontsize=8)
