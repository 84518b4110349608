"""`python -m hyperbolic_vl.plot --compare=RUN_A,RUN_B`: two runs' curves
overlaid, one line style per run, the logged values drawn as logged; a bad
run list is one line on stderr and exit code 2."""

import json
import os
import subprocess
import sys

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
