"""benchmarks/torch_step_side_by_side.py times steady-state steps: its
untimed rounds go on until a round of each side faults in no new host
memory, and each timed round reports the page faults it saw."""

import importlib.util
import mmap
import sys

import numpy as np
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
    self.meter = type("Meter", (), {"faults_per_step": self.faults.pop(0)})()
    return 1.0


def test_warm_up_stops_at_the_first_round_where_neither_side_faults():
  # Ours settles in its third round, PyTorch's in its first: a round where
  # only one side is fault-free does not end the warm-up.
  ours, theirs = ScriptedSide([300_000, 65_000, 0, 0]), ScriptedSide([0, 0, 0, 0])
  assert side_by_side.warm_up(ours, theirs, steps=2, max_rounds=5) == 3
  assert ours.rounds == theirs.rounds == [2, 2, 2]

  # Ours faults in round 2 after a fault-free round 1 of PyTorch's and
  # settles only with PyTorch's own late fault in round 3 gone.
  ours, theirs = ScriptedSide([0, 5, 0]), ScriptedSide([3, 0, 0])
  assert side_by_side.warm_up(ours, theirs, steps=1, max_rounds=5) == 3


def test_warm_up_gives_up_after_max_rounds():
  ours, theirs = ScriptedSide([1] * 4), ScriptedSide([0] * 4)
  assert side_by_side.warm_up(ours, theirs, steps=2, max_rounds=4) == 4
  assert ours.rounds == [2, 2, 2, 2]


def test_round_meter_counts_the_pages_a_round_faults_in():
  # A fresh 64 MiB anonymous mapping, written for the first time inside the
  # round: at least one fault per page it touches (4 KiB pages: 16,384; at
  # least 32 even with 2 MiB huge pages). Written again: already mapped, no
  # new faults beyond a few of the interpreter's own.
  size = 64 * 2**20
  memory = mmap.mmap(-1, size)
  pages = np.frombuffer(memory, dtype=np.uint8)
  with side_by_side.RoundMeter() as meter:
    pages[:] = 1
    meter.stop(steps=2)
  assert meter.faults_per_step >= size / 2**21 / 2
  with side_by_side.RoundMeter() as meter:
    pages[:] = 2
    meter.stop(steps=1)
  assert meter.faults_per_step < size / 4096 / 100
  assert meter.cores_busy > 0
  del pages
  memory.close()
