"""The training loop: `train_and_evaluate(config, workdir)` is the library
entry point used by `main.py`, the tests and the colabs. The step comes
from `step.py` and everything the loop runs with from `setup.validate`;
the loop feeds batches, logs, checkpoints, evaluates and stops cleanly
(pre-emption, a non-finite step, a failed save)."""

from __future__ import annotations

import copy
import dataclasses
import logging
import os
import signal
import sys
import time
from typing import Any

import jax
import ml_collections
import numpy as np
from jax.experimental import multihost_utils

from hyperbolic_vl import predictor as predictor_lib
from hyperbolic_vl.data import run_length
from hyperbolic_vl.evaluators import registry
from hyperbolic_vl.models import registry as models_registry
from hyperbolic_vl.runs import checkpointing, metrics_io, run_dir
from hyperbolic_vl.training import (
  compilation,
  geometry_health,
  preemption,
  preflight,
  setup,
  sharding,
)
from hyperbolic_vl.training import step as step_lib
from hyperbolic_vl.training.input_health import InputHealth


class NonFiniteLossError(FloatingPointError):
  pass


def _to_global(batch: dict, batch_sharding) -> dict:
  return jax.tree.map(
    lambda x: jax.make_array_from_process_local_data(batch_sharding, np.asarray(x)), batch
  )


@dataclasses.dataclass
class TrainResult:
  state: dict
  model_def: models_registry.ModelDef
  objective: Any
  tokenizer: Any
  step: int
  checkpoint_dir: str
  evaluators: list  # registry.NamedEvaluator, built before step 1
  predictor_functions: dict  # compiled embedding functions, shared by predictors
  config: Any = None
  preempted: bool = False  # stopped early by SIGTERM, with a checkpoint of `step`
  # The model evaluators embed with: the run's in float32 (`setup.eval_model_def`).
  eval_model_def: Any = None
  mesh: jax.sharding.Mesh | None = None  # the run's mesh (params sharded over its fsdp axis)

  def predictor(self) -> predictor_lib.Predictor:
    return predictor_lib.for_run_state(
      self.eval_model_def or self.model_def,
      self.objective,
      _replicated_params(self.state, self.mesh) if self.mesh is not None else self.state,
      self.tokenizer,
      self.config,
      self.predictor_functions,
    )


def _replicated_params(state: dict, mesh) -> dict:
  """The state with its params whole on every device, as the Predictor
  takes them (every process calls it together); unchanged without fsdp."""
  return {**state, "params": sharding.gather_to_replicated(state["params"], mesh)}


def train(
  config: ml_collections.ConfigDict,
  workdir: str,
  *,
  stop_at_step: int | None = None,
  exit_at_once: bool = False,
) -> TrainResult:
  """Trains to `config.total_steps`, resuming from `workdir` if it holds checkpoints.

  `stop_at_step` ends the run early at that step with a checkpoint, as a
  pre-empted or time-limited job would (the schedule still targets
  total_steps); running again in the same workdir continues from there.
  The workdir is locked for the run (`run_dir.WorkdirLock`). Ctrl-C while
  training saves the step in flight and raises `preemption.RunInterrupted`;
  `exit_at_once` (the command line) ends the process on a signal that comes
  while setting up, compiling or evaluating (`preemption.StopSignals`).
  """
  with run_dir.WorkdirLock(workdir) as lock:
    with _stop_signals(workdir, lock, exit_at_once) as signals:
      with compilation.persistent_cache(config) as cache_dir:
        return _train(config, os.path.abspath(workdir), stop_at_step, signals, cache_dir)


def _stop_signals(workdir: str, lock: run_dir.WorkdirLock, exit_at_once: bool):
  checkpoint_dir = os.path.join(os.path.abspath(workdir), "checkpoints")

  def describe(phase: str, signum: int) -> str:
    steps = checkpointing.saved_steps(checkpoint_dir)
    kept = f"checkpoint step {steps[-1]} is kept" if steps else "no checkpoint was written yet"
    if phase == "again":
      return (
        f"{preemption.signal_name(signum)} again: stopped at once, nothing half written is "
        f"kept; {kept}; run the same command to resume"
      )
    return (
      f"{preemption.signal_name(signum)} while {phase}: stopped; {kept}; run the same "
      "command to resume"
    )

  return preemption.StopSignals(
    exit_at_once=exit_at_once, describe_stop=describe, on_exit_at_once=lock.release
  )


def _train(
  config, workdir: str, stop_at_step: int | None, signals, cache_dir: str | None
) -> TrainResult:
  """The run's phases: start (or resume), the steps with their logging,
  checkpoint and evaluation cadence, and the shutdown that saves the last
  step and says how the run ended."""
  start_time = time.perf_counter()
  start = _start_or_resume(config, workdir, stop_at_step, signals)
  loop = _StepLoop(start, workdir, signals, cache_dir, start_time)
  stopped_by = loop.run_steps()
  return loop.shut_down(stopped_by)


@dataclasses.dataclass
class _Start:
  """What the step loop starts from: the validated run, its compiled step
  and the batch it was compiled for (None when no step is left to run),
  and the workdir prepared with its checkpointer."""

  config: Any  # with its run length and data paths resolved
  run: setup.Run
  end_step: int  # total_steps, or the step `stop_at_step` ends the run at
  input_health: InputHealth
  train_step: Any  # (state, batch) -> (state, metrics), the state donated
  first_batch: dict | None  # global, not yet run
  compiled: compilation.CompiledStep | None
  checkpointer: checkpointing.Checkpointer


def _start_or_resume(config, workdir: str, stop_at_step: int | None, signals) -> _Start:
  """Everything before step 1 (or the resumed step): the run validated,
  its first batch read and its step compiled while the workdir is as it was
  (so a refusal leaves it so), then the workdir prepared."""
  signals.phase = "setting up"
  # A run sized in epochs (HCL's and Radial's paper variants) gets its step
  # counts from the data here, so config.json records them.
  config = _absolute_data_paths(run_length.resolve(config))
  run = setup.validate(config, workdir)
  print(setup.parameter_summary(run.state["params"], run.step_settings.trainable), flush=True)
  total_steps = int(config.total_steps)
  end_step = total_steps if stop_at_step is None else min(stop_at_step, total_steps)
  steps_left = run.start_step < end_step
  if jax.process_index() == 0 and steps_left:
    preflight.print_lines(preflight.describe(config, run.mesh.devices.size, run.start_step))
  input_health = InputHealth(float(config.input.get("max_bad_fraction", 0.01)))
  train_step, first_batch, compiled = run.train_step.jitted, None, None
  if steps_left:
    # Read before anything is written: data whose every image is missing or
    # undecodable is refused with the workdir as it was.
    first_host_batch = next(run.train_iter)
    input_health.update(first_host_batch)
    first_batch = _to_global(first_host_batch, sharding.batch_sharding(run.mesh))
    compiled = _compile_step(config, run, first_batch, signals)
    train_step = _with_fallback(compiled.executable, run.train_step.jitted)
  run_dir.prepare(
    config, workdir, run.start_step, run.resumable.unreadable if run.resumable else {}, run.mesh
  )
  # The other processes open the checkpoints once process 0 has tidied them.
  preemption.processes_meet("hyperbolic_vl_workdir_ready")
  checkpointer = checkpointing.Checkpointer(workdir, config.get("keep_ckpts", 3))
  if run.resumable is not None:
    logging.info("resumed from %s at step %d", checkpointer.directory, run.start_step)
    print(f"Resumed from checkpoint at step {run.start_step} in {workdir}", flush=True)
  return _Start(
    config, run, end_step, input_health, train_step, first_batch, compiled, checkpointer
  )


def _compile_step(config, run: setup.Run, batch: dict, signals) -> compilation.CompiledStep:
  """The step compiled ahead of the first step and before anything is
  written: the console says what the wait is, the persistent cache
  (`compilation`) whether it held the step, and a step that cannot fit the
  device is refused with the workdir as it was."""
  signals.phase = "compiling the step"
  print("Compiling the step...", flush=True)
  compiled = compilation.compile_step(run.train_step.jitted, run.state, batch)
  # The gradients are params-sized temporaries, split like the params by fsdp.
  gradient_bytes = sum(leaf.nbytes for leaf in jax.tree.leaves(run.state["params"])) // max(
    int(config.mesh.get("fsdp", 1) or 1), 1
  )
  memory, refusal = preflight.memory_line(
    config, compiled.memory, run.mesh.devices.size, gradient_bytes
  )
  if memory and jax.process_index() == 0:
    print(memory, flush=True)
  if refusal:
    raise preflight.StepDoesNotFitError(refusal)
  signals.phase = "setting up"
  return compiled


class _StepLoop:
  """The steps of a started run (`run_steps`), each followed by its
  logging, checkpoint and evaluation cadence, and the shutdown
  (`shut_down`). Holds the state the steps advance."""

  def __init__(self, start: _Start, workdir: str, signals, cache_dir: str | None, start_time):
    config, run = start.config, start.run
    self.config, self.run, self.signals = config, run, signals
    self.cache_dir, self.start_time = cache_dir, start_time
    self.state, self.step, self.start_step = run.state, run.start_step, run.start_step
    self.end_step, self.total_steps = start.end_step, int(config.total_steps)
    self.train_step, self.pending_batch = start.train_step, start.first_batch
    self.compiled, self.input_health = start.compiled, start.input_health
    self.checkpointer = start.checkpointer
    self.batch_sharding = sharding.batch_sharding(run.mesh)
    self.writer = metrics_io.MetricsWriter(workdir)
    self.log_every = int(config.get("log_training_steps", 50))
    self.ckpt_every = int(config.get("ckpt_steps", 1000))
    self.predictor_functions = {}
    self.evaluation_model = setup.eval_model_def(config, run.model_def, run.tokenizer)
    self.eval_steps = sorted({e.every_steps for e in run.evaluators if e.every_steps > 0})
    # Progress, ETA and the time share of evaluation and checkpointing, in the log.
    self.report_progress = metrics_io.progress_reporter(self.total_steps, self.log_every)
    self.progress = metrics_io.ProgressLine(
      self.total_steps,
      int(config.input.batch_size),
      float(config.get("progress_every_secs", 30.0)),
      stream=sys.stdout if jax.process_index() == 0 else open(os.devnull, "w"),  # noqa: SIM115
    )
    self.log = metrics_io.TrainLog(
      self.writer, self.total_steps, int(config.input.batch_size), self.step
    )
    self.collapse = geometry_health.CollapseWatch(config.model)  # each symptom said once

  # The step loop.

  def run_steps(self) -> int | None:
    """Steps to the end step; the signal that stopped the run early (its
    step saved by `shut_down`), else None."""
    self.signals.phase = preemption.TRAINING
    previous_loss = None
    while self.step < self.end_step:
      batch = self.pending_batch if self.pending_batch is not None else self.next_batch()
      self.pending_batch = None
      logged = self.is_log_step(self.step + 1)
      if logged:  # dispatched before the step that donates these params
        params_norm = step_lib.param_norm(self.state["params"])
      self.state, metrics = self.train_step(self.state, batch)
      # At most two steps in flight: the host prepares the next batch while
      # this step runs, and the progress line's clock follows the devices'.
      if previous_loss is not None:
        jax.block_until_ready(previous_loss)
      previous_loss = metrics["train/loss"]
      self.step += 1
      self.report_progress(self.step)
      self.check_saves(self.step)
      if self.step == self.start_step + 1:
        self.report_first_step(metrics)
      loss = self.write_log(metrics, params_norm) if logged else None
      self.progress.update(self.step, loss)
      self.checkpoint_and_evaluate_when_due()
      if self.step < self.end_step and self.signals.reached(self.step):
        # Every process stops after the same step and saves it together.
        stopped_by = self.signals.reached(self.step)
        self.progress.finish()
        print(_stop_line(stopped_by, self.step), flush=True)
        return stopped_by
    return None

  def next_batch(self) -> dict:
    wait_start = time.perf_counter()
    host_batch = next(self.run.train_iter)
    self.log.waited(time.perf_counter() - wait_start)
    self.input_health.update(host_batch)
    return _to_global(host_batch, self.batch_sharding)

  def is_log_step(self, at_step: int) -> bool:
    return at_step % self.log_every == 0 or at_step == self.total_steps

  def report_first_step(self, metrics: dict) -> None:
    """Time to first step, and the initial parameters' geometry warnings."""
    first_step = jax.device_get(metrics)
    time_to_first_step = time.perf_counter() - self.start_time
    _report_start(self.log, time_to_first_step, self.compiled, self.cache_dir)
    self.progress.started(self.step)
    if self.step == 1:  # the initial parameters' metrics: a degenerate geometry shows here
      for warning in geometry_health.first_step_warnings(first_step):
        self.progress.finish()
        print(f"warning: {warning}", file=sys.stderr, flush=True)

  def write_log(self, metrics: dict, params_norm) -> float:
    """A log step's figures to metrics.jsonl, its collapse warnings to
    stderr and metrics.jsonl (an event row); the loss it logged."""
    self.check_finite(self.step)
    metrics = {**metrics, "train/l2_params": params_norm}
    written = self.log.write(self.step, jax.device_get(metrics), self.input_health.window_metrics())
    for warning in self.collapse.update(written, self.step):
      self.progress.finish()
      print(f"warning: {warning}", file=sys.stderr, flush=True)
      self.writer.write_event(self.step, geometry_health.COLLAPSE_EVENT, warning)
    return written["train/loss"]

  # Checkpoint and evaluation cadence.

  def checkpoint_and_evaluate_when_due(self) -> None:
    step = self.step
    if step % self.ckpt_every == 0 and step < self.end_step:
      with self.report_progress.timed("checkpoint"):
        self.save(step)
    if step < self.total_steps and any(step % every == 0 for every in self.eval_steps):
      self.evaluate()

  def evaluate(self) -> None:
    """The run's evaluators on the current params, logged at this step."""
    self.signals.phase = "evaluating"
    run = self.run
    predictor = predictor_lib.for_run_state(
      self.evaluation_model,
      run.objective,
      _replicated_params(self.state, run.mesh),
      run.tokenizer,
      self.config,
      self.predictor_functions,
    )
    with self.report_progress.timed("eval"):
      figures = registry.run_all(run.evaluators, predictor, self.step)
    if figures:
      self.writer.write(self.step, registry.as_logged(figures))
    self.signals.phase = preemption.TRAINING

  def save(self, step: int, force: bool = False) -> None:
    self.check_finite(step)
    self.checkpointer.save(step, self.state, self.run.train_iter.get_state(), force=force)

  def check_finite(self, at_step: int) -> None:
    bad = int(self.state["first_nonfinite_step"])
    if bad >= 0:
      checkpointer = self.checkpointer
      checkpointer.wait(at_step)
      last = checkpointer.latest_step()
      kept = (
        f"the last good checkpoint is step {last} in {checkpointer.directory}"
        if last is not None
        else "no checkpoint was saved before it"
      )
      raise NonFiniteLossError(
        f"non-finite loss or gradient at step {bad + 1} (state step {bad}); training stopped "
        f"at step {at_step}. The state was not updated from that step on and nothing "
        f"non-finite was saved; {kept}. A lower optim.lr (now {self.config.optim.lr}), "
        "optim.grad_clip_norm > 0 or a longer optim.warmup_steps may keep it finite."
      )

  def check_saves(self, at_step: int) -> None:
    """Stops the run once a background save has failed: after every step on
    one process; at log steps on several, which all stop together."""
    if jax.process_count() == 1:
      self.checkpointer.raise_if_save_failed(at_step)
      return
    if at_step % self.log_every:
      return
    failure = None
    try:
      self.checkpointer.raise_if_save_failed(at_step)
    except checkpointing.CheckpointSaveError as error:
      failure = error
    if np.any(multihost_utils.process_allgather(np.int32(failure is not None))):
      raise failure or checkpointing.CheckpointSaveError(
        f"a checkpoint save failed on another process; training stopped at step {at_step}"
      )

  # Shutdown.

  def shut_down(self, stopped_by: int | None) -> TrainResult:
    """The last step saved and every file closed; raises RunInterrupted
    after Ctrl-C, else says how the run ended."""
    step, run = self.step, self.run
    self.progress.finish()
    self.check_finite(step)
    if self.checkpointer.latest_step() != step:
      self.save(step, force=True)
    self.checkpointer.wait(step)
    self.checkpointer.close()
    self.writer.close()
    if stopped_by is None and self.signals.requested is not None:
      # The signal came during the final save: that step is saved now.
      stopped_by = self.signals.requested
      print(_stop_line(stopped_by, step, saved=True), flush=True)
    if stopped_by == signal.SIGINT:
      raise preemption.RunInterrupted(f"interrupted after step {step}, which is saved")
    if self.start_step < step and stopped_by is None:
      elapsed = metrics_io.format_duration(time.perf_counter() - self.start_time)
      print(f"Trained to step {step} in {elapsed}", flush=True)
    for line in self.collapse.summary():  # the warnings again, where stdout alone is kept
      print(line, flush=True)
    return TrainResult(
      state=self.state,
      model_def=run.model_def,
      objective=run.objective,
      tokenizer=run.tokenizer,
      step=step,
      checkpoint_dir=self.checkpointer.directory,
      evaluators=run.evaluators,
      predictor_functions=self.predictor_functions,
      config=self.config,
      preempted=stopped_by is not None,
      eval_model_def=self.evaluation_model,
      mesh=run.mesh,
    )


def train_and_evaluate(
  config: ml_collections.ConfigDict, workdir: str, *, exit_at_once: bool = False
) -> dict | None:
  """Trains (resuming if possible), evaluates on the held-out split, prints and
  logs the figures; returns them, or None when SIGTERM stopped the run early
  (with a checkpoint: the same call resumes it). Ctrl-C and `exit_at_once`
  as in `train`."""
  run_start = time.perf_counter()
  # Held through the evaluation too: it appends to metrics.jsonl.
  with run_dir.WorkdirLock(workdir) as lock:
    with _stop_signals(workdir, lock, exit_at_once) as signals:
      with compilation.persistent_cache(config) as cache_dir:
        result = _train(config, os.path.abspath(workdir), None, signals, cache_dir)
        signals.phase = "evaluating"
        if signals.requested is not None and not result.preempted:
          # Came after the last step was saved, before evaluation began.
          print(_stop_line(signals.requested, result.step, saved=True), flush=True)
          if signals.requested == signal.SIGINT:
            raise preemption.RunInterrupted(f"interrupted after step {result.step}")
          return None
        return _evaluate(result, workdir, run_start)


# Keys of `config.input.data` naming files or folders (not TFDS names or URLs).
DATA_PATH_KEYS = ("path", "eval_path", "image_root", "data_dir", "train_csv", "eval_csv")


def _absolute_data_paths(config):
  """`config` with the relative data paths it names made absolute, so the
  config.json a run saves (and a resume started from another folder, or
  `evaluate` on the run) finds the same files; `config` itself when none is
  relative."""
  data = config.input.get("data")
  if data is None:
    return config
  relative = [
    key
    for key in DATA_PATH_KEYS
    if isinstance(data.get(key), str)
    and data.get(key)
    and "://" not in data.get(key)
    and not os.path.isabs(data.get(key))
  ]
  if not relative:
    return config
  config = copy.deepcopy(config)
  with config.unlocked():
    for key in relative:
      config.input.data[key] = os.path.abspath(config.input.data[key])
  return config


def _stop_line(signum: int, step: int, saved: bool = False) -> str:
  what = "its checkpoint is saved" if saved else "saving a checkpoint"
  if signum == signal.SIGINT:
    return f"Ctrl-C after step {step}: {what}; run the same command to resume."
  name = signal.Signals(signum).name
  return f"Pre-empted ({name}) after step {step}: {what}; run the same command to resume."


def _with_fallback(executable, jitted):
  """The compiled step, or the jitted one (which compiles again) for
  arguments it was not compiled for: a step whose output layout differs
  from its input's, say, which an ahead-of-time executable refuses."""

  chosen = [executable]

  def run(state, batch):
    if chosen[0] is jitted:
      return jitted(state, batch)
    try:
      return executable(state, batch)
    except (TypeError, ValueError) as error:
      # Refused before running: nothing was donated yet.
      logging.info("compiled step refused its arguments (%s); using jit", error)
      chosen[0] = jitted
      return jitted(state, batch)

  return run


def _report_start(log, seconds: float, compiled, cache_dir: str | None) -> None:
  """Time to first step on the console and in metrics.jsonl (with the next
  logged step's figures)."""
  cache = (
    "compilation cache off"
    if cache_dir is None
    else f"compilation cache {'hit' if compiled.cache_hit else 'miss'}"
  )
  print(
    f"First step done {seconds:.1f}s after start-up (step {compiled.describe()}, {cache})",
    flush=True,
  )
  log.add_once(
    {
      "train/time_to_first_step_seconds": seconds,
      "train/compile_seconds": compiled.seconds,
      "train/compilation_cache_hit": float(compiled.cache_hit),
    }
  )


def _evaluate(result: TrainResult, workdir: str, run_start: float) -> dict:
  """The held-out figures of a finished run, logged and printed."""
  if result.preempted:
    return None
  results = registry.run_all(result.evaluators, result.predictor())
  if not results:
    print(f"Training finished at step {result.step}; no evaluation ran.", flush=True)
    return results
  writer = metrics_io.MetricsWriter(os.path.abspath(workdir))
  writer.write(result.step, registry.as_logged(results))
  writer.close()
  print(
    registry.format_results(
      results,
      title=f"Evaluation at step {result.step} (run took {time.perf_counter() - run_start:.0f}s)",
    ),
    flush=True,
  )
  return results
