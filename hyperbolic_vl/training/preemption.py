"""Stopping a run on a signal: Ctrl-C (SIGINT) and pre-emption (SIGTERM: a
cluster's pre-emption, a job's time limit) end a run with one line, the
newest step saved or the previous checkpoint kept; and the start barrier
every process of a run meets before its first collective."""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable

import jax
from jax.experimental import multihost_utils

from hyperbolic_vl import errors

# Exit code of a run stopped by Ctrl-C: 128 + SIGINT, what a shell reports
# for a command SIGINT ended.
EXIT_INTERRUPTED = 128 + signal.SIGINT

# The phase in which a signal waits for the step in flight: the loop saves
# that step and stops. In every other phase (setting up, compiling, evaluating)
# the main thread may sit in XLA for minutes, where no Python handler runs.
TRAINING = "training"


class RunInterrupted(KeyboardInterrupt):
  """Ctrl-C stopped the run after its newest step was saved (library use:
  still a KeyboardInterrupt, as callers expect of Ctrl-C)."""


def signal_name(signum: int) -> str:
  return "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name


class StopSignals:
  """SIGINT and SIGTERM for the length of a run, on one process.

  Python runs a signal handler only between bytecodes of the main thread,
  so a Ctrl-C during a minutes-long XLA compile waited for it, and one
  raised as KeyboardInterrupt inside a step lost the donated state. Here the
  C-level handler writes the signal to a pipe (`signal.set_wakeup_fd`) that
  a watcher thread reads at once:

  - in the `TRAINING` phase the first signal is recorded (`requested`) and
    the loop, after the step in flight, saves it and stops;
  - in any other phase, with `exit_at_once` (the command line), the thread
    prints `describe_stop(phase)`'s one line, runs `on_exit_at_once` (the
    workdir lock's release) and ends the process with `os._exit`: no Python
    teardown that could crash inside XLA, and nothing half written is ever
    renamed into place (Orbax writes a save into a temporary folder, which
    the next start removes), so the previous checkpoint is what a resume
    finds. Library use (`exit_at_once=False`, a notebook's kernel must
    survive) raises KeyboardInterrupt in these phases instead.
  - a second signal exits at once in every phase (exit code 130 for SIGINT).

  Several processes: SIGTERM goes through JAX's pre-emption sync point, so
  every process stops after the same step (Orbax saves are collective);
  SIGINT keeps Python's default there.
  """

  def __init__(
    self,
    *,
    exit_at_once: bool = False,
    describe_stop: Callable[[str, int], str] | None = None,
    on_exit_at_once: Callable[[], None] | None = None,
  ):
    self.multi_process = jax.process_count() > 1
    self.exit_at_once = exit_at_once
    self.describe_stop = describe_stop or (lambda phase, signum: f"{signal_name(signum)}: stopped")
    self.on_exit_at_once = on_exit_at_once
    self.phase = "setting up"
    self.requested: int | None = None  # the first signal seen in the TRAINING phase
    self._count = 0
    self._previous_handlers: dict[int, object] = {}
    self._previous_wakeup = None
    self._pipe: tuple[int, int] | None = None
    self._thread: threading.Thread | None = None

  # -- installation -----------------------------------------------------------

  def __enter__(self) -> StopSignals:
    if self.multi_process or threading.current_thread() is not threading.main_thread():
      return self  # handlers can only be installed from the main thread
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    self._pipe = (read_end, write_end)
    for signum in (signal.SIGINT, signal.SIGTERM):
      self._previous_handlers[signum] = signal.signal(signum, self._python_handler)
    self._previous_wakeup = signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
    self._thread = threading.Thread(target=self._watch, name="stop_signals", daemon=True)
    self._thread.start()
    return self

  def __exit__(self, *exc) -> bool:
    if self._pipe is None:
      return False
    signal.set_wakeup_fd(self._previous_wakeup)
    for signum, handler in self._previous_handlers.items():
      signal.signal(signum, handler)
    read_end, write_end = self._pipe
    self._pipe = None
    os.close(write_end)  # the watcher reads end-of-file and returns
    self._thread.join(timeout=5)
    os.close(read_end)
    return False

  # -- what a signal does -------------------------------------------------------

  def _watch(self) -> None:
    read_end = self._pipe[0]
    while True:
      try:
        data = os.read(read_end, 64)
      except OSError:
        return
      if not data:
        return
      for signum in data:
        if signum in (signal.SIGINT, signal.SIGTERM):
          self._on_signal(signum)

  def _on_signal(self, signum: int) -> None:
    self._count += 1
    if self._count == 1 and self.phase == TRAINING:
      self.requested = signum
      return
    if self._count == 1 and signum == signal.SIGTERM and not self.exit_at_once:
      self.requested = signum  # library use: stop at the first step boundary, as before
      return
    if not self.exit_at_once:
      return  # the Python handler raises KeyboardInterrupt in the main thread
    phase = self.phase if self._count == 1 else "again"
    try:
      print(self.describe_stop(phase, signum), file=sys.stderr, flush=True)
      if self.on_exit_at_once is not None:
        self.on_exit_at_once()
    finally:
      os._exit(EXIT_INTERRUPTED if signum == signal.SIGINT else errors.EXIT_PREEMPTED)

  def _python_handler(self, signum, frame) -> None:
    """Runs in the main thread, after the watcher saw the same signal."""
    del frame
    if self.exit_at_once or signum != signal.SIGINT:
      return  # the watcher decides (it may be ending the process right now)
    if self._count <= 1 and self.phase == TRAINING:
      return  # recorded: the loop stops after the step in flight
    raise KeyboardInterrupt

  def reached(self, step: int) -> int | None:
    """The signal that asks the run to stop after `step`, if any."""
    if self.multi_process:
      return signal.SIGTERM if multihost_utils.reached_preemption_sync_point(step) else None
    return self.requested


def processes_meet(name: str, timeout_s: int = 600) -> None:
  """Every process of a multi-process run waits here for the others.

  The first collective (Orbax creating the checkpoint folder) sets up gloo,
  which gives up after 30 s when one process arrives that much later, as on a
  loaded machine; the coordination service's barrier waits `timeout_s`
  (the barrier JAX's own multi-process tests use).
  """
  if jax.process_count() == 1:
    return
  from jax._src import distributed  # pylint: disable=g-import-not-at-top

  distributed.global_state.client.wait_at_barrier(name, timeout_s * 1000)
