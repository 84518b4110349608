"""The process as the package found it: Orbax's abandoned operations are
settled only while Orbax works (`runs/abandoned_operations.settled`), so
`load()`, a resume and an evaluation leave the unraisable hook, the loop
factory, the event-loop policy and the loggers' filters as they were."""

import asyncio
import logging
import sys
import warnings

import pytest
import shared_runs

import hyperbolic_vl
from hyperbolic_vl.runs import abandoned_operations
from hyperbolic_vl.training import loop


class _OwnFilter(logging.Filter):
  def filter(self, record):
    return True


class _OwnPolicy(asyncio.DefaultEventLoopPolicy):
  pass


def _process_state() -> dict:
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)  # the policy API, from Python 3.14
    policy = asyncio.get_event_loop_policy()
  return {
    "unraisablehook": sys.unraisablehook,
    "new_event_loop": asyncio.new_event_loop,
    "policy": policy,
    "asyncio filters": list(logging.getLogger("asyncio").filters),
    "absl filters": list(logging.getLogger("absl").filters),
  }


@pytest.fixture
def own_process_state(monkeypatch):
  """This test's own hook, policy and logger filters, in place of the
  harness's, and put back after it."""
  reported = []
  monkeypatch.setattr(sys, "unraisablehook", reported.append)
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    harness_policy = asyncio.get_event_loop_policy()
    asyncio.set_event_loop_policy(_OwnPolicy())
  own_filter = _OwnFilter()
  for name in ("asyncio", "absl"):
    logging.getLogger(name).addFilter(own_filter)
  try:
    yield reported
  finally:
    for name in ("asyncio", "absl"):
      logging.getLogger(name).removeFilter(own_filter)
    with warnings.catch_warnings():
      warnings.simplefilter("ignore", DeprecationWarning)
      asyncio.set_event_loop_policy(harness_policy)


@shared_runs.ON_ONE_WORKER
def test_load_a_resume_and_an_evaluation_leave_the_process_as_they_found_it(
  own_process_state, tmp_path, monkeypatch
):
  found = _process_state()
  # While Orbax works the stand-ins are in place (so the test would see a
  # change that outlived them).
  inside = []
  install = abandoned_operations._StandIns.install

  def install_and_look(stand_ins):
    install(stand_ins)
    inside.append(_process_state())

  monkeypatch.setattr(abandoned_operations._StandIns, "install", install_and_look)

  model = hyperbolic_vl.load(shared_runs.trained_run("meru"))
  assert model.image_size == 16
  assert _process_state() == found

  # The finished run resumed at its last step (a restore and the
  # checkpointer's life) and evaluated on the held-out split.
  workdir = shared_runs.copy_of("meru", tmp_path / "run")
  figures = loop.train_and_evaluate(shared_runs.CONFIGS["meru"](), workdir)
  assert figures
  assert _process_state() == found
  assert not abandoned_operations.is_settling()

  assert len(inside) >= 2  # load()'s restore, the resume's checkpointer
  for state in inside:
    assert state["unraisablehook"] != found["unraisablehook"]
    assert state["new_event_loop"] != found["new_event_loop"]
    assert len(state["absl filters"]) == len(found["absl filters"]) + 1
    assert state["policy"] is found["policy"]  # never touched, not even inside
  assert own_process_state == []  # nothing was reported to the test's hook
