"""benchmarks/gpu_figures.sh --dry_run: every step_throughput command of
every stage compiles at tiny shapes on 8 virtual CPU devices."""

import os
import re
import subprocess
import sys

import cheap_codegen
import pytest
from paths import REPO

# throughput 4, hmid 2, attention 3, token_drop 2, sigmoid 3 (the ring on 8
# devices), xla_flags 2, fsdp 4 (1, 2, 4, 8 on 8
# devices), memory_options 1 (the bf16 first moment; remat and accumulation
# add one each where the config has their keys), profile 1, stability 1.
BASE_COMMANDS = 23


@pytest.mark.slow
def test_dry_run_compiles_every_command(tmp_path):
  env = dict(os.environ)
  env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env["PATH"]
  env["LOG_DIR"] = str(tmp_path)
  # The script asks for its own 8 devices; the session's cheap code
  # generation (tests/conftest.py) stays.
  env["XLA_FLAGS"] = cheap_codegen.XLA_FLAG
  done = subprocess.run(
    ["bash", "benchmarks/gpu_figures.sh", "--dry_run"],
    cwd=REPO,
    env=env,
    capture_output=True,
    text=True,
    timeout=1500,
  )
  assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
  commands = re.findall(
    r"^=== \S+ python -m hyperbolic_vl\.tools\.step_throughput", done.stdout, re.M
  )
  statuses = re.findall(r"^=== rc=(\d+)$", done.stdout, re.MULTILINE)
  assert len(commands) >= BASE_COMMANDS, done.stdout[-4000:]
  assert statuses == ["0"] * len(commands), done.stdout[-4000:]
  fsdp_log = (tmp_path / "fsdp.log").read_text()
  assert [int(f) for f in re.findall(r"^\s+fsdp: (\d+)$", fsdp_log, re.MULTILINE)] == [1, 2, 4, 8]
  assert "needs a GPU; compiling with xla attention" in (tmp_path / "attention.log").read_text()
  assert "--config.optim.mu_dtype=bfloat16" in (tmp_path / "memory_options.log").read_text()
  for stage in ("torch", "tests"):
    assert "=== skipped:" in (tmp_path / f"{stage}.log").read_text()
