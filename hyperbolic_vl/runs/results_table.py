"""One results table across runs: a JSON-lines file of evaluations, rendered
as a markdown table (rows: runs, columns: figures); the evaluate command
draws its picture (plots/results_views.py).

Every evaluation appends one row to the results file, {"run", "workdir",
"evaluation", "step", "time", "figures", "evaluators", "refused"}; nothing is
ever rewritten, so a rerun adds rows, not files. The table shows one row per
run: the figures of all its rows merged in file order, the latest value of a
figure winning, so a second evaluator adds columns to a run's row and a
re-evaluation updates it. "refused" maps each evaluator that refused the run
to its one-line reason; the table's last column ("refused") lists them for
the runs that have any, until a later row of the run evaluates that
evaluator ("evaluators" names those a row ran). `python -m
hyperbolic_vl.evaluate --workdir=A --workdir=B ... --results=F` writes it
(see evaluate.py).
"""

from __future__ import annotations

import datetime
import json
import math
import os
import re
from typing import NamedTuple

from hyperbolic_vl import errors, files

# Figures that are bookkeeping, not results: left out of the default columns.
BOOKKEEPING = re.compile(r"(images_per_sec|/skipped$|/num_[a-z_]+$)")


def append_rows(path: str, rows: list[dict]) -> None:
  """Appends evaluation rows (one JSON object per line) to `path`, in one
  write, so an interrupted command leaves whole rows."""
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  text = "".join(json.dumps(row, sort_keys=True) + "\n" for row in rows)
  with open(path, "a", encoding="utf-8") as f:
    f.write(text)


def evaluation_row(
  run: str,
  workdir: str,
  evaluation: str,
  step,
  figures: dict,
  refused: dict | None = None,
  evaluators: list[str] | None = None,
) -> dict:
  """One row; `refused` {evaluator: reason}, `evaluators` the names it ran."""
  return {
    "run": run,
    "workdir": os.path.abspath(workdir),
    "evaluation": evaluation,
    "step": None if step is None else int(step),
    "time": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    "figures": {k: float(v) for k, v in figures.items()},
    "evaluators": list(evaluators or ()),
    "refused": {str(k): str(v) for k, v in (refused or {}).items()},
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


def refusals_by_run(rows: list[dict]) -> dict[str, dict[str, str]]:
  """{run: {evaluator: reason}} of the refusals no later row of the run
  undid by running that evaluator again; runs without any are left out."""
  refused: dict[str, dict[str, str]] = {}
  for row in rows:
    current = refused.setdefault(row["run"], {})
    for name in row.get("evaluators") or ():
      current.pop(name, None)
    current.update(row.get("refused") or {})
  return {run: reasons for run, reasons in refused.items() if reasons}


def refusal_note(reasons: dict[str, str]) -> str:
  """One table cell: "refused: NAME: reason; NAME: reason" (on one line)."""
  text = "; ".join(f"{name}: {reason}" for name, reason in reasons.items())
  return "refused: " + " ".join(text.split())


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


def markdown_table(
  runs: dict[str, dict[str, float]],
  columns: list[str],
  digits: int = 3,
  refused: dict[str, dict[str, str]] | None = None,
) -> str:
  """Rows: runs; columns: figures; a blank cell where a run lacks a figure.
  With `refused` ({run: {evaluator: reason}}, refusals_by_run), a last
  column "refused" holds each refused run's reasons."""
  refused = {run: reasons for run, reasons in (refused or {}).items() if run in runs}

  def cell(value) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
      return ""
    return f"{value:.{digits}f}"

  header = ["run", *columns] + (["refused"] if refused else [])
  lines = ["| " + " | ".join(header) + " |", "|---|" + "---:|" * len(columns)]
  lines[-1] += "---|" if refused else ""
  for run, figures in runs.items():
    cells = [run, *(cell(figures.get(c)) for c in columns)]
    if refused:  # a "|" in a reason would split the cell
      cells.append(refusal_note(refused[run]).replace("|", "\\|") if run in refused else "")
    lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines) + "\n"


class ResultsTable(NamedTuple):
  """A results file merged per run: {run: figures}, the columns shown and
  {run: {evaluator: reason}} of the refusals still standing."""

  runs: dict[str, dict[str, float]]
  columns: list[str]
  refused: dict[str, dict[str, str]]


def read_table(results_path: str, pattern: str = "") -> ResultsTable:
  """The table of a results file, its columns those matching `pattern`
  (default_columns). Drawing it is the caller's: `evaluate --plot` hands it
  to plots/results_views.py, so nothing in runs/ imports the pictures."""
  rows = read_rows(results_path)
  runs, refused = merged_by_run(rows), refusals_by_run(rows)
  if not runs:
    raise errors.DataError(f"results file {results_path!r} holds no evaluation row")
  columns = default_columns(runs, pattern)
  if not columns:
    raise errors.ConfigError(f"no figure of {results_path} matches --columns={pattern!r}")
  return ResultsTable(runs, columns, refused)


def write_markdown(table: ResultsTable, table_path: str = "") -> str:
  """The table as markdown, also written to `table_path` when given."""
  text = markdown_table(table.runs, table.columns, refused=table.refused)
  if table_path:
    files.write_file_atomically(table_path, text.encode("utf-8"))
  return text


def render(results_path: str, table_path: str = "", pattern: str = "") -> str:
  """The markdown table of a results file (written to `table_path` when given)."""
  return write_markdown(read_table(results_path, pattern), table_path)
