"""`python -m hyperbolic_vl.plot --compare=RUN_A,RUN_B`: two runs' curves
overlaid, one line style per run, the logged values drawn as logged; a bad
run list is one line on stderr and exit code 2."""

import fnmatch
import json
import os
import pathlib
import subprocess
import sys
import tomllib

import numpy as np
import pytest
from paths import REPO

pytest.importorskip("matplotlib")

from hyperbolic_vl import plots  # noqa: E402


def artist(figure, gid):
  for ax in figure.axes:
    for child in ax.get_children():
      if child.get_gid() == gid:
        return child
  raise AssertionError(f"no artist {gid!r}")


def write_run(folder, scale):
  """A run directory holding only metrics.jsonl: three logged steps and a
  final evaluation, every value `scale` times run A's."""
  os.makedirs(folder, exist_ok=True)
  records = [
    {"step": s, "train/loss": scale * 3.0 / k, "train/curv": scale * k, "train/entail_weight": 0.2}
    for k, s in enumerate((10, 20, 30), start=1)
  ]
  records.append({"step": 30, "eval/i2t_recall@5": scale * 0.5})
  # An event row (a collapse warning) is no curve: the lines stay the logged figures.
  records.insert(2, {"step": 20, "event": "collapse", "message": "collapse: for the reader"})
  with open(os.path.join(folder, "metrics.jsonl"), "w") as f:
    f.write("".join(json.dumps(r) + "\n" for r in records))
  return str(folder)


def test_compare_curves_overlays_each_run_in_its_own_line_style(tmp_path):
  a, b = write_run(tmp_path / "a", 1.0), write_run(tmp_path / "b", 0.5)
  figure = plots.compare_curves([("a", a), ("b", b)])
  for label, scale, style in (("a", 1.0, "-"), ("b", 0.5, "--")):
    loss = artist(figure, f"{label}:train/loss")
    np.testing.assert_array_equal(loss.get_xdata(), [10, 20, 30])
    np.testing.assert_allclose(loss.get_ydata(), scale * np.array([3.0, 1.5, 1.0]))
    assert loss.get_linestyle() == style
    assert artist(figure, f"{label}:eval/i2t_recall@5").get_width() == scale * 0.5
  # Same metric, same colour in both runs.
  assert artist(figure, "a:train/curv").get_color() == artist(figure, "b:train/curv").get_color()
  titles = [ax.get_title() for ax in figure.axes if ax.get_title()]
  assert titles == ["loss terms", "curvature", "entailment weight", "evaluation"]


def test_compare_command_writes_the_png_and_refuses_a_missing_run(tmp_path):
  a, b = write_run(tmp_path / "a", 1.0), write_run(tmp_path / "b", 0.5)
  command = [sys.executable, "-m", "hyperbolic_vl.plot"]
  # Both commands start together (each is mostly imports).
  good = subprocess.Popen(
    [*command, f"--compare={a},{b}"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE
  )
  bad = subprocess.Popen(
    [*command, f"--compare={a},{tmp_path / 'missing'}"],
    cwd=REPO,
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
  )
  good_out, good_err = (x.decode() for x in good.communicate(timeout=300))
  bad_out, bad_err = (x.decode() for x in bad.communicate(timeout=300))
  png = os.path.join(a, "plots", "compare_a_vs_b.png")
  assert good.returncode == 0, good_err[-2000:]
  assert f"wrote {png}" in good_out
  with open(png, "rb") as f:
    assert f.read(8) == b"\x89PNG\r\n\x1a\n"
  assert bad.returncode == 2
  errors = [line for line in bad_err.splitlines() if line.startswith("error:")]
  assert errors == [
    f"error: --compare: {tmp_path / 'missing'} has no metrics.jsonl (not a run directory?)"
  ]
  assert "Traceback" not in bad_err
  assert not os.path.exists(os.path.join(tmp_path, "missing"))


def test_a_method_name_draws_the_run_against_its_shipped_reference_run(tmp_path):
  from hyperbolic_vl import plot
  from hyperbolic_vl.runs import reference_runs

  run = write_run(tmp_path / "mine", 1.0)
  figure, names, runs = plot.comparison_figure([run, "meru"])
  assert (names, runs) == (["mine", "meru_reference"], [run])
  # The reference's lines are its logged rows, read here straight from the file.
  with open(reference_runs.metrics_path("meru")) as f:
    rows = [json.loads(line) for line in f]
  for metric in ("train/loss", "train/curv", "train/mean_dist_origin/text"):
    line = artist(figure, f"meru_reference:{metric}")
    np.testing.assert_array_equal(line.get_xdata(), [row["step"] for row in rows])
    np.testing.assert_array_equal(line.get_ydata(), [row[metric] for row in rows])
    assert line.get_linestyle() == "--"  # the run first, solid; the reference dashed
  assert artist(figure, "mine:train/loss").get_linestyle() == "-"
  assert rows[-1]["step"] == 1000 and len(rows) == 40  # logged every 25 steps
  # The wheel carries every reference: pyproject's package-data globs match them.
  pyproject = tomllib.loads((pathlib.Path(REPO) / "pyproject.toml").read_text())
  globs = pyproject["tool"]["setuptools"]["package-data"]["hyperbolic_vl"]
  for method in reference_runs.methods():
    path = f"runs/reference_metrics/{method}.jsonl"
    assert any(fnmatch.fnmatch(path, g) for g in globs), path


def test_compare_with_a_method_writes_the_png_and_an_unknown_name_lists_the_known(tmp_path):
  from hyperbolic_vl.runs import reference_runs

  run = write_run(tmp_path / "mine", 1.0)
  command = [sys.executable, "-m", "hyperbolic_vl.plot", f"--workdir={run}"]
  good, bad = (
    subprocess.Popen(
      [*command, f"--compare={name}"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    for name in ("meru", "meruu")
  )
  good_out, good_err = (x.decode() for x in good.communicate(timeout=300))
  bad_out, bad_err = (x.decode() for x in bad.communicate(timeout=300))
  png = os.path.join(run, "plots", "compare_mine_vs_meru_reference.png")
  assert good.returncode == 0, good_err[-2000:]
  assert f"wrote {png}" in good_out
  with open(png, "rb") as f:
    assert f.read(8) == b"\x89PNG\r\n\x1a\n"
  assert bad.returncode == 2 and "Traceback" not in bad_err
  errors = [line for line in bad_err.splitlines() if line.startswith("error:")]
  known = "atmg, clip, euclip, hcl, hmid, hycoclip, hysac, meru, phyclip, radial, uncha"
  assert reference_runs.methods() == known.split(", ")
  assert errors == [
    f"error: no reference curves for 'meruu'; methods with reference curves: {known}"
  ]
