"""One results table across runs: a JSON-lines file of evaluations, rendered
as a markdown table (rows: runs, columns: figures) and a picture.

Every evaluation appends one row to the results file, {"run", "workdir",
"evaluation", "step", "time", "figures"}; nothing is ever rewritten, so a
rerun adds rows, not files. The table shows one row per run: the figures of
all its rows merged in file order, the latest value of a figure winning, so
a second evaluator adds columns to a run's row and a re-evaluation updates
it. `python -m hyperbolic_vl.evaluate --workdir=A --workdir=B ... --results=F`
writes it (see evaluate.py).
"""

from __future__ import annotations

import datetime
import json
import math
import os
import re

from hyperbolic_vl import errors, files

# Figures that are bookkeeping, not results: left out of the default columns.
BOOKKEEPING = re.compile(r"(images_per_sec|/skipped$|/num_[a-z_]+$)")


def append_rows(path: str, rows: list[dict]) -> None:
  """Appends evaluation rows (one JSON object per line) to `path`."""
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  with open(path, "a", encoding="utf-8") as f:
    for row in rows:
      f.write(json.dumps(row, sort_keys=True) + "\n")


def evaluation_row(run: str, workdir: str, evaluation: str, step, figures: dict) -> dict:
  return {
    "run": run,
    "workdir": os.path.abspath(workdir),
    "evaluation": evaluation,
    "step": None if step is None else int(step),
    "time": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    "figures": {k: float(v) for k, v in figures.items()},
  }


def read_rows(path: str) -> list[dict]:
  """Every row of a results file; a line that is not a row is skipped and counted."""
  if not os.path.isfile(path):
    raise errors.DataError(f"results file {path!r} does not exist")
  rows, skipped = [], 0
  with open(path, encoding="utf-8") as f:
    for line in f:
      try:
        row = json.loads(line)
        assert isinstance(row["run"], str) and isinstance(row["figures"], dict)
      except (ValueError, KeyError, TypeError, AssertionError):
        skipped += line.strip() != ""
        continue
      rows.append(row)
  if skipped:
    print(f"{path}: {skipped} malformed line(s) skipped", flush=True)
  return rows


def merged_by_run(rows: list[dict]) -> dict[str, dict[str, float]]:
  """{run: figures}, runs in order of first appearance, later values winning."""
  runs: dict[str, dict[str, float]] = {}
  for row in rows:
    runs.setdefault(row["run"], {}).update(row["figures"])
  return runs


def default_columns(runs: dict[str, dict[str, float]], pattern: str = "") -> list[str]:
  """Every figure of any run, sorted, less bookkeeping; only those matching
  the regular expression `pattern` when it is given."""
  keys = sorted({k for figures in runs.values() for k in figures})
  if pattern:
    try:
      chosen = re.compile(pattern)
    except re.error as error:
      raise errors.ConfigError(
        f"--columns={pattern!r} is not a regular expression: {error}"
      ) from None
    return [k for k in keys if chosen.search(k)]
  return [k for k in keys if not BOOKKEEPING.search(k)]


def markdown_table(runs: dict[str, dict[str, float]], columns: list[str], digits: int = 3) -> str:
  """Rows: runs; columns: figures; a blank cell where a run lacks a figure."""

  def cell(value) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
      return ""
    return f"{value:.{digits}f}"

  lines = [
    "| run | " + " | ".join(columns) + " |",
    "|---|" + "---:|" * len(columns),
  ]
  for run, figures in runs.items():
    lines.append(f"| {run} | " + " | ".join(cell(figures.get(c)) for c in columns) + " |")
  return "\n".join(lines) + "\n"


def render(results_path: str, table_path: str = "", plot_path: str = "", pattern: str = "") -> str:
  """The markdown table of a results file (written to `table_path` when
  given) and, with `plot_path`, its picture (needs the `plots` extra)."""
  runs = merged_by_run(read_rows(results_path))
  if not runs:
    raise errors.DataError(f"results file {results_path!r} holds no evaluation row")
  columns = default_columns(runs, pattern)
  if not columns:
    raise errors.ConfigError(f"no figure of {results_path} matches --columns={pattern!r}")
  table = markdown_table(runs, columns)
  if table_path:
    files.write_file_atomically(table_path, table.encode("utf-8"))
  if plot_path:
    try:
      from hyperbolic_vl.plots import results_views
    except ImportError as error:
      raise errors.ConfigError(
        f"--plot needs matplotlib (pip install -e '.[plots]'): {error}"
      ) from None
    results_views.save_results_figure(runs, columns, plot_path)
  return table
