"""Training curves from a run's `metrics.jsonl`: every loss term, the
curvature, logit scale, alphas, clamped fractions and evaluation figures,
one panel per family, so a glance tells whether a run behaves (the
curvature settling rather than collapsing, the entailment term falling,
clamps staying near zero). `compare_curves` overlays the same panels of
several runs (`python -m hyperbolic_vl.plot --compare=RUN_A,RUN_B`): each
metric keeps its colour, each run its line style.
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
  ("entailment weight", lambda name: name == "train/entail_weight"),
  ("alphas (projection scales)", lambda name: name.startswith("train/alpha")),
  (
    "entailment cones",
    lambda name: name in ("train/inside_cone_fraction", "train/aperture_saturated_fraction"),
  ),
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


# Line styles of the runs of a comparison, in the order given.
RUN_STYLES = ("-", "--", ":", "-.")


def compare_curves(sources: Sequence[tuple[str, object]], *, title: str | None = None):
  """The panels of `training_curves` with several runs overlaid:
  `sources` is [(label, workdir or metrics.jsonl or records), ...]; in each
  panel a metric has one colour and each run its line style (the first run
  solid, the second dashed, ...), the legend naming both. Evaluation figures
  are bars of each run's last value, grouped per figure. Raises ValueError
  when no run logged anything drawable or more runs than line styles."""
  if not 1 <= len(sources) <= len(RUN_STYLES):
    raise ValueError(f"compare_curves draws 1 to {len(RUN_STYLES)} runs, got {len(sources)}")
  runs = [(label, read_curves(source)) for label, source in sources]
  panels: dict[str, list[str]] = {}
  for name in sorted({name for _, curves in runs for name in curves}):
    panel = panel_of(name)
    if panel is not None:
      panels.setdefault(panel, []).append(name)
  order = [p for p, _ in PANELS if p in panels]
  if not order:
    raise ValueError("no training or evaluation metrics to draw in any of the runs")
  evaluation_lengths = [
    len(curves[name][0])
    for _, curves in runs
    for name in panels.get("evaluation", ())
    if name in curves
  ]
  bars = "evaluation" in panels and max(evaluation_lengths) <= 2
  line_panels = [p for p in order if not (bars and p == "evaluation")]
  columns = 2 if len(line_panels) > 1 else 1
  rows = math.ceil(len(line_panels) / columns)
  bar_height = 0.6 + 0.16 * len(runs) * len(panels["evaluation"]) if bars else 0.0
  # Taller rows than one run's: each metric's legend entry comes once per run.
  heights = [3.6] * rows + ([bar_height] if bars else [])
  figure = style.new_figure(5.0 * max(columns, 2 if bars else 1), sum(heights))
  grid = figure.add_gridspec(len(heights), columns, height_ratios=heights)
  for index, panel in enumerate(line_panels):
    ax = figure.add_subplot(grid[index // columns, index % columns])
    for run_index, (label, curves) in enumerate(runs):
      for name_index, name in enumerate(panels[panel]):
        if name not in curves:
          continue
        steps, values = curves[name]
        ax.plot(
          steps,
          values,
          marker="o" if len(steps) < 3 else None,
          ms=3,
          lw=1.2,
          color=style.series_color(name_index),
          ls=RUN_STYLES[run_index],
          label=f"{label}: {name.removeprefix('train/')} ({values[-1]:.4g})",
          gid=f"{label}:{name}",
        )
    ax.set_xlabel("step", fontsize=8)
    if len(ax.get_lines()) > 4:  # a long legend goes under the panel, not over its lines
      ax.legend(fontsize=6, frameon=False, ncols=2, loc="upper center", bbox_to_anchor=(0.5, -0.2))
    else:
      ax.legend(fontsize=6, frameon=False)
    _dress(ax, panel)
  if bars:
    ax = figure.add_subplot(grid[-1, :])
    _grouped_final_values(ax, panels["evaluation"], runs)
    _dress(ax, "evaluation")
  if title:
    figure.suptitle(title, fontsize=11)
  return figure


def _grouped_final_values(ax, names: list[str], runs) -> None:
  """Each figure's last value per run, the runs' bars side by side."""
  height = 0.8 / len(runs)
  rows = np.arange(len(names))
  for run_index, (label, curves) in enumerate(runs):
    values = [curves[name][1][-1] if name in curves else np.nan for name in names]
    offsets = rows + (run_index - (len(runs) - 1) / 2) * height
    bars = ax.barh(
      offsets, values, height=height, color=style.series_color(run_index), alpha=0.8, label=label
    )
    for bar, name in zip(bars, names):
      bar.set_gid(f"{label}:{name}")
    for offset, value in zip(offsets, values):
      if np.isfinite(value):
        ax.text(value, offset, f" {value:.3g}", va="center", fontsize=6)
  ax.set_yticks(rows, [name.split("/", 1)[-1] for name in names], fontsize=6.5)
  ax.invert_yaxis()
  ax.legend(fontsize=6.5, frameon=False)
  ax.set_xlabel("last value", fontsize=8)
