"""Metric sinks: a TensorBoard event file and `workdir/metrics.jsonl`.

Every logged step appends one JSON line {"step": k, name: value, ...} so runs
can be compared with a few lines of Python and no TensorBoard.

The event file is written with the `tensorboard` package's record framing
and protos alone (`TensorBoardScalars`): TensorBoard's own writers (and clu's,
and tf.summary) import TensorFlow, which took 4.8 s of every command's
start-up here, before any work. Without `tensorboard` installed the run logs
to metrics.jsonl alone, with a warning.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import os
import socket
import sys
import time

import jax
from absl import logging

from hyperbolic_vl import files

_event_files = itertools.count()  # training's and evaluation's writers may open in one second


class TensorBoardScalars:
  """Scalars in a TensorBoard event file (`events.out.tfevents.*` in the
  workdir), one event per logged step, flushed as it is written so
  TensorBoard follows a live run and a killed one loses nothing logged."""

  def __init__(self, workdir: str):
    # Deferred: the protos cost 0.4 s, which the training step never pays.
    from tensorboard.compat.proto import event_pb2, summary_pb2  # pylint: disable=g-import-not-at-top
    from tensorboard.summary.writer.record_writer import RecordWriter  # pylint: disable=g-import-not-at-top

    self._event, self._summary = event_pb2.Event, summary_pb2.Summary
    name = (
      f"events.out.tfevents.{int(time.time())}.{socket.gethostname()}.{os.getpid()}"
      f".{next(_event_files)}"
    )
    os.makedirs(workdir, exist_ok=True)
    self._records = RecordWriter(open(os.path.join(workdir, name), "ab"))  # noqa: SIM115 (closed by close())
    self._write(self._event(wall_time=time.time(), file_version="brain.Event:2"))

  def _write(self, event) -> None:
    self._records.write(event.SerializeToString())
    self._records.flush()

  def write_scalars(self, step: int, scalars: dict) -> None:
    values = [self._summary.Value(tag=k, simple_value=v) for k, v in scalars.items()]
    self._write(
      self._event(wall_time=time.time(), step=int(step), summary=self._summary(value=values))
    )

  def close(self) -> None:
    self._records.close()


class MetricsWriter:
  def __init__(self, workdir: str):
    self.is_lead = jax.process_index() == 0
    self.path = os.path.join(workdir, "metrics.jsonl")
    self.writer = _tensorboard_writer(workdir) if self.is_lead else None

  def write(self, step: int, scalars: dict) -> None:
    scalars = {k: float(v) for k, v in scalars.items()}
    if logging.level_info():  # --log_info: the scalars in the log too
      logging.info("[%d] %s", step, ", ".join(f"{k}={v:.6g}" for k, v in sorted(scalars.items())))
    if self.writer is not None:
      self.writer.write_scalars(step, scalars)
    if self.is_lead:
      clean = {k: (v if math.isfinite(v) else str(v)) for k, v in scalars.items()}
      with open(self.path, "a") as f:
        f.write(json.dumps({"step": int(step), **clean}) + "\n")

  def write_event(self, step: int, event: str, message: str) -> None:
    """One {"step", "event", "message"} row: something the run said at
    `step` (a collapse warning), kept beside its figures; the curves'
    readers skip it (no number in it)."""
    if self.is_lead:
      with open(self.path, "a") as f:
        f.write(json.dumps({"step": int(step), "event": event, "message": message}) + "\n")

  def close(self) -> None:
    if self.writer is not None:
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


def _tensorboard_writer(workdir: str):
  try:
    return TensorBoardScalars(workdir)
  except ImportError as error:
    logging.warning("TensorBoard logging off (%s); metrics go to metrics.jsonl only.", error)
    return None


class PeriodicProgress:
  """Every `every_steps` steps, one INFO line (seen with --log_info): the
  rate since the last line, the time left at that rate, and the share of
  that wall time spent in named parts of the loop (`with .timed("eval")`).
  The console's progress line is `ProgressLine`; this is the log's."""

  def __init__(self, total_steps: int, every_steps: int):
    self.total_steps, self.every_steps = total_steps, max(int(every_steps), 1)
    self._step = self._time = None
    self._spent: dict[str, float] = {}

  def __call__(self, step: int) -> None:
    now = time.perf_counter()
    if self._step is None:
      self._step, self._time = step, now
      return
    if step - self._step < self.every_steps:
      return
    elapsed = max(now - self._time, 1e-9)
    rate = (step - self._step) / elapsed
    shares = "".join(
      f", {name} {100 * seconds / elapsed:.1f}%" for name, seconds in sorted(self._spent.items())
    )
    logging.info(
      "step %d/%d: %.2f steps/s, %s left%s",
      step,
      self.total_steps,
      rate,
      format_duration((self.total_steps - step) / rate),
      shares,
    )
    self._step, self._time, self._spent = step, now, {}

  @contextlib.contextmanager
  def timed(self, name: str):
    start = time.perf_counter()
    try:
      yield
    finally:
      self._spent[name] = self._spent.get(name, 0.0) + time.perf_counter() - start


class _NoProgress:
  """Stands in for PeriodicProgress on processes other than the lead one."""

  def __call__(self, step: int) -> None:
    del step

  def timed(self, name: str):
    del name
    return contextlib.nullcontext()


def progress_reporter(total_steps: int, every_steps: int):
  """The log's periodic progress lines (`PeriodicProgress`), lead process only."""
  if jax.process_index() != 0:
    return _NoProgress()
  return PeriodicProgress(total_steps, every_steps)


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
