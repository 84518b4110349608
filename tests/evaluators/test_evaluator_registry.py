"""The evaluator registry: one registration per type, errors that name the
valid choices, a type registered by this file alone built and run by the
same calls training uses, the world's figures on data drawn from the world,
and the evaluate command's generic settings."""

import os
import subprocess
import sys

import cheap_codegen
import ml_collections
import numpy as np
import pytest
from paths import REPO
from tiny_fixtures import IMAGE, tiny_two_towers

from configs import meru as meru_config
from configs import radial as radial_config
from hyperbolic_vl import errors
from hyperbolic_vl import objectives as objectives_lib
from hyperbolic_vl import predictor as predictor_lib
from hyperbolic_vl.data import tokenizer as tokenizer_lib
from hyperbolic_vl.evaluators import EvaluatorUnavailable, command_entries, registry
from hyperbolic_vl.training import loop

ROOT = str(REPO)
BUILTIN = [
  "atmg_analysis",
  "hcl",
  "hierarchical_classification",
  "hierarchy",
  "linear_probe",
  "retrieval",
  "world",
  "world_boxes",
  "zero_shot",
]


# A type that exists only in this file: the mean distance of a few fixed
# images' embeddings to the origin, times `scale`.
@registry.register(
  "test_mean_norm", settings=dict(scale=1.0, num_images=3), description="test-only type"
)
class MeanNormEvaluator:
  def __init__(self, name, settings, run_input, tokenizer):
    del tokenizer
    self.name = name
    self.scale = float(settings.scale)
    self.run_input = run_input  # kept: what an evaluator is given is tested below
    rng = np.random.default_rng(0)
    size = int(run_input.image_size)
    self.images = rng.uniform(size=(int(settings.num_images), size, size, 3)).astype(np.float32)

  def __call__(self, predictor):
    emb = predictor.encode_images(self.images)
    return {f"{self.name}/mean_norm": self.scale * float(np.linalg.norm(emb, axis=-1).mean())}


@registry.register("test_unavailable")
def unavailable_evaluator(name, settings, run_input, tokenizer):
  raise EvaluatorUnavailable("no data for it here")


# A type that declares the model geometry it can evaluate.
@registry.register("test_lorentz_only", geometries=("lorentz",))
def lorentz_only_evaluator(name, settings, run_input, tokenizer):
  return lambda predictor: {f"{name}/curv": float(predictor.curv)}


def tiny_predictor():
  model_def, params = tiny_two_towers(geometry="lorentz")
  objective = objectives_lib.get(meru_config.get_config().objective)
  return predictor_lib.Predictor(model_def, objective, params, tokenizer=None, image_size=IMAGE)


def run_config(**evals):
  return ml_collections.ConfigDict({"input": {"image_size": IMAGE}, "evals": evals})


def full_run_config(geometry=None, **evals):
  """A run config with the sections an evaluator must not see."""
  model = {"embed_dim": 8} if geometry is None else {"embed_dim": 8, "geometry": geometry}
  return ml_collections.ConfigDict(
    {
      "input": {"image_size": IMAGE, "data": {"name": "world", "world_seed": 3}},
      "model": model,
      "objective": {"name": "meru"},
      "evals": evals,
    }
  )


def test_builtin_types_are_listed_with_their_defaults():
  assert set(BUILTIN) <= set(registry.names())
  entry = registry.entry("hcl", num_examples=8)
  assert entry.to_dict() == {
    "type": "hcl",
    "every_steps": 0,
    "batch_size": 256,
    "split": "test",
    "num_examples": 8,
  }
  # Optional ints stay settable from the command line.
  assert registry.entry("world").get_type("num_examples") is int


def test_unknown_types_and_keys_fail_naming_the_valid_ones():
  with pytest.raises(ValueError, match=r"unknown evaluator type 'hcl_world'; valid: .*'hcl'"):
    registry.entry("hcl_world")
  with pytest.raises(ValueError, match=r"unknown setting.*'scal'.*valid: .*'scale'"):
    registry.entry("test_mean_norm", scal=2.0)
  with pytest.raises(ValueError, match=r"type='nope' is not an evaluator type; valid: .*'world'"):
    registry.build_all(run_config(x={"type": "nope"}), tokenizer=None)
  with pytest.raises(ValueError, match=r"config.evals.x: unknown setting.*'scal'"):
    registry.build_all(run_config(x={"type": "test_mean_norm", "scal": 1}), tokenizer=None)
  with pytest.raises(ValueError, match="no evaluator 'y' in config.evals; valid: \\['x'\\]"):
    registry.build_all(run_config(x=registry.entry("test_mean_norm")), None, only=("y",))


def test_a_name_is_registered_once():
  with pytest.raises(ValueError, match="already registered"):
    registry.register("test_mean_norm")(unavailable_evaluator)
  with pytest.raises(ValueError, match="common to every type"):
    registry.register("test_bad", settings=dict(every_steps=1))


def test_a_type_registered_here_is_built_and_run_like_a_builtin(capsys):
  config = run_config(
    doubled=registry.entry("test_mean_norm", scale=2.0, every_steps=2),
    once=registry.entry("test_mean_norm", num_images=2),
    absent=registry.entry("test_unavailable"),
  )
  built = registry.build_all(config, tokenizer=None)
  assert [e.name for e in built] == ["doubled", "once"]
  assert "Evaluator 'absent' (test_unavailable) disabled: no data for it here" in (
    capsys.readouterr().out
  )
  predictor = tiny_predictor()
  figures = registry.run_all(built, predictor)
  emb = predictor.encode_images(built[0].evaluate.images)
  want = 2.0 * float(np.linalg.norm(emb, axis=-1).mean())
  assert figures["doubled/mean_norm"] == pytest.approx(want, rel=1e-6)
  assert set(figures) == {"doubled/mean_norm", "once/mean_norm"}
  # Periodic runs: only evaluators whose every_steps divides the step.
  assert set(registry.run_all(built, predictor, step=4)) == {"doubled/mean_norm"}
  assert registry.run_all(built, predictor, step=3) == {}
  assert set(registry.as_logged(figures)) == {"eval/doubled/mean_norm", "eval/once/mean_norm"}
  assert registry.format_results({"b": 0.5, "a": 1.0}, "T") == "T\n  a  1.0000\n  b  0.5000"


def test_an_evaluator_is_built_from_the_input_section_alone():
  config = full_run_config(x=registry.entry("test_mean_norm"))
  (built,) = registry.build_all(config, tokenizer=None)
  run_input = built.evaluate.run_input
  assert sorted(run_input.keys()) == ["data", "image_size"]
  assert "model" not in run_input and "objective" not in run_input and "evals" not in run_input
  assert run_input.image_size == IMAGE and run_input.data.world_seed == 3
  # Frozen: an evaluator cannot change the run's config through it.
  with pytest.raises(AttributeError):
    run_input.image_size = 2 * IMAGE
  with pytest.raises(AttributeError):
    run_input.data.world_seed = 4
  assert config.input.image_size == IMAGE and config.input.data.world_seed == 3


def test_a_declared_geometry_disables_the_evaluator_at_start_up(capsys):
  assert registry.get("test_lorentz_only").geometries == ("lorentz",)
  assert registry.get("safety_retrieval").geometries == ("lorentz",)
  assert registry.get("test_mean_norm").geometries == ()
  evals = dict(hyp=registry.entry("test_lorentz_only"), any=registry.entry("test_mean_norm"))
  built = registry.build_all(full_run_config("euclidean", **evals), tokenizer=None)
  assert [e.name for e in built] == ["any"]
  assert capsys.readouterr().out == (
    "Evaluator 'hyp' (test_lorentz_only) disabled: evaluator type 'test_lorentz_only' runs "
    "on model.geometry in ['lorentz']; this run's is 'euclidean'\n"
  )
  # Lorentz, stated or by default: built, and run on the predictor's model.
  for geometry in ("lorentz", None):
    built = registry.build_all(full_run_config(geometry, **evals), tokenizer=None)
    assert [e.name for e in built] == ["any", "hyp"]  # config.evals' (sorted) order
  assert capsys.readouterr().out == ""
  predictor = tiny_predictor()
  assert registry.run_all(built[1:], predictor) == {"hyp/curv": predictor.curv}
  # A built-in type refused the same way, before it looks for its data.
  safety = dict(safe=registry.entry("safety_retrieval"))
  assert registry.build_all(full_run_config("euclidean", **safety), tokenizer=None) == []
  assert "disabled: evaluator type 'safety_retrieval' runs on model.geometry in ['lorentz']" in (
    capsys.readouterr().out
  )


def test_data_drawn_from_the_world_gets_the_world_figures():
  """Radial's tiny config trains on `world_tiers`: its world and hierarchy
  evaluators read the world's held-out split through the data registry."""
  config = radial_config.get_config()
  with config.unlocked():
    config.input.image_size = IMAGE
    config.evals.world.num_examples = 4
    config.evals.hierarchy.num_examples = 4
  assert config.input.data.name == "world_tiers"
  tokenizer = tokenizer_lib.get_tokenizer(config.input.tokenizer)
  built = registry.build_all(config, tokenizer)
  by_name = {e.name: e.evaluate for e in built}
  assert set(by_name) == {"world", "hierarchy"}
  assert by_name["world"].data["image"].shape[0] == 4
  assert by_name["hierarchy"].data["tier_tokens"].shape[:2] == (4, 4)


def test_command_line_settings_are_generic():
  evals = command_entries.one_evaluator(
    "test_mean_norm", ["scale=2.5", "num_images=4", "every_steps=0"], batch_size=8
  )
  assert evals == {
    "test_mean_norm": registry.entry("test_mean_norm", scale=2.5, num_images=4, batch_size=8)
  }
  with pytest.raises(ValueError, match=r"'scal' is not a setting of 'test_mean_norm'; valid"):
    command_entries.one_evaluator("test_mean_norm", ["scal=2"])
  # The documented shorthand: --dataset names the source of source-keyed types.
  ((name, entry),) = command_entries.one_evaluator(
    "atmg_analysis", dataset="csv:/x/hierarcaps_test.csv", images="/x/images"
  ).items()
  assert name == "atmg_analysis_hierarcaps_test"
  assert (entry.source, entry.path, entry.image_root) == (
    "hierarcaps",
    "/x/hierarcaps_test.csv",
    "/x/images",
  )
  assert list(command_entries.one_evaluator("atmg_analysis", dataset="world")) == ["atmg_analysis"]
  ((name, entry),) = command_entries.one_evaluator(
    "zero_shot", ['prompts=["a {}", "the {}"]'], dataset="tfds:colours", data_dir="/d"
  ).items()
  assert (name, entry.dataset, entry.data_dir, entry.prompts) == (
    "colours",
    "tfds:colours",
    "/d",
    ("a {}", "the {}"),
  )
  hierarchy = command_entries.one_evaluator(
    "hierarchy", ["omit_first_prediction=true", "root=zero"]
  )
  assert hierarchy["hierarchy"].omit_first_prediction is True


@pytest.mark.slow  # an end-to-end run of the command line
def test_command_line_rejects_unknown_types_and_exits_non_zero_with_nothing_evaluated(tmp_path):
  env = dict(os.environ, XLA_FLAGS=cheap_codegen.XLA_FLAG, JAX_PLATFORMS="cpu")

  def evaluate(*args):
    return subprocess.run(
      [sys.executable, "-m", "hyperbolic_vl.evaluate", *args],
      cwd=ROOT,
      env=env,
      capture_output=True,
      text=True,
      timeout=300,
    )

  run = evaluate(f"--workdir={tmp_path}", "--eval=zero_shoot", "--dataset=cifar10")
  assert run.returncode != 0 and "valid: [" in run.stderr and "'zero_shot'" in run.stderr
  config = meru_config.get_config()
  with config.unlocked():
    config.input.update(batch_size=8, image_size=16)
    config.total_steps, config.ckpt_steps = 1, 1
    config.optim.warmup_steps = 1
  loop.train(config, str(tmp_path / "run"))
  run = evaluate(
    f"--workdir={tmp_path / 'run'}", "--eval=zero_shot", f"--dataset=folder:{tmp_path / 'none'}"
  )
  assert run.returncode == errors.EXIT_USER_ERROR, run.stdout[-2000:]
  assert "disabled" in run.stdout
  # Its one evaluator's reason is the error line.
  missing = tmp_path / "none"
  assert f"error: none: image folder '{missing}' does not exist" in run.stderr
  assert "Traceback" not in run.stderr
