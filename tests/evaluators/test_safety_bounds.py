"""The "safety_bounds" evaluator (`evaluate --eval=safety_bounds`): the
bounds of a hand-built case written in the release's layout and returned as
figures; its `eval_path` setting edits a copy of the run's input only."""

import ml_collections
import numpy as np
import pytest

from hyperbolic_vl import errors
from hyperbolic_vl.evaluators import EvaluatorUnavailable, registry, safety_bounds
from hyperbolic_vl.evaluators.metrics import safety


class _RowsAreEmbeddings:
  """A predictor whose inputs are already the embeddings (curvature 1)."""

  curv = 1.0

  def encode_images(self, rows):
    return rows

  def encode_tokens(self, rows):
    return rows


def test_the_bounds_are_written_and_returned(tmp_path, capsys):
  """Five embeddings per modality at norms sinh(1..5), i.e. distances 1..5
  to the origin at curvature 1: linear percentiles 4.8 and 1.2, mean 3;
  the unsafe texts doubled in distance (2..10): 9.6, 2.4 and 6."""
  direction = np.asarray([[0.6, 0.8]])
  near, far = np.sinh(np.arange(1.0, 6.0)), np.sinh(2.0 * np.arange(1.0, 6.0))
  evaluator = object.__new__(safety_bounds.SafetyBoundsEvaluator)
  evaluator.data = {
    "image": near[:, None] * direction,
    "tokens": near[:, None] * direction,
    "unsafe_image": near[:, None] * direction,
    "unsafe_tokens": far[:, None] * direction,
  }
  evaluator.output_dir = str(tmp_path / "eval" / "safety_bounds")
  figures = evaluator(_RowsAreEmbeddings())
  # float64 throughout; asinh(sinh(x)) is exact to a few ulps.
  assert figures["safety_bounds/V/up_95"] == pytest.approx(4.8, abs=1e-9)
  assert figures["safety_bounds/V/low_05"] == pytest.approx(1.2, abs=1e-9)
  assert figures["safety_bounds/U/avg"] == pytest.approx(6.0, abs=1e-9)
  assert figures["safety_bounds/U/up_95"] == pytest.approx(9.6, abs=1e-9)
  assert len(figures) == 12  # 4 modalities x 3 statistics
  # Written where load().safety_bounds() looks (<workdir>/eval/<name>/).
  assert safety.find_bounds(tmp_path)["U"]["low_05"] == figures["safety_bounds/U/low_05"]
  assert f"wrote {tmp_path / 'eval' / 'safety_bounds' / 'hysac_bounds.json'}" in (
    capsys.readouterr().out
  )


def test_it_is_registered_for_lorentz_runs_with_the_commands_settings():
  evaluator_type = registry.get("safety_bounds")
  assert {"split", "num_examples", "eval_path", "output_dir"} <= set(evaluator_type.defaults())
  assert evaluator_type.defaults()["split"] == "validation"
  with pytest.raises(EvaluatorUnavailable, match=r"runs on model.geometry in \[.lorentz.\]"):
    evaluator_type.check_geometry("euclidean")


def test_eval_path_edits_a_copy_of_the_run_input():
  run_input = ml_collections.FrozenConfigDict(
    {"data": {"name": "visu", "eval_path": "test.json"}, "image_size": 32}
  )
  edited = safety_bounds.with_eval_path(run_input, "other.json")
  assert (edited.data.eval_path, run_input.data.eval_path) == ("other.json", "test.json")
  world = ml_collections.FrozenConfigDict({"data": {"name": "world_quadruplets"}})
  with pytest.raises(errors.ConfigError, match="'world_quadruplets' has no eval_path"):
    safety_bounds.with_eval_path(world, "other.json")
