"""Run directories: Orbax round trips, partial restores of another run's params
and aux, the teacher a student keeps, and the config differences a resume
reports. Runs are written directly (a config.json and a saved state), so no
training step is compiled."""

import json
import os
import shutil

import jax
import numpy as np
import pytest

from configs import clip as clip_config
from configs import meru as meru_config
from hyperbolic_vl.data import tokenizer as tokenizer_lib
from hyperbolic_vl.models import registry as models_registry
from hyperbolic_vl.runs import checkpointing, loading


def write_run(workdir, config, steps=(3,), aux=None):
  """A run directory as the trainer leaves it: config.json plus checkpoints
  of {step, params, aux} at `steps` (params scaled by the step so each step
  is told apart). Returns {step: params}."""
  os.makedirs(workdir, exist_ok=True)
  with open(os.path.join(workdir, "config.json"), "w") as f:
    json.dump(checkpointing.json_config(config), f)
  tokenizer = tokenizer_lib.get_tokenizer(config.input.tokenizer)
  _, params = models_registry.build_model_def(config, tokenizer, config.seed)
  saved = {}
  checkpointer = checkpointing.Checkpointer(str(workdir), keep=2)
  for step in steps:
    scaled = jax.tree.map(lambda x, s=step: x * (1.0 + s), params)
    state = {"step": np.int32(step), "params": scaled, "aux": aux or {}}
    checkpointer.save(step, state, {"position": step})
    saved[step] = scaled
  checkpointer.wait()
  checkpointer.close()
  return saved


def assert_trees_equal(a, b):
  assert jax.tree.structure(a) == jax.tree.structure(b)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_round_trip_keeps_the_newest_steps_bitwise(tmp_path):
  config = meru_config.get_config()
  saved = write_run(tmp_path, config, steps=(1, 2, 3), aux={"queue": np.arange(6.0)})
  checkpointer = checkpointing.Checkpointer(str(tmp_path), keep=2)
  assert checkpointer.latest_step() == 3
  assert sorted(checkpointer.manager.all_steps()) == [2, 3]  # keep=2
  template = {"step": np.int32(0), "params": saved[3], "aux": {"queue": np.zeros(6)}}
  abstract = jax.tree.map(
    lambda x: jax.ShapeDtypeStruct(np.shape(x), np.asarray(x).dtype), template
  )
  state, data_state = checkpointer.restore(2, abstract)
  assert data_state == {"position": 2} and int(state["step"]) == 2
  assert_trees_equal(state["params"], saved[2])
  np.testing.assert_array_equal(state["aux"]["queue"], np.arange(6.0))
  # Another objective's state: one error naming the checkpoint, not Orbax's traceback.
  wrong = dict(abstract, aux={"momentum": jax.ShapeDtypeStruct((6,), np.float64)})
  with pytest.raises(checkpointing.CheckpointMismatchError, match="does not match"):
    checkpointer.restore(2, wrong)
  checkpointer.close()


def test_another_runs_params_and_aux_restore_by_parts(tmp_path):
  config = clip_config.get_config()
  saved = write_run(tmp_path, config, steps=(2, 5), aux={"root": np.full((4,), 0.5, np.float32)})
  run_config, model_def, params, tokenizer = loading.restore_run_params(str(tmp_path))
  assert run_config.objective.name == "clip" and model_def.module.geometry == "euclidean"
  assert tokenizer.vocab_size == config.input.tokenizer.vocab_size
  assert_trees_equal(params, saved[5])  # the latest step by default
  _, _, params_2, _ = loading.restore_run_params(str(tmp_path), step=2)
  assert_trees_equal(params_2, saved[2])
  aux = loading.restore_run_aux(str(tmp_path), {"root": jax.ShapeDtypeStruct((4,), np.float32)})
  np.testing.assert_array_equal(aux["root"], np.full((4,), 0.5, np.float32))
  with pytest.raises(checkpointing.CheckpointMismatchError, match="lacks aux entries"):
    loading.restore_run_aux(str(tmp_path), {"missing": jax.ShapeDtypeStruct((4,), np.float32)})
  with pytest.raises(FileNotFoundError, match="not a hyperbolic_vl workdir"):
    loading.restore_run_params(str(tmp_path / "nowhere"))


def test_a_student_keeps_its_teachers_config_and_resumes_without_the_teacher(tmp_path):
  teacher_dir, student_dir = tmp_path / "teacher", tmp_path / "student"
  saved = write_run(teacher_dir, meru_config.get_config(), steps=(4,))
  first = loading.restore_teacher(str(teacher_dir), run_workdir=str(student_dir), resuming=False)
  assert_trees_equal(first.params, saved[4])
  kept = student_dir / loading.TEACHER_CONFIG
  assert json.loads(kept.read_text()) == json.loads((teacher_dir / "config.json").read_text())
  # Resumed: the teacher's workdir is gone; the graph comes from the kept
  # config and the params are placeholders of the same shapes (the student's
  # own checkpoint holds the real ones in its aux).
  shutil.rmtree(teacher_dir)
  resumed = loading.restore_teacher(str(teacher_dir), run_workdir=str(student_dir), resuming=True)
  shapes = lambda tree: jax.tree.map(lambda x: (np.shape(x), np.asarray(x).dtype), tree)
  assert shapes(resumed.params) == shapes(first.params)
  assert resumed.config.objective.name == "meru"
  assert resumed.model_def.module.geometry == first.model_def.module.geometry == "lorentz"


def test_differences_name_every_changed_key():
  saved = {"model": {"embed_dim": 64, "geometry": "lorentz"}, "objective": {"name": "meru"}}
  current = {"model": {"embed_dim": 128, "geometry": "lorentz", "name": "two_towers"}}
  assert checkpointing.differences(saved, current) == [
    "model.embed_dim: checkpoint 64 vs config 128",
    "model.name: checkpoint '<absent>' vs config 'two_towers'",
    "objective: checkpoint {'name': 'meru'} vs config '<absent>'",
  ]


def test_small_replicated_arrays_save_from_one_replica_without_compiling(tmp_path):
  """A replicated array whose per-replica slice is under 1 MiB is written
  from one replica: Orbax's replica-parallel save would first cut a slice on
  every device with one XLA program per device and shape (104 compiles at
  the tiny MERU's first save). A 1 MiB-per-replica array still saves in
  parallel; both read back bitwise."""
  from jax.sharding import NamedSharding, PartitionSpec

  mesh = jax.make_mesh((8,), ("data",))
  replicated = NamedSharding(mesh, PartitionSpec())
  rng = np.random.default_rng(0)
  small = {f"w{i}": rng.normal(size=(8 * (i + 1), 4)).astype(np.float32) for i in range(4)}
  large = rng.normal(size=(8, 1 << 15)).astype(np.float32)  # 1 MiB per replica's slice
  state = jax.device_put({**small, "large": large}, replicated)
  compiled = []
  listener = lambda event, duration, **_: compiled.append(event)
  jax.monitoring.register_event_duration_secs_listener(listener)
  try:
    checkpointer = checkpointing.Checkpointer(str(tmp_path), keep=1)
    checkpointer.save(1, {"small": {k: state[k] for k in small}}, {"step": 1})
    checkpointer.wait(1)
  finally:
    jax.monitoring.unregister_event_duration_listener(listener)
  assert "/jax/core/compile/backend_compile_duration" not in compiled
  checkpointer.save(2, state, {"step": 2}, force=True)
  checkpointer.wait(2)
  abstract = jax.tree.map(ocp_abstract, state)
  restored = checkpointer.manager.restore(
    2,
    args=checkpointing.ocp.args.Composite(
      state=checkpointing.ocp.args.StandardRestore(abstract),
      data=checkpointing.ocp.args.JsonRestore(),
    ),
  )["state"]
  checkpointer.close()
  for key, value in {**small, "large": large}.items():
    np.testing.assert_array_equal(np.asarray(restored[key]), value)


def ocp_abstract(x):
  return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding)
