"""Orbax's abandoned reads and writes, settled while Orbax works and only then.

Orbax reads (and writes) a step's arrays as concurrent TensorStore
operations gathered on an asyncio loop of its own, raises at the first that
fails and closes the loop. The others are abandoned, not cancelled: those
still running or not yet started (a few hundred for a model's step) are
left on the closed loop. Each is reported by Python later, on its own, as
a traceback: an Orbax coroutine collected unfinished (it re-raises
GeneratorExit as an Exception) or never started ("was never awaited"),
TensorStore calling back into the closed loop ("Event loop is closed"),
asyncio's "exception was never retrieved"; some only as the interpreter
shuts down. Hundreds to thousands of lines that repeat the one failure the
caller already reports in one line (a step moved aside or skipped, a save
that failed); Orbax also logs that failure at ERROR.

`settled()` is the scope in which Orbax works: each restore
(`runs/checkpointing.read_step`, `runs/loading`'s partial restores) runs
inside one, and a `checkpointing.Checkpointer` holds one from its opening
to its `close()` (or, for one never closed, its collection), so the saves
on Orbax's background thread are covered too. Inside it:

- the loops Orbax makes (its `run_sync` calls `asyncio.new_event_loop` for
  each call, on whichever thread runs it) let their abandoned operations
  finish before they close, so none outlives its loop and nothing is left
  to report;
- the reports of Orbax's abandoned operations that still come are dropped
  (`sys.unraisablehook`), with Orbax's ERROR line for a failure its caller
  reports and asyncio's "never retrieved" for its operations (filters on
  the "absl" and "asyncio" loggers); anything else passes.

When the outermost scope ends, `asyncio.new_event_loop`, the unraisable hook
and the loggers' filters are as they were found (a hook or loop factory
someone else installed meanwhile is left in place; ours then passes
everything through). No event-loop policy is touched (that API is
deprecated from Python 3.14).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import sys
import threading
from collections.abc import Iterator

import orbax.checkpoint as ocp

# The longest a loop waits for its abandoned operations (reads of the
# step's other arrays, which on local disk finish in well under a second);
# those still running then are cancelled.
SETTLE_SECONDS = 60.0


class _SettlingEventLoop(asyncio.SelectorEventLoop):
  """An event loop that, asked to close with tasks still pending, first
  runs them to their end (up to SETTLE_SECONDS, then cancels the rest) and
  retrieves their exceptions."""

  def close(self) -> None:
    if not self.is_closed() and not self.is_running():
      deadline = self.time() + SETTLE_SECONDS
      pending = [task for task in asyncio.all_tasks(self) if not task.done()]
      while pending:  # tasks the pending ones start are waited for too
        left = deadline - self.time()
        if left <= 0:
          for task in pending:
            task.cancel()
          self.run_until_complete(asyncio.wait(pending))
        else:
          self.run_until_complete(asyncio.wait(pending, timeout=left))
        for task in pending:
          if task.done() and not task.cancelled():
            task.exception()  # retrieved: asyncio does not log it
        pending = [task for task in asyncio.all_tasks(self) if not task.done()]
    super().close()


_ORBAX_FOLDER = os.path.dirname(os.path.dirname(os.path.abspath(ocp.__file__)))
# TensorStore's errors are absl status codes: "OUT_OF_RANGE: Error reading ...".
_TENSORSTORE_STATUS = re.compile(
  r"^(OUT_OF_RANGE|DATA_LOSS|RESOURCE_EXHAUSTED|NOT_FOUND|INVALID_ARGUMENT|FAILED_PRECONDITION|"
  r"PERMISSION_DENIED|UNAVAILABLE|INTERNAL|UNKNOWN|ABORTED|CANCELLED|DEADLINE_EXCEEDED): "
)


def in_orbax(filename: str | None) -> bool:
  return bool(filename) and os.path.abspath(filename).startswith(_ORBAX_FOLDER + os.sep)


def _raised_in_orbax(error: BaseException | None) -> bool:
  """Whether `error`, or one it was raised from, is TensorStore's or passed
  through an Orbax frame."""
  seen = set()
  while error is not None and id(error) not in seen:
    seen.add(id(error))
    if isinstance(error, ValueError) and _TENSORSTORE_STATUS.match(str(error)):
      return True
    traceback = error.__traceback__
    while traceback is not None:
      if in_orbax(traceback.tb_frame.f_code.co_filename):
        return True
      traceback = traceback.tb_next
    error = error.__cause__ or error.__context__
  return False


def _is_closed_loop_callback(error: BaseException | None) -> bool:
  """TensorStore completing an abandoned operation on Orbax's closed loop."""
  if not (isinstance(error, RuntimeError) and str(error) == "Event loop is closed"):
    return False
  traceback = error.__traceback__
  names = []
  while traceback is not None:
    names.append(traceback.tb_frame.f_code.co_name)
    traceback = traceback.tb_next
  return "call_soon_threadsafe" in names


def _is_abandoned_operation_report(unraisable) -> bool:
  if _is_closed_loop_callback(unraisable.exc_value):
    return True
  code = getattr(unraisable.object, "cr_code", None)  # a coroutine being collected
  return code is not None and in_orbax(code.co_filename)


class _AbandonedOperationFilter(logging.Filter):
  """asyncio's "exception was never retrieved" for Orbax's operations, and
  Orbax's own ERROR lines for a failure its caller reports (absl logs every
  module through the "absl" logger; `--log_info` keeps them)."""

  def filter(self, record: logging.LogRecord) -> bool:
    error = record.exc_info[1] if record.exc_info else None
    if record.name == "asyncio":
      return not ("never retrieved" in str(record.msg) and _raised_in_orbax(error))
    if record.levelno == logging.ERROR and in_orbax(record.pathname):
      from absl import logging as absl_logging  # pylint: disable=g-import-not-at-top

      return absl_logging.get_verbosity() >= absl_logging.INFO
    return True


_ABANDONED_OPERATION_FILTER = _AbandonedOperationFilter()
_LOGGERS = ("asyncio", "absl")


def _made_by_orbax() -> bool:
  """Whether an Orbax frame is among the callers (Orbax's own loops only:
  a loop anything else makes inside the scope is an ordinary one)."""
  frame = sys._getframe(2)  # noqa: SLF001 (the caller of new_event_loop)
  while frame is not None:
    if in_orbax(frame.f_code.co_filename):
      return True
    frame = frame.f_back
  return False


class _StandIns:
  """The loop factory and unraisable hook one outermost `settled()` puts in
  place, with what they stand in for. Each outermost scope makes its own:
  one left in someone else's chain after its scope ended passes everything
  through to what it found."""

  def __init__(self):
    self.active = True
    self.found_new_event_loop = asyncio.new_event_loop
    self.found_unraisablehook = sys.unraisablehook

  def new_event_loop(self) -> asyncio.AbstractEventLoop:
    if self.active and _made_by_orbax():
      return _SettlingEventLoop()
    return self.found_new_event_loop()

  def unraisablehook(self, unraisable) -> None:
    if not (self.active and _is_abandoned_operation_report(unraisable)):
      self.found_unraisablehook(unraisable)

  def install(self) -> None:
    asyncio.new_event_loop = self.new_event_loop
    sys.unraisablehook = self.unraisablehook
    for name in _LOGGERS:
      logging.getLogger(name).addFilter(_ABANDONED_OPERATION_FILTER)

  def put_back(self) -> None:
    """What was found, where ours is still in place (a stand-in someone
    installed over ours stays)."""
    self.active = False
    for name in _LOGGERS:
      logging.getLogger(name).removeFilter(_ABANDONED_OPERATION_FILTER)
    if asyncio.new_event_loop == self.new_event_loop:
      asyncio.new_event_loop = self.found_new_event_loop
    if sys.unraisablehook == self.unraisablehook:
      sys.unraisablehook = self.found_unraisablehook


# The scopes open now, and the stand-ins of the outermost; changed under the
# lock (a Checkpointer never closed ends its scope when collected, on
# whichever thread collects it).
_lock = threading.Lock()
_depth = 0
_stand_ins: _StandIns | None = None


def _enter() -> None:
  global _depth, _stand_ins
  with _lock:
    _depth += 1
    if _depth == 1:
      _stand_ins = _StandIns()
      _stand_ins.install()


def _leave() -> None:
  global _depth, _stand_ins
  with _lock:
    _depth -= 1
    if _depth == 0:
      _stand_ins.put_back()
      _stand_ins = None


def is_settling() -> bool:
  """Whether a `settled()` scope is open."""
  return _depth > 0


@contextlib.contextmanager
def settled() -> Iterator[None]:
  """The scope in which Orbax's abandoned operations are settled (see the
  module's docstring); scopes nest, and the process state is put back as it
  was found when the outermost one ends, returning or raising."""
  _enter()
  try:
    yield
  finally:
    _leave()
