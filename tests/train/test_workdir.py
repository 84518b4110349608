"""A workdir's health across runs: the lock that keeps a second run out,
validation before anything is written, failed and corrupt checkpoints, and
metrics.jsonl after a resume. Every run is the tiny MERU config (16 px,
batch 16, 6 steps); repeats of its step compile come from the session's
compilation cache."""

import errno
import gc
import hashlib
import inspect
import json
import logging
import os
import platform
import shutil
import subprocess
import sys
import time

import jax
import numpy as np
import pytest
from etils import epath
from paths import REPO
from tiny_runs import small_config

from hyperbolic_vl import errors
from hyperbolic_vl.runs import abandoned_operations, checkpointing, loading, metrics_io, run_dir
from hyperbolic_vl.training import loop


def file_hashes(root) -> dict:
  """{relative path: sha256} of every file under `root`."""
  out = {}
  for folder, _, names in os.walk(root):
    for name in names:
      path = os.path.join(folder, name)
      with open(path, "rb") as f:
        out[os.path.relpath(path, root)] = hashlib.sha256(f.read()).hexdigest()
  return out


def logged_steps(workdir) -> list[int]:
  return [record["step"] for record in metrics_io.read_metrics(str(workdir))]


def losses(workdir) -> dict:
  return {r["step"]: r["train/loss"] for r in metrics_io.read_metrics(str(workdir))}


def max_difference(a, b) -> float:
  return max(
    jax.tree.leaves(
      jax.tree.map(lambda x, y: float(np.max(np.abs(np.asarray(x) - np.asarray(y)))), a, b)
    ),
    default=0.0,
  )


def run_config():
  """Logs every step, checkpoints at 3 and at the end (6)."""
  return small_config(log_training_steps=1)


@pytest.fixture(scope="module")
def interrupted_run(tmp_path_factory):
  """A workdir first started with a misspelt objective, then with the right
  command to step 5 (checkpoints 3 and 5, steps 1-5 logged); the step-5 save
  then looks like one a killed run left half written (Orbax's temporary
  folder), and the same command resumes from step 3 and ends at 6."""
  workdir = tmp_path_factory.mktemp("runs") / "interrupted"
  misspelt = run_config()
  misspelt.objective.name = "meruu"
  with pytest.raises(ValueError, match="meruu") as misspelt_error:
    loop.train(misspelt, str(workdir))
  left_after_misspelt = os.path.exists(workdir) and sorted(os.listdir(workdir))
  first = loop.train(run_config(), str(workdir), stop_at_step=5)
  first_losses = losses(workdir)
  checkpoints = workdir / "checkpoints"
  os.replace(checkpoints / "5", checkpoints / "5.orbax-checkpoint-tmp-1700000000")
  resumed = loop.train(run_config(), str(workdir))
  return {
    "workdir": workdir,
    "misspelt_error": str(misspelt_error.value),
    "left_after_misspelt": left_after_misspelt,
    "first_step": first.step,
    "first_losses": first_losses,
    "resumed": resumed,
  }


def test_a_misspelt_objective_leaves_nothing_and_the_corrected_command_runs(interrupted_run):
  assert "objective.name='meruu'" in interrupted_run["misspelt_error"]
  # Refused before anything was written: not even the workdir (nor its lock) is left.
  assert interrupted_run["left_after_misspelt"] is False
  assert interrupted_run["first_step"] == 5
  saved = json.loads((interrupted_run["workdir"] / "config.json").read_text())
  assert saved["objective"]["name"] == "meru"


def test_a_resume_logs_each_step_once_and_removes_incomplete_saves(interrupted_run):
  workdir = interrupted_run["workdir"]
  # Steps 4 and 5 were logged by the first run and again after resuming
  # from step 3: the resume dropped the first run's lines after step 3.
  assert logged_steps(workdir) == [1, 2, 3, 4, 5, 6]
  assert interrupted_run["resumed"].step == 6
  # The replayed steps are the same computation on the same batches (the
  # data iterator's state is in the checkpoint), so the losses agree to
  # float32 round-off; 1e-6 relative as in test_train's resume test.
  replayed, first = losses(workdir), interrupted_run["first_losses"]
  np.testing.assert_allclose([replayed[s] for s in (4, 5)], [first[s] for s in (4, 5)], rtol=1e-6)
  assert sorted(os.listdir(workdir / "checkpoints")) == ["3", "6"]  # the temporary folder is gone
  with open(workdir / "provenance.jsonl") as f:
    assert [json.loads(line)["start_step"] for line in f] == [0, 3]
  assert not (workdir / run_dir.LOCK_FILE).exists()


@pytest.mark.parametrize(
  ("override", "named"),
  [
    # Caught by config.json's model section.
    ({"model.embed_dim": 32}, "model.embed_dim: checkpoint 64 vs config 32"),
    # Not in the model section: caught by comparing the checkpoint's saved
    # shapes with the state this config builds.
    (
      {"input.tokenizer.context_length": 16},
      "params.text_tower.positional_embedding: checkpoint float32[32, 64] vs config "
      "float32[16, 64]",
    ),
  ],
)
def test_a_rejected_resume_leaves_every_file_unchanged(interrupted_run, override, named):
  workdir = interrupted_run["workdir"]
  before = file_hashes(workdir)
  with pytest.raises(checkpointing.CheckpointMismatchError) as error:
    loop.train(small_config(log_training_steps=1, **override), str(workdir))
  assert named in str(error.value) and "\n" not in str(error.value)
  assert file_hashes(workdir) == before
  # The intact run still loads as before.
  run_config_loaded, _, params, _ = loading.restore_run_params(str(workdir))
  assert run_config_loaded.model.embed_dim == 64
  assert max_difference(params, interrupted_run["resumed"].state["params"]) == 0.0


def test_a_corrupt_newest_step_is_moved_aside_and_the_run_resumes_before_it(
  interrupted_run, tmp_path, capsys, caplog, monkeypatch
):
  # Orbax's reads of the step's other arrays, abandoned at the first failure,
  # are reported when collected (as unraisable exceptions and asyncio's log):
  # the restore's settling must leave none of them for this hook.
  unraisable = []
  monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
  workdir = tmp_path / "run"
  shutil.copytree(interrupted_run["workdir"], workdir)
  newest = workdir / "checkpoints" / "6"
  # Cut short, as a copy or a save that was stopped leaves them: the arrays
  # whose bytes are gone fail to read, several at once (the index of the
  # arrays, in state/d, stays whole, so the reads start).
  truncated = 0
  for folder, _, names in os.walk(newest / "state"):
    for name in names:
      if folder.endswith(os.path.join("ocdbt.process_0", "d")):  # the arrays' data files
        path = os.path.join(folder, name)
        os.truncate(path, os.path.getsize(path) // 2)
        truncated += 1
  assert truncated > 0
  corrupt_files = file_hashes(newest)
  capsys.readouterr()
  resumed = loop.train(run_config(), str(workdir))
  gc.collect()  # the abandoned reads are reported when collected
  err = capsys.readouterr().err
  lines = [line for line in err.splitlines() if "unreadable" in line]
  moved = workdir / checkpointing.CORRUPT_FOLDER / "6"
  assert unraisable == [] and "Traceback" not in err
  assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
  assert len(lines) == 1
  # TensorStore's reason, not Orbax's wrapper (a repr of the array's whole spec).
  assert "TensorStore details" not in lines[0] and "OCDBT database" in lines[0]
  assert f"checkpoint step 6 in {workdir / 'checkpoints'} is unreadable" in lines[0]
  assert f"moved it to {moved} and resuming from step 3" in lines[0]
  assert file_hashes(moved) == corrupt_files  # moved aside whole, never deleted
  assert sorted(os.listdir(workdir / "checkpoints")) == ["3", "6"]
  assert logged_steps(workdir) == [1, 2, 3, 4, 5, 6]
  # Steps 4-6 trained again from step 3 end where the intact run ended:
  # the same computation, so equal to float32 round-off (bound 1e-6 as in
  # test_train's resume test, on parameters of order 1).
  assert resumed.step == 6
  assert max_difference(resumed.state["params"], interrupted_run["resumed"].state["params"]) < 1e-6


def unfinished_orbax_coroutines() -> int:
  """Orbax's coroutines alive after a collection that never ran to their end
  (started or not): what would be reported later, one traceback each."""
  return sum(
    1
    for value in gc.get_objects()
    if inspect.iscoroutine(value)
    and value.cr_frame is not None
    and abandoned_operations.in_orbax(value.cr_code.co_filename)
  )


def test_a_failed_restore_leaves_no_orbax_operation_behind(
  interrupted_run, tmp_path, caplog, monkeypatch, recwarn
):
  """Orbax stops waiting for a step's other reads at the first that fails and
  closes its loop; `read_step`'s loop runs them to their end first, so none
  is left to be reported later (an unraisable exception, "was never
  awaited", "Event loop is closed" as the interpreter exits). Without the
  settling loop, the first read here left 716 such coroutines (744 in a
  second run) and each later read added more; the step is read twice, as
  whether a read is still pending when the first fails is a race."""
  unreported = []
  monkeypatch.setattr(sys, "unraisablehook", unreported.append)  # drops no report
  checkpoints = tmp_path / "checkpoints"
  shutil.copytree(interrupted_run["workdir"] / "checkpoints", checkpoints)
  for folder, _, names in os.walk(checkpoints / "6" / "state"):
    if folder.endswith(os.path.join("ocdbt.process_0", "d")):  # the arrays' data files
      for name in names:
        os.truncate(os.path.join(folder, name), os.path.getsize(os.path.join(folder, name)) // 2)
  abstract = jax.tree.map(
    lambda leaf: jax.ShapeDtypeStruct(
      leaf.shape, leaf.dtype, sharding=jax.sharding.SingleDeviceSharding(jax.devices()[0])
    ),
    checkpointing.saved_state_metadata(str(checkpoints / "3")),
  )
  reasons, left = set(), []
  for _ in range(2):
    with pytest.raises(Exception) as unreadable:  # noqa: PT011 (whatever TensorStore raises)
      checkpointing.read_step(str(checkpoints), 6, abstract)
    reasons.add(checkpointing.first_line(unreadable.value).split(":")[1].strip())
    del unreadable
    gc.collect()
    left.append(unfinished_orbax_coroutines())
  assert left == [0, 0]
  assert unreported == []
  assert [str(w.message) for w in recwarn if "never awaited" in str(w.message)] == []
  assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
  assert reasons == {"OUT_OF_RANGE"}  # TensorStore's reason, not Orbax's wrapper


def test_two_runs_on_one_workdir_the_second_is_refused_and_a_dead_runs_lock_is_taken_over(
  tmp_path, monkeypatch, capsys
):
  workdir = tmp_path / "run"
  # Another run holds the workdir: a process that took the lock and lives on.
  holder = subprocess.Popen(
    [
      sys.executable,
      "-c",
      "import sys, time; from hyperbolic_vl.runs import run_dir; "
      "run_dir.WorkdirLock(sys.argv[1]).__enter__(); print('locked', flush=True); "
      "time.sleep(300)",
      str(workdir),
    ],
    cwd=REPO,
    env={**os.environ, "PYTHONPATH": str(REPO)},
    stdout=subprocess.PIPE,
    text=True,
  )
  try:
    assert holder.stdout.readline().strip() == "locked"
    with pytest.raises(errors.WorkdirError) as refused:
      loop.train(run_config(), str(workdir))
    message = str(refused.value)
    assert "\n" not in message
    assert f"host {platform.node()}, pid {holder.pid}" in message and "in use" in message
    assert sorted(os.listdir(workdir)) == [run_dir.LOCK_FILE]  # nothing written
  finally:
    holder.kill()  # dies holding the lock, as a crashed run would
    holder.wait()
  assert (workdir / run_dir.LOCK_FILE).exists()

  # The same command now takes the dead run's lock over; a second run tried
  # while it trains (here from inside it, at step 2) is refused.
  config = run_config()
  second_run_errors = []
  write = metrics_io.TrainLog.write

  def write_and_start_a_second_run(log, step, metrics, extra):
    if step == 2:
      try:
        loop.train(config, str(workdir))
      except errors.WorkdirError as error:
        second_run_errors.append(str(error))
    return write(log, step, metrics, extra)

  monkeypatch.setattr(metrics_io.TrainLog, "write", write_and_start_a_second_run)
  capsys.readouterr()
  result = loop.train(config, str(workdir))
  taken_over = [line for line in capsys.readouterr().err.splitlines() if "took over" in line]
  assert len(taken_over) == 1 and f"left by pid {holder.pid} on {platform.node()}" in taken_over[0]
  assert len(second_run_errors) == 1
  assert f"host {platform.node()}, pid {os.getpid()}" in second_run_errors[0]
  # The first run finished and lost nothing.
  assert result.step == 6
  assert logged_steps(workdir) == [1, 2, 3, 4, 5, 6]
  assert checkpointing.saved_steps(str(workdir / "checkpoints")) == [3, 6]
  assert not (workdir / run_dir.LOCK_FILE).exists()  # released at the end


def test_a_lock_of_another_host_is_refused_saying_how_to_remove_it(tmp_path):
  workdir = tmp_path / "run"
  workdir.mkdir()
  lock = workdir / run_dir.LOCK_FILE
  lock.write_text(
    json.dumps({"host": "node-7.cluster", "pid": 4242, "started_at": "2025-01-01T00:00:00"})
  )
  before = file_hashes(workdir)
  with pytest.raises(errors.WorkdirError) as refused:
    loop.train(run_config(), str(workdir))
  message = str(refused.value)
  assert "\n" not in message
  assert "host node-7.cluster (pid 4242" in message
  assert f"if that run is no longer running, delete {lock}" in message
  assert file_hashes(workdir) == before


def test_a_failed_background_save_stops_the_run_naming_the_last_good_step(tmp_path, monkeypatch):
  """The step-4 save fails in Orbax's background thread as on a full disk
  (its commit raises ENOSPC); the loop must stop at step 5, not at the next
  save, and name step 2 as the last good checkpoint."""
  from orbax.checkpoint._src.checkpointers import async_checkpointer

  commit = async_checkpointer._background_wait_for_commit_futures

  def commit_failing_at_step_4(directory, commit_futures, *args, **kwargs):
    if epath.Path(directory).name == "4":  # the step's final path; its files are still aside
      for write in commit_futures:  # the writes end, then the disk is full
        write.result()
      raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    return commit(directory, commit_futures, *args, **kwargs)

  monkeypatch.setattr(
    async_checkpointer, "_background_wait_for_commit_futures", commit_failing_at_step_4
  )
  # The test lets the background thread end before step 5, so "the next
  # step" is a fixed step and not a race with the thread.
  save = checkpointing.Checkpointer.save

  def save_and_let_the_background_end(checkpointer, step, *args, **kwargs):
    save(checkpointer, step, *args, **kwargs)
    if step == 4:
      while checkpointer.manager.is_saving_in_progress():
        time.sleep(0.01)

  monkeypatch.setattr(checkpointing.Checkpointer, "save", save_and_let_the_background_end)
  workdir = tmp_path / "run"
  with pytest.raises(checkpointing.CheckpointSaveError) as failed:
    loop.train(small_config(ckpt_steps=2, log_training_steps=1), str(workdir))
  checkpoints = workdir / "checkpoints"
  assert str(failed.value) == (
    "saving the checkpoint of step 4 failed (OSError: [Errno 28] No space left on device); "
    f"training stopped at step 5; the last good checkpoint is step 2 in {checkpoints}"
  )
  assert isinstance(failed.value, errors.WorkdirError)
  assert checkpointing.saved_steps(str(checkpoints)) == [2]
  assert logged_steps(workdir) == [1, 2, 3, 4]  # step 5 ran but stopped before its log
  assert not (workdir / run_dir.LOCK_FILE).exists()


def _lock_record(**fields) -> str:
  return json.dumps({"host": platform.node(), "started_at": "2025-01-01T00:00:00", **fields})


def test_a_lock_naming_this_process_or_a_reused_pid_is_taken_over(tmp_path, capsys):
  """Pids repeat: a restarted container runs its job under the pid the dead
  one had. A lock naming this process that this process does not hold, or a
  live pid whose process started after the lock was written, is stale."""
  workdir = tmp_path / "run"
  workdir.mkdir()
  lock = workdir / run_dir.LOCK_FILE
  lock.write_text(_lock_record(pid=os.getpid(), started=time.time() - 60))
  with run_dir.WorkdirLock(str(workdir)):
    assert json.loads(lock.read_text())["pid"] == os.getpid()
    assert "token" in json.loads(lock.read_text())  # this lock's own record now
  assert not lock.exists()
  assert f"left by pid {os.getpid()}" in capsys.readouterr().err

  if not os.path.exists("/proc/self/stat"):
    pytest.skip("process start times come from /proc")
  sleeper = subprocess.Popen(["sleep", "60"])
  try:
    # Written an hour before the sleeper started: its pid was reused.
    lock.write_text(_lock_record(pid=sleeper.pid, started=time.time() - 3600))
    with run_dir.WorkdirLock(str(workdir)):
      assert json.loads(lock.read_text())["pid"] == os.getpid()
    # Written after it started: the sleeper holds it.
    lock.write_text(_lock_record(pid=sleeper.pid, started=time.time()))
    with pytest.raises(errors.WorkdirError, match=f"pid {sleeper.pid}"):
      run_dir.WorkdirLock(str(workdir)).__enter__()
  finally:
    sleeper.kill()
    sleeper.wait()


def test_a_resume_drops_later_lines_and_a_line_cut_short(tmp_path):
  lines = [json.dumps({"step": s, "train/loss": 1.0 / s}) for s in (1, 2, 3, 4)]
  (tmp_path / "metrics.jsonl").write_text("\n".join(lines) + '\n{"step": 5, "train/lo')
  assert metrics_io.drop_steps_after(str(tmp_path), 2) == 3
  assert (tmp_path / "metrics.jsonl").read_text() == "\n".join(lines[:2]) + "\n"
  assert metrics_io.drop_steps_after(str(tmp_path), 2) == 0
  assert [p.name for p in tmp_path.iterdir()] == ["metrics.jsonl"]  # no temporaries left


def test_a_second_start_loads_the_step_from_the_compilation_cache(tmp_path):
  """Two runs of one config in fresh workdirs with one cache folder: the
  first compiles its step and writes it there, the second loads it (both say
  so in metrics.jsonl). The step's CPU compiler options are part of the
  cache key, so this also checks they are the same on both starts."""
  cache = tmp_path / "cache"
  config = small_config(total_steps=1, ckpt_steps=1, compilation_cache_dir=str(cache))
  hits = []
  for name in ("first", "second"):
    loop.train(config, str(tmp_path / name))
    records = metrics_io.read_metrics(str(tmp_path / name))
    hits.append(
      next(r["train/compilation_cache_hit"] for r in records if "train/compilation_cache_hit" in r)
    )
  assert hits == [0.0, 1.0]
  assert any(cache.iterdir())
