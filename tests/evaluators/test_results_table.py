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
