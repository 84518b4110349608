"""Orbax's abandoned reads and writes.

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

A restore (`runs/checkpointing.read_step`, `runs/loading`'s partial
restores) runs inside
`settled_before_their_loop_closes`: the loop Orbax makes lets its abandoned
operations finish before it closes, so none outlives it. Saves run on
Orbax's background threads, out of reach of that: `quiet` drops the
reports of their abandoned operations alone, for the whole process (a
collection can come at any later moment); anything else passes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import sys
from collections.abc import Iterator

import orbax.checkpoint as ocp

# The longest a restore waits for its abandoned operations (reads of the
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


class _SettlingPolicy(asyncio.DefaultEventLoopPolicy):
  def new_event_loop(self) -> asyncio.AbstractEventLoop:
    return _SettlingEventLoop()


@contextlib.contextmanager
def settled_before_their_loop_closes() -> Iterator[None]:
  """The event loops made inside (Orbax's `run_sync` makes a fresh one per
  call, with `asyncio.new_event_loop`) run their pending operations to the
  end before they close. Made for one synchronous call on this thread: the
  policy is process-wide while it lasts."""
  previous = asyncio.get_event_loop_policy()
  asyncio.set_event_loop_policy(_SettlingPolicy())
  try:
    yield
  finally:
    asyncio.set_event_loop_policy(previous)


_ORBAX_FOLDER = os.path.dirname(os.path.dirname(os.path.abspath(ocp.__file__)))
# TensorStore's errors are absl status codes: "OUT_OF_RANGE: Error reading ...".
_TENSORSTORE_STATUS = re.compile(
  r"^(OUT_OF_RANGE|DATA_LOSS|RESOURCE_EXHAUSTED|NOT_FOUND|INVALID_ARGUMENT|FAILED_PRECONDITION|"
  r"PERMISSION_DENIED|UNAVAILABLE|INTERNAL|UNKNOWN|ABORTED|CANCELLED|DEADLINE_EXCEEDED): "
)
_quieted = False


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


def quiet() -> None:
  """Drops the reports of Orbax's abandoned operations (see above); the
  first call installs the filters, later ones do nothing."""
  global _quieted
  if _quieted:
    return
  _quieted = True
  report_unraisable = sys.unraisablehook

  def unraisablehook(unraisable):
    if not _is_abandoned_operation_report(unraisable):
      report_unraisable(unraisable)

  sys.unraisablehook = unraisablehook
  for name in ("asyncio", "absl"):
    logging.getLogger(name).addFilter(_ABANDONED_OPERATION_FILTER)  # added once per logger
