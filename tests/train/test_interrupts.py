"""Ctrl-C and a killed run: one line, exit 130, and the same command resumes
to the figures of a run never interrupted.

The in-process tests (the push tier) check the signal watcher, its last
line, the progress line and a Ctrl-C inside the training loop; the
command-line tests (slow) send SIGINT at 20 moments of a tiny run, chosen
from what it prints (start-up, compile, steps, a save, a periodic and the
final evaluation), and SIGKILL one to leave its lock behind."""

import io
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time

import interactive
import jax
import numpy as np
import pytest
from paths import REPO
from tiny_runs import small_config

from hyperbolic_vl.runs import checkpointing, metrics_io, run_dir
from hyperbolic_vl.training import loop, preemption


def wait_for(predicate, timeout=10.0) -> bool:
  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline:
    if predicate():
      return True
    time.sleep(0.01)
  return predicate()


# --- the signal watcher ------------------------------------------------------


def test_ctrl_c_while_training_waits_for_the_step_and_elsewhere_raises():
  before = signal.getsignal(signal.SIGINT)
  with preemption.StopSignals() as signals:
    signals.phase = preemption.TRAINING
    os.kill(os.getpid(), signal.SIGINT)
    assert wait_for(lambda: signals.requested == signal.SIGINT)
    assert signals.reached(7) == signal.SIGINT
  # Library use outside the training phase: Python's own KeyboardInterrupt.
  with pytest.raises(KeyboardInterrupt):
    with preemption.StopSignals() as signals:
      signals.phase = "compiling the step"
      os.kill(os.getpid(), signal.SIGINT)
      wait_for(lambda: False, timeout=2.0)
  assert signal.getsignal(signal.SIGINT) is before  # restored after the run


# The command line's watcher, in a process of its own: it ends the process.
LAST_LINE_SCRIPT = """
import os, signal, sys, time
from hyperbolic_vl.training import preemption

with preemption.StopSignals(exit_at_once=True) as signals:
  signals.phase = "compiling the step"
  os.dup2(os.open(os.devnull, os.O_WRONLY), 2)  # as while clu is imported quietly
  sys.stdout.write("Compiling the step...")  # a print's text, its newline still to come
  os.kill(os.getpid(), signal.SIGINT)
  time.sleep(1.0)
  while True:  # the main thread goes on printing until the process ends
    print("a line the main thread prints", flush=True)
    time.sleep(0.001)
"""


def test_the_stop_line_is_the_last_line_on_a_line_of_its_own_even_with_stderr_muted():
  done = subprocess.run(
    [sys.executable, "-c", LAST_LINE_SCRIPT],
    cwd=REPO,
    stdout=subprocess.PIPE,
    stderr=subprocess.STDOUT,
    text=True,
    timeout=120,
  )
  lines = done.stdout.splitlines()
  assert done.returncode == preemption.EXIT_INTERRUPTED, done.stdout
  assert [line for line in lines if "Ctrl-C" in line] == ["Ctrl-C: stopped"], done.stdout
  assert lines[-1] == "Ctrl-C: stopped", done.stdout


def test_sigterm_in_library_use_stops_at_the_next_step_boundary():
  with preemption.StopSignals() as signals:
    signals.phase = "compiling the step"
    os.kill(os.getpid(), signal.SIGTERM)
    assert wait_for(lambda: signals.requested == signal.SIGTERM)


# --- the progress line ---------------------------------------------------------


class FakeClock:
  def __init__(self):
    self.now = 100.0

  def __call__(self):
    return self.now


class Terminal(io.StringIO):
  def isatty(self):
    return True


def test_progress_line_figures_at_a_steady_rate(monkeypatch):
  clock = FakeClock()
  monkeypatch.setattr(metrics_io.time, "perf_counter", clock)
  out = io.StringIO()
  progress = metrics_io.ProgressLine(total_steps=100, batch_size=16, every_secs=10.0, stream=out)
  progress.started(step=1)
  clock.now += 5.0
  progress.update(26, loss=1.23456)  # 5 s after the start: under every_secs, nothing shown
  assert out.getvalue() == ""
  clock.now += 5.0
  progress.update(51)
  # 50 steps in 10 s: 5 steps/s, 5 x 16 = 80 examples/s, 49 steps left / 5 = 9.8 s -> "10s".
  assert out.getvalue() == "step 51/100  loss 1.2346  5.00 steps/s  80 examples/s  10s left\n"
  # Under 10 examples/s (a paper-size model on a CPU) keeps two decimals.
  slow = metrics_io.ProgressLine(total_steps=100, batch_size=8, every_secs=0.0, stream=out)
  slow.started(step=0)
  clock.now += 40.0
  slow.show(1)  # 1 step in 40 s: 0.025 steps/s, 0.2 examples/s, 99 / 0.025 = 3960 s left
  assert out.getvalue().splitlines()[-1] == "step 1/100  0.03 steps/s  0.20 examples/s  1h06m left"
  assert metrics_io.format_duration(3725) == "1h02m"
  assert metrics_io.format_duration(185) == "3m05s"


def test_progress_on_a_terminal_is_a_bar_redrawn_in_place(monkeypatch):
  clock = FakeClock()
  monkeypatch.setattr(metrics_io.time, "perf_counter", clock)
  out = Terminal()
  progress = metrics_io.ProgressLine(total_steps=100, batch_size=16, every_secs=30.0, stream=out)
  progress.started(step=0)
  clock.now += 1.0
  progress.update(50)  # a terminal redraws every 0.5 s, whatever every_secs says
  progress.finish()
  # Half of the 24-character bar filled; the line ended once training ends.
  assert out.getvalue() == (
    "\r[############............] step 50/100  50.00 steps/s  800 examples/s  1s left\033[K\n"
  )


def test_the_logs_periodic_progress_line_gives_rate_time_left_and_shares(monkeypatch):
  clock = FakeClock()
  monkeypatch.setattr(metrics_io.time, "perf_counter", clock)
  lines = []
  monkeypatch.setattr(metrics_io.logging, "info", lambda text, *args: lines.append(text % args))
  progress = metrics_io.PeriodicProgress(total_steps=1000, every_steps=100)
  progress(0)  # the first call starts the clock
  clock.now += 10.0
  progress(99)  # under every_steps: nothing logged
  with progress.timed("eval"):
    clock.now += 5.0
  with progress.timed("checkpoint"):
    clock.now += 1.0
  clock.now += 4.0
  progress(100)
  # 100 steps in 20 s: 5 steps/s, 900 left / 5 = 180 s; eval 5 of 20 s, checkpoint 1 of 20 s.
  assert lines == ["step 100/1000: 5.00 steps/s, 3m00s left, checkpoint 5.0%, eval 25.0%"]
  clock.now += 50.0
  progress(300)  # shares start again from each line
  assert lines[-1] == "step 300/1000: 4.00 steps/s, 2m55s left"


# --- Ctrl-C inside the loop (in-process) -------------------------------------


def run_config(**overrides):
  return small_config(log_training_steps=1, ckpt_steps=100, **overrides)


def params_of(state):
  return jax.tree.leaves(jax.device_get(state["params"]))


def test_ctrl_c_at_a_step_saves_it_and_the_same_call_resumes_exactly(tmp_path, monkeypatch, capsys):
  reference = loop.train(run_config(), str(tmp_path / "reference"))

  workdir = tmp_path / "interrupted"
  write = metrics_io.TrainLog.write

  def write_and_press_ctrl_c(log, step, metrics, extra):
    if step == 2:
      os.kill(os.getpid(), signal.SIGINT)
      # The watcher thread records it before the loop looks after this step.
      time.sleep(0.3)
    return write(log, step, metrics, extra)

  monkeypatch.setattr(metrics_io.TrainLog, "write", write_and_press_ctrl_c)
  capsys.readouterr()
  with pytest.raises(preemption.RunInterrupted):
    loop.train(run_config(), str(workdir))
  printed = capsys.readouterr()
  assert "Traceback" not in printed.out + printed.err
  assert [line for line in printed.out.splitlines() if "Ctrl-C" in line] == [
    "Ctrl-C after step 2: saving a checkpoint; run the same command to resume."
  ]
  assert checkpointing.saved_steps(str(workdir / "checkpoints")) == [2]
  assert not (workdir / run_dir.LOCK_FILE).exists()

  monkeypatch.setattr(metrics_io.TrainLog, "write", write)
  resumed = loop.train(run_config(), str(workdir))
  assert resumed.step == reference.step == 6
  for mine, theirs in zip(params_of(resumed.state), params_of(reference.state), strict=True):
    np.testing.assert_array_equal(mine, theirs)  # the same steps on the same batches: exact


# --- the command line: SIGINT at 20 moments, twice once, SIGKILL once (slow) -----

TINY_RUN = (
  "--config=configs/meru.py",
  "--config.input.image_size=16",
  "--config.input.batch_size=16",
  "--config.total_steps=8",
  "--config.optim.warmup_steps=2",
  "--config.log_training_steps=2",
  "--config.ckpt_steps=3",
  "--config.progress_every_secs=0",  # a progress line per step: the moments to aim at
  "--config.evals.world.num_examples=64",
  "--config.evals.world.batch_size=64",
  "--config.evals.world.every_steps=4",  # a periodic evaluation at step 4
)

# (a line the run prints, seconds after it): every phase of a run. The delays
# are drawn once from a seeded generator, so a failure names a moment that
# can be replayed. 0.5 s after "Trained to step 8" the run has finished and
# Python is tearing down: a Ctrl-C there killed it with status -2 (6 times
# in 6) until main.py ignored the signals once the outcome was decided. On a
# loaded machine, 0 s after "Parameters:" the main thread printed
# "Compiling the step..." after the stop line, or glued its text to it; 1.5 s
# after "Compiling the step", once the step is loaded from the cache, clu is
# imported with stderr pointed at /dev/null and the line was lost (exit 130,
# nothing printed): `preemption._Console` keeps the line last and seen.
_rng = random.Random(29)
MOMENTS = [
  ("", 1.0),  # Python and JAX importing
  ("Parameters:", 0.0),  # setting up: the first batch read, the step traced
  ("Compiling the step", 0.0),
  ("Compiling the step", 0.3),
  ("Compiling the step", 1.5),  # loaded from the cache: the writers being built
  ("First step done", 0.0),
  ("step 2/8", 0.0),
  ("step 3/8", 0.0),  # the save of step 3 in flight
  ("step 3/8", 0.05),
  ("step 4/8", 0.0),  # the periodic evaluation
  ("step 4/8", 0.5),
  ("step 5/8", _rng.uniform(0, 0.3)),
  ("step 6/8", 0.0),  # the save of step 6
  ("step 6/8", _rng.uniform(0, 0.3)),
  ("step 7/8", _rng.uniform(0, 0.3)),
  ("step 8/8", 0.0),  # the final save
  ("step 8/8", _rng.uniform(0, 0.3)),
  ("Trained to step 8", 0.0),  # the final evaluation
  ("Trained to step 8", 0.5),  # the finished run's teardown (or its evaluation)
  ("First step done", _rng.uniform(0, 1.0)),
]


def command(workdir, cache):
  return [
    sys.executable,
    "-m",
    "hyperbolic_vl.main",
    *TINY_RUN,
    f"--workdir={workdir}",
    f"--config.compilation_cache_dir={cache}",
  ]


def run_to_the_end(workdir, cache) -> list[str]:
  done = subprocess.run(
    command(workdir, cache), cwd=REPO, capture_output=True, text=True, timeout=900
  )
  assert done.returncode == 0, done.stdout + done.stderr
  return (done.stdout + done.stderr).splitlines()


def run_and_signal(workdir, cache, trigger: str, delay: float, signum=signal.SIGINT):
  """Starts the run, sends `signum` `delay` s after it prints a line holding
  `trigger`; returns (exit code, lines before the signal, lines after)."""
  process = interactive.popen(
    command(workdir, cache),
    cwd=REPO,
    stdout=subprocess.PIPE,
    stderr=subprocess.STDOUT,
    text=True,
    bufsize=1,
  )
  before, after, sent = [], [], threading.Event()

  def send():
    time.sleep(delay)
    process.send_signal(signum)
    sent.set()

  if not trigger:
    threading.Thread(target=send, daemon=True).start()
  for line in process.stdout:
    (after if sent.is_set() else before).append(line.rstrip("\n"))
    if trigger and trigger in line and not sent.is_set() and len(before) == _first(before, trigger):
      threading.Thread(target=send, daemon=True).start()
  return process.wait(timeout=900), before, after, sent.is_set()


def _first(lines, trigger) -> int:
  """1 + the index of the first line holding `trigger` (send once)."""
  return next(i for i, line in enumerate(lines) if trigger in line) + 1


def final_figures(workdir) -> dict:
  records = metrics_io.read_metrics(str(workdir))
  final = [r for r in records if r["step"] == 8 and "eval/zero_shot_accuracy" in r]
  losses = {r["step"]: r["train/loss"] for r in records if "train/loss" in r}
  return {"eval": final[-1], "losses": losses}


@pytest.fixture(scope="module")
def reference_run(tmp_path_factory):
  root = tmp_path_factory.mktemp("interrupts")
  cache = root / "compilation_cache"
  run_to_the_end(root / "reference", cache)
  return {"root": root, "cache": cache, "figures": final_figures(root / "reference")}


@pytest.mark.slow
@pytest.mark.parametrize(("trigger", "delay"), MOMENTS)
def test_ctrl_c_at_any_moment_is_one_line_exit_130_and_resumes_exactly(
  reference_run, trigger, delay
):
  workdir = reference_run["root"] / f"run_{MOMENTS.index((trigger, delay))}"
  code, before, after, sent = run_and_signal(workdir, reference_run["cache"], trigger, delay)
  if code == 0:
    assert not sent or any("Evaluation at step 8" in line for line in before + after)
  else:
    printed = "\n".join(before + after)
    assert code == preemption.EXIT_INTERRUPTED, printed
    assert "Traceback" not in printed and "Error" not in printed, printed
    stop_lines = [line for line in before + after if line.startswith("Ctrl-C")]
    assert len(stop_lines) == 1 and (before + after)[-1] == stop_lines[0], printed
    assert not (workdir / run_dir.LOCK_FILE).exists()
  run_to_the_end(workdir, reference_run["cache"])
  figures = final_figures(workdir)
  assert figures["losses"] == reference_run["figures"]["losses"]
  assert figures["eval"] == reference_run["figures"]["eval"]


@pytest.mark.slow
def test_sigkill_leaves_a_lock_the_same_command_takes_over(reference_run):
  workdir = reference_run["root"] / "killed"
  code, _, _, _ = run_and_signal(
    workdir, reference_run["cache"], "step 4/8", 0.2, signum=signal.SIGKILL
  )
  assert code == -signal.SIGKILL
  lock = json.loads((workdir / run_dir.LOCK_FILE).read_text())
  lines = run_to_the_end(workdir, reference_run["cache"])
  taken_over = [line for line in lines if "took over the lock" in line]
  assert len(taken_over) == 1 and f"left by pid {lock['pid']}" in taken_over[0]
  figures = final_figures(workdir)
  assert figures["losses"] == reference_run["figures"]["losses"]
  assert figures["eval"] == reference_run["figures"]["eval"]


@pytest.mark.slow
def test_a_second_ctrl_c_exits_at_once_and_the_run_still_resumes_exactly(reference_run):
  workdir = reference_run["root"] / "twice"
  process = interactive.popen(
    command(workdir, reference_run["cache"]),
    cwd=REPO,
    stdout=subprocess.PIPE,
    stderr=subprocess.STDOUT,
    text=True,
    bufsize=1,
  )
  for line in process.stdout:
    if line.startswith("step 5/8"):
      process.send_signal(signal.SIGINT)  # saves step 5 ...
      time.sleep(0.02)
      process.send_signal(signal.SIGINT)  # ... unless a second one ends it first
      break
  after = process.stdout.read().splitlines()
  assert process.wait(timeout=600) == preemption.EXIT_INTERRUPTED
  assert "Traceback" not in "\n".join(after)
  assert after[-1].startswith("Ctrl-C again: stopped at once"), after
  run_to_the_end(workdir, reference_run["cache"])
  figures = final_figures(workdir)
  assert figures["losses"] == reference_run["figures"]["losses"]
  assert figures["eval"] == reference_run["figures"]["eval"]
