"""`python -m hyperbolic_vl.tools.aot` as a user meets it without the `aot`
extra: what it refuses before compiling, each in one line with its own exit
status, and Ctrl-C at any moment (exit 130, one line, no report). The
compiles for TPUs and GPUs are tests/train/test_aot.py's (the extra)."""

import signal
import subprocess
import sys
import time

import interrupt_aot
import pod_box
import pytest
from paths import REPO

from hyperbolic_vl.tools import aot_targets

ROOT = str(REPO)


def test_what_is_refused_before_compiling_is_one_line_each(tmp_path):
  """Each at once, before any compile, one line and its own exit status:
  the backend's package missing (5, every platform), a --json path that
  cannot be written and an override naming no key (2, the valid keys
  listed as `main` lists them). The four commands run side by side."""
  if aot_targets.installed("libtpu") or aot_targets.installed("jax_plugins.xla_cuda12"):
    pytest.skip("the aot extra is installed: nothing is missing")
  cases = {
    "gpu": (["--topology=h100:8"], 5, "error: compiling for h100:8 needs the jax-cuda12-plugin"),
    "tpu": (["--topology=v5e:2x2"], 5, "error: compiling for v5e:2x2 needs the libtpu package"),
    "json": (
      ["--topology=cpu:1", f"--json={tmp_path}"],
      2,
      f"error: --json={tmp_path} is a folder; give a file",
    ),
    "typo": (
      ["--topology=cpu:1", "--config.input.batch_sise=3"],
      2,
      "error: unknown config key 'input.batch_sise': config.input has no 'batch_sise'.",
    ),
  }
  started = {
    name: subprocess.Popen(
      [sys.executable, "-m", "hyperbolic_vl.tools.aot", "--config=configs/meru.py", *args],
      cwd=ROOT,
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
      text=True,
    )
    for name, (args, _, _) in cases.items()
  }
  for name, process in started.items():
    out, err = process.communicate(timeout=300)
    _, code, first = cases[name]
    lines = [line for line in err.splitlines() if line.strip()]
    assert process.returncode == code and lines[0].startswith(first), (name, err)
    assert "Compiling" not in out
    if name == "typo":  # the valid keys on the second line, as main prints them
      assert lines[1].startswith("Valid keys of config.input: batch_size, data,")
    else:
      assert len(lines) == 1, (name, lines)


@pytest.mark.slow
def test_ctrl_c_into_the_check_exits_130_with_one_line(tmp_path):
  """While Python and JAX import, and while the step is traced and
  compiled (tests/fixtures/interrupt_aot.py draws 20 moments at random)."""
  starting = interrupt_aot.try_once("configs/meru.py", "cpu:1", 0.3, str(tmp_path))
  assert interrupt_aot.passed(starting), starting
  json_path = tmp_path / "compiling.json"
  process = interrupt_aot.start("configs/meru.py", "cpu:1", str(json_path))
  assert process.stdout.readline().startswith("Compiling the step for cpu:1")
  time.sleep(0.5)
  process.send_signal(signal.SIGINT)
  out, err = process.communicate(timeout=120)
  assert process.returncode == 130 and err.strip() == (
    "Ctrl-C: the check stopped; no report, nothing written"
  )
  assert "Memory per chip" not in out and not json_path.exists()


def test_the_launchers_name_the_missing_extra_and_start_nothing(tmp_path):
  """The login-node form without the `aot` extra: the check's line, then
  the launcher's, exit 5; nothing submitted to the box's queue."""
  if aot_targets.installed("jax_plugins.xla_cuda12"):
    pytest.skip("the aot extra is installed: nothing is missing")
  done = pod_box.run_launcher(
    tmp_path, "slurm_gpu.sbatch", ["configs/meru.py", str(tmp_path / "run")], GPU="h100", NODES="2"
  )
  lines = [line for line in done.stderr.splitlines() if line.strip()]
  assert done.returncode == 5, done.stderr
  assert lines == [
    "error: compiling for h100:2x8 needs the jax-cuda12-plugin package, which is not "
    'installed: pip install -e ".[aot]"',
    "launch/slurm_gpu.sbatch: nothing was started: the check needs the aot extra: "
    "pip install -e '.[aot]'; SKIP_AOT=1 skips the check",
  ]
  assert not (tmp_path / "jobs").exists() or not any((tmp_path / "jobs").iterdir())
