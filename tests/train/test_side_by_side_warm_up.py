"""benchmarks/torch_step_side_by_side.py times steady-state steps: its
untimed rounds go on until a round of each side faults in no new host
memory (counted by `host_memory.HostUsage`, tests/train/test_host_memory.py)."""

import importlib.util
import sys

from paths import REPO

spec = importlib.util.spec_from_file_location(
  "torch_step_side_by_side", REPO / "benchmarks" / "torch_step_side_by_side.py"
)
side_by_side = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = side_by_side
spec.loader.exec_module(side_by_side)


class ScriptedSide:
  """A side whose rounds fault in the given numbers of pages per step."""

  def __init__(self, faults_per_round):
    self.faults = list(faults_per_round)
    self.rounds = []

  def __call__(self, steps):
    self.rounds.append(steps)
    self.usage = {"page_faults_per_step": self.faults.pop(0)}
    return 1.0


def test_warm_up_stops_at_the_first_round_where_neither_side_faults():
  # Ours settles in its third round, PyTorch's in its first: a round where
  # only one side is fault-free does not end the warm-up.
  ours, theirs = ScriptedSide([300_000, 65_000, 0, 0]), ScriptedSide([0, 0, 0, 0])
  assert side_by_side.warm_up(ours, theirs, steps=2, max_rounds=5) == 3
  assert ours.rounds == theirs.rounds == [2, 2, 2]

  # The sides need not settle together: PyTorch's faults in round 1, ours
  # in round 2; round 3 is the first where neither does.
  ours, theirs = ScriptedSide([0, 5, 0]), ScriptedSide([3, 0, 0])
  assert side_by_side.warm_up(ours, theirs, steps=1, max_rounds=5) == 3


def test_warm_up_gives_up_after_max_rounds():
  ours, theirs = ScriptedSide([1] * 4), ScriptedSide([0] * 4)
  assert side_by_side.warm_up(ours, theirs, steps=2, max_rounds=4) == 4
  assert ours.rounds == [2, 2, 2, 2]
