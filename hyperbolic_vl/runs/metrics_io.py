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
    scalars.update(extra)
    self.writer.write(step, scalars)
    print(
      f"step {step}/{self.total_steps}  loss {scalars['train/loss']:.4f}  "
      f"{steps_per_sec:.2f} steps/s",
      flush=True,
    )
    self._start, self._start_step, self._input_wait = time.perf_counter(), step, 0.0
    return scalars


def _tensorboard_writer(workdir: str, just_logging: bool):
  try:
    # Deferred: pulls in TensorFlow (see the module docstring).
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
