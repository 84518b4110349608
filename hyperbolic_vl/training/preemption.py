"""Pre-emption: SIGTERM (a cluster's pre-emption, a job's time limit) ends a
run between steps with a checkpoint, on one process or all of them together;
and the start barrier every process of a run meets before its first collective."""

from __future__ import annotations

import signal

import jax
from jax.experimental import multihost_utils


class PreemptionWatch:
  """Says, after each step, whether SIGTERM (cluster pre-emption, a job's
  time limit) asks the run to stop, so that it saves and exits between steps.

  Several processes: JAX's pre-emption sync point. JAX's own notifier
  catches SIGTERM on any process, and every process gets True at the same
  step, so all save that step together (Orbax saves are collective; hosts
  stopping at different steps would disagree or hang). One process: a
  SIGTERM handler sets a flag the loop reads after the step in flight.
  """

  def __init__(self):
    self.multi_process = jax.process_count() > 1
    self._signalled = False
    self._previous = None

  def __enter__(self):
    if not self.multi_process:
      try:
        self._previous = signal.signal(signal.SIGTERM, self._on_sigterm)
      except ValueError:  # not the main thread (e.g. a notebook worker): no handler
        self._previous = None
    return self

  def _on_sigterm(self, signum, frame):
    del signum, frame
    self._signalled = True

  def reached(self, step: int) -> bool:
    if self.multi_process:
      return bool(multihost_utils.reached_preemption_sync_point(step))
    return self._signalled

  def __exit__(self, *exc):
    if self._previous is not None:
      signal.signal(signal.SIGTERM, self._previous)
    return False


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
