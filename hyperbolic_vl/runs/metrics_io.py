"""Metric sinks: TensorBoard through clu, and `workdir/metrics.jsonl`.

Every logged step appends one JSON line {"step": k, name: value, ...} so runs
can be compared with a few lines of Python and no TensorBoard.

clu imports TensorFlow and TensorBoard (seconds, and wheels a GPU machine may
not have), so it is imported only when a writer is created, never by
importing the training step or the benchmark. Without clu installed the run
logs to metrics.jsonl alone, with a warning.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys
import time

import jax
from absl import logging

from hyperbolic_vl import files


class MetricsWriter:
  def __init__(self, workdir: str):
    self.is_lead = jax.process_index() == 0
    self.path = os.path.join(workdir, "metrics.jsonl")
    self.writer = _tensorboard_writer(workdir, just_logging=not self.is_lead)

  def write(self, step: int, scalars: dict) -> None:
    scalars = {k: float(v) for k, v in scalars.items()}
    if self.writer is not None:
      self.writer.write_scalars(step, scalars)
    if self.is_lead:
      clean = {k: (v if math.isfinite(v) else str(v)) for k, v in scalars.items()}
      with open(self.path, "a") as f:
        f.write(json.dumps({"step": int(step), **clean}) + "\n")

  def close(self) -> None:
    if self.writer is not None:
      self.writer.flush()
      self.writer.close()


class TrainLog:
  """The periodic training log: the step's metrics plus throughput and the
  share of wall time the loop blocked in the input iterator."""

  def __init__(self, writer: MetricsWriter, total_steps: int, batch_size: int, step: int):
    self.writer, self.total_steps, self.batch_size = writer, total_steps, batch_size
    self._start, self._start_step, self._input_wait = time.perf_counter(), step, 0.0
    self._once = {}

  def add_once(self, scalars: dict) -> None:
    """Figures logged once, with the next step written (time to first step)."""
    self._once.update(scalars)

  def waited(self, seconds: float) -> None:
    """Time the loop spent in `next(iterator)`."""
    self._input_wait += seconds

  def write(self, step: int, metrics: dict, extra: dict) -> dict:
    elapsed = max(time.perf_counter() - self._start, 1e-9)
    steps_per_sec = (step - self._start_step) / elapsed
    scalars = {k: float(v) for k, v in metrics.items()}
    scalars["train/steps_per_sec"] = steps_per_sec
    scalars["train/examples_per_sec"] = steps_per_sec * self.batch_size
    # Steps are dispatched asynchronously, so the host prepares (and
    # transfers) the next batch while the devices run this one; the time it
    # still blocks in the iterator is input the step waited for.
    scalars["train/input_wait_fraction"] = self._input_wait / elapsed
    if steps_per_sec > 0:
      scalars["train/seconds_left"] = (self.total_steps - step) / steps_per_sec
    scalars.update(extra)
    scalars.update(self._once)
    self._once = {}
    self.writer.write(step, scalars)
    logging.info(
      "step %d/%d loss %.4f, %.2f steps/s, %.1f examples/s",
      step,
      self.total_steps,
      scalars["train/loss"],
      steps_per_sec,
      steps_per_sec * self.batch_size,
    )
    self._start, self._start_step, self._input_wait = time.perf_counter(), step, 0.0
    return scalars


def format_duration(seconds: float) -> str:
  """ "42s", "3m05s", "2h07m": a duration as a person reads it."""
  seconds = max(0, int(round(seconds)))
  if seconds < 60:
    return f"{seconds}s"
  if seconds < 3600:
    return f"{seconds // 60}m{seconds % 60:02d}s"
  return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


class ProgressLine:
  """The console while a run trains: step, loss, steps/s, examples/s and the
  time left, at a steady rate whatever the speed of a step: one line every
  `every_secs` seconds in a log (a scheduler's output file), or a bar redrawn
  in place about twice a second on a terminal.

  The rate counts from the first step `started` reports (after the compile),
  so it is the rate the rest of the run will go at, evaluation and saves
  included."""

  BAR_WIDTH = 24

  def __init__(self, total_steps: int, batch_size: int, every_secs: float = 30.0, stream=None):
    self.total_steps, self.batch_size = total_steps, batch_size
    self.stream = stream if stream is not None else sys.stdout
    self.on_terminal = bool(getattr(self.stream, "isatty", lambda: False)())
    self.every_secs = 0.5 if self.on_terminal else every_secs
    self.loss: float | None = None
    self._start_time = self._start_step = None
    self._last_shown = 0.0
    self._bar_drawn = False

  def started(self, step: int) -> None:
    """The step from which the rate is measured (the first one compiled)."""
    self._start_time, self._start_step = time.perf_counter(), step
    self._last_shown = self._start_time

  def figures(self, step: int) -> dict | None:
    """steps/s, examples/s and seconds left since `started`; None before."""
    if self._start_time is None or step <= self._start_step:
      return None
    rate = (step - self._start_step) / max(time.perf_counter() - self._start_time, 1e-9)
    return {
      "steps_per_sec": rate,
      "examples_per_sec": rate * self.batch_size,
      "seconds_left": (self.total_steps - step) / rate,
    }

  def text(self, step: int) -> str:
    parts = [f"step {step}/{self.total_steps}"]
    if self.loss is not None:
      parts.append(f"loss {self.loss:.4f}")
    figures = self.figures(step)
    if figures is not None:
      parts += [
        f"{figures['steps_per_sec']:.2f} steps/s",
        # A paper-size model on a CPU: 0.3 examples/s, not "0".
        f"{figures['examples_per_sec']:.{0 if figures['examples_per_sec'] >= 10 else 2}f} "
        "examples/s",
        f"{format_duration(figures['seconds_left'])} left",
      ]
    return "  ".join(parts)

  def update(self, step: int, loss: float | None = None) -> None:
    if loss is not None:
      self.loss = loss
    now = time.perf_counter()
    if self._start_time is None or now - self._last_shown < self.every_secs:
      return
    self._last_shown = now
    self.show(step)

  def show(self, step: int) -> None:
    text = self.text(step)
    if self.on_terminal:
      done = int(self.BAR_WIDTH * step / max(self.total_steps, 1))
      bar = "[" + "#" * done + "." * (self.BAR_WIDTH - done) + "]"
      self.stream.write(f"\r{bar} {text}\033[K")
      self._bar_drawn = True
    else:
      self.stream.write(text + "\n")
    self.stream.flush()

  def finish(self) -> None:
    """Ends the bar's line, so what is printed next starts a line of its own."""
    if self._bar_drawn:
      self.stream.write("\n")
      self.stream.flush()
      self._bar_drawn = False


@contextlib.contextmanager
def _native_logs_quiet():
  """Importing TensorFlow (under clu) writes INFO lines from C++ ("oneDNN
  custom operations are on", twice) straight to file descriptor 2, where
  neither absl's Python verbosity nor TF_CPP_MIN_LOG_LEVEL reaches them:
  stderr is pointed at /dev/null for the import alone, unless absl logs INFO
  (`--log_info`). Python's own errors still raise as exceptions."""
  if logging.get_verbosity() >= logging.INFO:
    yield
    return
  sys.stderr.flush()
  saved = os.dup(2)
  devnull = os.open(os.devnull, os.O_WRONLY)
  try:
    os.dup2(devnull, 2)
    yield
  finally:
    os.dup2(saved, 2)
    os.close(saved)
    os.close(devnull)


def import_tensorflow_quietly() -> None:
  """Imports TensorFlow, where installed, without its C++ INFO lines: clu's
  writers and TFDS sources import it later in any case, each then writing
  those lines (the command line calls this once at start-up)."""
  import importlib.util  # pylint: disable=g-import-not-at-top

  if importlib.util.find_spec("tensorflow") is None:
    return
  with _native_logs_quiet():
    import tensorflow  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import


def _tensorboard_writer(workdir: str, just_logging: bool):
  try:
    # Deferred: pulls in TensorFlow (see the module docstring).
    with _native_logs_quiet():
      from clu import metric_writers
  except ImportError as error:
    logging.warning("TensorBoard logging off (%s); metrics go to metrics.jsonl only.", error)
    return None
  return metric_writers.create_default_writer(
    workdir, just_logging=just_logging, asynchronous=False
  )


class _NoProgress:
  """Stands in for clu's ReportProgress where clu is missing or on processes
  other than the lead one."""

  def __call__(self, step: int) -> None:
    del step

  def timed(self, name: str):
    del name
    return contextlib.nullcontext()


def progress_reporter(total_steps: int, every_steps: int):
  """Progress, rate, ETA and the share of time in named parts (`.timed`),
  logged every `every_steps` steps by clu's ReportProgress (the lead process
  only); a no-op without clu."""
  if jax.process_index() != 0:
    return _NoProgress()
  try:
    # Deferred: pulls in TensorFlow (see the module docstring).
    with _native_logs_quiet():
      from clu import periodic_actions
  except ImportError:
    return _NoProgress()
  return periodic_actions.ReportProgress(
    num_train_steps=total_steps, every_steps=every_steps, every_secs=None
  )


def drop_steps_after(workdir: str, step: int) -> int:
  """Keeps the lines of WORKDIR/metrics.jsonl up to `step`, where a resumed
  run continues, so the steps it trains again are not logged twice; a line
  cut short by a killed run goes too. Rewritten aside and renamed into place
  (a crash leaves the old file or the new one). Returns the lines dropped."""
  path = os.path.join(workdir, "metrics.jsonl")
  if not os.path.exists(path):
    return 0
  with open(path) as f:
    lines = [line for line in f if line.strip()]
  kept = []
  for line in lines:
    try:
      record = json.loads(line)
    except json.JSONDecodeError:
      continue
    if int(record.get("step", 0)) <= step:
      kept.append(line if line.endswith("\n") else line + "\n")
  if len(kept) != len(lines):
    files.write_file_atomically(path, "".join(kept))
  return len(lines) - len(kept)


def read_metrics(workdir: str) -> list[dict]:
  return read_metrics_file(os.path.join(workdir, "metrics.jsonl"))


def read_metrics_file(path: str) -> list[dict]:
  """The records of a metrics.jsonl file, one dict per logged step."""
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


def last_value(records: list[dict], key: str):
  for record in reversed(records):
    if key in record:
      return record[key]
  raise KeyError(f"{key} not found in metrics")
