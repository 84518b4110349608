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


class _ConsoleStream:
  """sys.stdout or sys.stderr written under a `_Console`'s lock."""

  def __init__(self, stream, console: _Console):
    self._stream = stream
    self._console = console

  def write(self, text: str) -> int:
    with self._console.lock:
      written = self._stream.write(text)
      if text:
        self._console.at_line_start = text.endswith("\n")
      return written

  def writelines(self, lines) -> None:
    for line in lines:
      self.write(line)

  def flush(self) -> None:
    with self._console.lock:
      self._stream.flush()

  def __getattr__(self, name):
    return getattr(self._stream, name)  # isatty, fileno, encoding, ...


class _Console:
  """The console of a run that the watcher thread may end at once, while
  other threads go on: its line must be the last one printed, on a line of
  its own, and printed at all.

  - Every write of Python's stdout and stderr takes one lock, which the
    watcher takes and keeps until the process ends: a print of the main
    thread racing the exit ("Compiling the step...") waits instead of
    following the stop line. The console also remembers whether the last
    write ended its line: a print writes its text and its newline
    separately when Python's output is unbuffered (PYTHONUNBUFFERED), and
    the stop line came out glued to the text.
  - The line goes to a copy of file descriptor 2 taken when the run began:
    descriptor 2 points at /dev/null while TensorFlow is imported
    (`tfds_import.native_logs_quiet`, a TFDS source's first read), which swallowed
    the line, the process ending with 130 and no word.
  - Descriptors 1 and 2 then point at /dev/null, so C++ writers (XLA, absl)
    add nothing after the line either.
  """

  def __init__(self):
    self.lock = threading.RLock()
    self.at_line_start = True
    self._streams = (sys.stdout, sys.stderr)
    self._stderr_fd = os.dup(2)
    self._held = False
    sys.stdout, sys.stderr = (_ConsoleStream(stream, self) for stream in self._streams)

  def hold(self) -> None:
    """No other thread writes from here on (the process ends next). A writer
    stuck on a full pipe does not delay the exit beyond the timeout."""
    self._held = self.lock.acquire(timeout=5)

  def print_last_line(self, line: str) -> None:
    if self._held:  # else a writer may be inside these streams: leave them
      for stream in self._streams:
        try:
          stream.flush()  # what block-buffered streams hold comes before the line
        except (OSError, ValueError):
          pass
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    data = (line if self.at_line_start else "\n" + line).encode() + b"\n"
    try:
      while data:
        data = data[os.write(self._stderr_fd, data) :]
    except OSError:
      pass  # the console is gone (a closed terminal): the exit code still says it

  def restore(self) -> None:
    for name, stream in zip(("stdout", "stderr"), self._streams, strict=True):
      current = getattr(sys, name)
      if isinstance(current, _ConsoleStream) and current._console is self:
        setattr(sys, name, stream)
    os.close(self._stderr_fd)


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
    self._console: _Console | None = None

  # -- installation -----------------------------------------------------------

  def __enter__(self) -> StopSignals:
    if self.multi_process or threading.current_thread() is not threading.main_thread():
      return self  # handlers can only be installed from the main thread
    if self.exit_at_once:
      self._console = _Console()
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
    if self._console is not None:
      self._console.restore()
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
      # Before the line is written: the main thread goes on meanwhile, and
      # whatever it prints from now on would come after it.
      self._console.hold()
      try:
        line = self.describe_stop(phase, signum)
      except Exception:  # noqa: BLE001 (os._exit below would end the run without a word)
        line = f"{signal_name(signum)}: stopped"
      self._console.print_last_line(line)
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
