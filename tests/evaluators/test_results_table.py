"""The results table's merging and markdown on hand-written rows."""

import json

import pytest

from hyperbolic_vl import errors
from hyperbolic_vl.runs import results_table


def write_rows(path, rows):
  path.write_text("".join(json.dumps(r) + "\n" for r in rows) + "not a row\n")


def test_rows_merge_per_run_latest_winning_and_render_as_markdown(tmp_path, capsys):
  path = tmp_path / "results.jsonl"
  write_rows(
    path,
    [
      {"run": "meru", "figures": {"a/x": 0.5, "a/skipped": 3.0}},
      {"run": "clip", "figures": {"a/x": 0.25}},
      {"run": "meru", "figures": {"a/x": 0.75, "b/y": 1.0}},
    ],
  )
  runs = results_table.merged_by_run(results_table.read_rows(str(path)))
  assert "1 malformed line(s) skipped" in capsys.readouterr().out
  assert runs == {"meru": {"a/x": 0.75, "a/skipped": 3.0, "b/y": 1.0}, "clip": {"a/x": 0.25}}
  assert results_table.default_columns(runs) == ["a/x", "b/y"]
  assert results_table.default_columns(runs, "^b/") == ["b/y"]
  table = results_table.render(str(path), str(tmp_path / "t.md"))
  assert table == (
    "| run | a/x | b/y |\n|---|---:|---:|\n| meru | 0.750 | 1.000 |\n| clip | 0.250 |  |\n"
  )
  assert (tmp_path / "t.md").read_text() == table


def test_appended_rows_are_read_back(tmp_path):
  path = str(tmp_path / "sub" / "results.jsonl")
  row = results_table.evaluation_row("r", str(tmp_path), "world", None, {"f": 1})
  results_table.append_rows(path, [row])
  results_table.append_rows(path, [row])
  assert results_table.read_rows(path) == [row, row]


def test_missing_file_and_bad_pattern_are_user_errors(tmp_path):
  with pytest.raises(errors.DataError, match="does not exist"):
    results_table.read_rows(str(tmp_path / "none.jsonl"))
  with pytest.raises(errors.ConfigError, match="not a regular expression"):
    results_table.default_columns({"r": {"a": 1.0}}, "(")


def test_a_refusal_shows_in_its_run_row_until_a_later_row_evaluates_it(tmp_path):
  rows = [
    {"run": "a", "figures": {"x/f": 0.5}, "evaluators": ["x"], "refused": {}},
    {"run": "p", "figures": {}, "evaluators": ["x"], "refused": {"x": "geometry is 'product'"}},
    {"run": "q", "figures": {}, "evaluators": ["x", "y"], "refused": {"x": "one | two"}},
    # A later evaluation of q that ran x undoes x's refusal; y's stays.
    {"run": "q", "figures": {"x/f": 0.25}, "evaluators": ["x"], "refused": {}},
    {"run": "q", "figures": {}, "evaluators": ["y"], "refused": {"y": "no data"}},
  ]
  assert results_table.refusals_by_run(rows) == {
    "p": {"x": "geometry is 'product'"},
    "q": {"y": "no data"},
  }
  path = tmp_path / "results.jsonl"
  path.write_text("".join(json.dumps(r) + "\n" for r in rows))
  assert results_table.render(str(path)) == (
    "| run | x/f | refused |\n"
    "|---|---:|---|\n"
    "| a | 0.500 |  |\n"
    "| p |  | refused: x: geometry is 'product' |\n"
    "| q | 0.250 | refused: y: no data |\n"
  )
  # A "|" in a reason is escaped, so it does not split the cell.
  del rows[3:]
  path.write_text("".join(json.dumps(r) + "\n" for r in rows))
  assert "| q |  | refused: x: one \\| two |" in results_table.render(str(path))
  # Rows written before refusals were recorded render as before: no column.
  assert "refused" not in results_table.markdown_table({"a": {"x/f": 0.5}}, ["x/f"])


def test_the_picture_marks_a_refused_run():
  pytest.importorskip("matplotlib")
  from hyperbolic_vl.plots import results_views

  figure = results_views.results_figure(
    {"a": {"x/f": 0.5}, "p": {}}, ["x/f"], refused={"p": {"x": "geometry is 'product'"}}
  )
  (axes,) = figure.axes
  assert [label.get_text() for label in axes.get_yticklabels()] == ["a", "p (refused)"]
  assert [text.get_text() for text in axes.texts] == [" 0.500", " refused"]
