"""The picture of a results table across runs (`hyperbolic_vl.runs.results_table`):
one panel row per figure, one horizontal bar per run, the value printed at
the bar's end; a run without the figure has no bar, and the word "refused"
where an evaluator refused that run (its reasons are in the table)."""

from __future__ import annotations

import math

from hyperbolic_vl.plots import style


def results_figure(
  runs: dict[str, dict[str, float]],
  columns: list[str],
  refused: dict[str, dict[str, str]] | None = None,
):
  """{run: {figure: value}}, the figures to show and the runs' refusals
  ({run: {evaluator: reason}}) -> a Figure."""
  refused = refused or {}
  names = list(runs)
  labels = [f"{name} (refused)" if refused.get(name) else name for name in names]
  height = 0.32 * len(names) * len(columns) + 0.5 * len(columns) + 0.6
  figure = style.new_figure(7.0, max(2.0, height))
  axes = figure.subplots(len(columns), 1, squeeze=False)[:, 0]
  for ax, column in zip(axes, columns):
    values = [runs[name].get(column, math.nan) for name in names]
    positions = range(len(names))
    ax.barh(
      positions,
      [0.0 if math.isnan(v) else v for v in values],
      color=[style.series_color(i) for i in positions],
    )
    for position, value, name in zip(positions, values, names):
      if not math.isnan(value):
        ax.text(value, position, f" {value:.3f}", va="center", fontsize=8)
      elif refused.get(name):
        ax.text(0.0, position, " refused", va="center", fontsize=8, color="0.4")
    ax.set_yticks(list(positions), labels, fontsize=8)
    ax.invert_yaxis()  # first run on top, as in the table
    ax.set_title(column, fontsize=9, loc="left")
    finite = [v for v in values if not math.isnan(v)]
    top = max(finite + [0.0])
    ax.set_xlim(min(finite + [0.0]), top * 1.2 if top > 0 else 1.0)
    ax.tick_params(axis="x", labelsize=8)
  return figure


def save_results_figure(
  runs: dict[str, dict[str, float]],
  columns: list[str],
  path: str,
  refused: dict[str, dict[str, str]] | None = None,
) -> None:
  style.save_png(results_figure(runs, columns, refused), path)
