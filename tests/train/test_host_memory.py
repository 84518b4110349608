"""The host allocator setting of CPU runs (training/host_memory.py): with it,
a compiled program's scratch buffer is reused from one call to the next
instead of being mapped and faulted in again; without it, every call
faults in its scratch memory (the control, which shows the measurement can
tell the two apart)."""

import mmap
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from hyperbolic_vl.training import host_memory

# A 64 MiB scratch buffer (sin(x), stored for the matrix product that reads
# it), far above glibc's largest mmap threshold (32 MiB), so the default
# allocator maps it per call.
_PROGRAM = textwrap.dedent(
  """
  import resource, sys
  from hyperbolic_vl.training import host_memory
  if sys.argv[1] == "keep":
    print(host_memory.keep_freed_host_memory("cpu"))
  import jax, jax.numpy as jnp
  x = jnp.ones((8192, 2048), jnp.float32)
  compiled = jax.jit(lambda x: jnp.sin(x) @ jnp.ones((2048, 8))).lower(x).compile()
  print("temp_pages", compiled.memory_analysis().temp_size_in_bytes // resource.getpagesize())
  faults = []
  for _ in range(40):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    compiled(x).block_until_ready()
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
  # glibc's heap settles within a few calls (up to 8 seen, with the freed
  # blocks of earlier calls' outputs in between), and under load an odd
  # later call may still grow it once: the median of the last 30 calls is
  # the steady state.
  print("steady_faults", sorted(faults[10:])[15])
  """
)


def _faults_per_call(mode: str) -> tuple[float, int, str]:
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  for name in ("MALLOC_ARENA_MAX", "MALLOC_MMAP_MAX_", "MALLOC_TRIM_THRESHOLD_"):
    env.pop(name, None)
  done = subprocess.run(
    [sys.executable, "-c", _PROGRAM, mode], capture_output=True, text=True, env=env, timeout=300
  )
  assert done.returncode == 0, done.stderr[-2000:]
  values = dict(
    line.split(" ", 1) for line in done.stdout.splitlines() if line.startswith(("temp", "steady"))
  )
  return float(values["steady_faults"]), int(values["temp_pages"]), done.stdout


def _transparent_huge_pages_always() -> bool:
  try:
    with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
      return "[always]" in f.read()
  except OSError:
    return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator")
def test_scratch_memory_is_reused_between_calls():
  kept, temp_pages, stdout = _faults_per_call("keep")
  assert temp_pages >= (64 << 20) // os.sysconf("SC_PAGE_SIZE")
  assert "freed memory kept for reuse" in stdout
  # Reused: no page of the 64 MiB scratch is faulted in again (a few stray
  # faults of small allocations are allowed).
  assert kept < 0.01 * temp_pages
  default, _, _ = _faults_per_call("default")
  if not _transparent_huge_pages_always():
    # Mapped afresh per call: at least every page of the scratch buffer.
    assert default >= temp_pages


def test_runs_on_cpu_follows_jax_platforms():
  assert host_memory.runs_on_cpu("cpu")
  assert host_memory.runs_on_cpu(" cpu ,cuda")
  assert not host_memory.runs_on_cpu("cuda,cpu")
  assert not host_memory.runs_on_cpu("tpu")


def test_accelerator_runs_keep_the_default_allocator():
  assert host_memory.keep_freed_host_memory("cuda") == (
    "host allocator: glibc's default (the steps run on an accelerator)"
  )


def test_host_usage_counts_the_pages_a_run_faults_in():
  # A fresh 64 MiB anonymous mapping, written for the first time inside the
  # run: at least one fault per page it touches (4 KiB pages: 16,384; at
  # least 32 even with 2 MiB huge pages). Written again: already mapped, no
  # new faults beyond a few of the interpreter's own.
  size = 64 * 2**20
  memory = mmap.mmap(-1, size)
  pages = np.frombuffer(memory, dtype=np.uint8)
  usage = host_memory.HostUsage()
  pages[:] = 1
  first = usage.per_step(steps=2)
  assert first["page_faults_per_step"] >= size / 2**21 / 2
  usage = host_memory.HostUsage()
  pages[:] = 2
  again = usage.per_step(steps=1)
  assert again["page_faults_per_step"] < size / 4096 / 100
  assert again["step_s"] > 0 and again["cores_busy"] > 0
  del pages
  memory.close()
