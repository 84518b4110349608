"""Keeping freed host memory in the process, for steps that run on a CPU.

XLA:CPU allocates each execution's scratch buffer (the compiled step's
`temp` bytes: 75 MiB for the tiny MERU step, 1.25 GiB for ViT-S/16 at
batch 8) when the step starts and frees it when the step ends. The
allocation comes from one of XLA's worker threads, and glibc serves a
request that large from a thread's arena with a fresh `mmap` and returns it
with `munmap`: every step then touches new pages, and the kernel faults in
and zeroes each 4 KiB page again (320,000 faults and about 0.45 s of
system time per ViT-S step on the 2-vCPU machine of docs/performance.md,
12% of the step).

`keep_freed_host_memory()` sets glibc's allocator, for this process, to
serve every allocation from the main heap (`M_ARENA_MAX=1`, `M_MMAP_MAX=0`)
and never hand freed memory back to the kernel (`M_TRIM_THRESHOLD`
unbounded): the next step reuses the same pages, already mapped. The price
is that the process keeps its peak host memory until it exits, which a
training job reaches every step anyway. The same as starting Python with
MALLOC_ARENA_MAX=1 MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=<large>.

It has to run before the threads that allocate exist (before JAX starts its
CPU backend): the entry points that run steps call it first
(`hyperbolic_vl.main`, `tools.step_throughput`, the PyTorch side by side).
A process that runs on a GPU or TPU keeps glibc's defaults: its steps'
buffers live in device memory, and its input pipeline's threads are better
served by their own arenas.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import importlib.metadata
import importlib.util
import os
import resource
import sys
import time

# mallopt(3) parameters (glibc's malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
_M_ARENA_MAX = -8
# An int argument of -1 reaches glibc's size_t setting as SIZE_MAX: never trim.
_UNBOUNDED = -1

_ACCELERATOR_PLATFORMS = ("cuda", "gpu", "rocm", "tpu")


def runs_on_cpu(jax_platforms: str | None = None) -> bool:
  """Whether JAX will pick the CPU, decided without starting a backend.

  `jax_platforms` (default: the JAX_PLATFORMS environment variable) names
  the platforms in order of preference, as JAX reads it; unset, JAX takes
  an accelerator whenever a plugin for one is installed (the `jax_plugins`
  entry points that jax[cuda*] and jax[tpu] install, or libtpu)."""
  if jax_platforms is None:
    jax_platforms = os.environ.get("JAX_PLATFORMS", "")
  chosen = [name.strip() for name in jax_platforms.split(",") if name.strip()]
  if chosen:
    return chosen[0] == "cpu"
  plugins = importlib.metadata.entry_points(group="jax_plugins")
  if any(any(p in plugin.name for p in _ACCELERATOR_PLATFORMS) for plugin in plugins):
    return False
  return importlib.util.find_spec("libtpu") is None


def keep_freed_host_memory(jax_platforms: str | None = None) -> str:
  """Sets glibc's allocator to reuse freed memory (see the module's text)
  when this process will run its steps on a CPU; returns one line saying
  what it did, for the log."""
  if not sys.platform.startswith("linux"):
    return "host allocator: the platform's default (not Linux)"
  if not runs_on_cpu(jax_platforms):
    return "host allocator: glibc's default (the steps run on an accelerator)"
  try:
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    mallopt = libc.mallopt
  except (OSError, AttributeError):
    return "host allocator: the default (no glibc mallopt)"
  mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
  mallopt.restype = ctypes.c_int
  settings = ((_M_ARENA_MAX, 1), (_M_MMAP_MAX, 0), (_M_TRIM_THRESHOLD, _UNBOUNDED))
  if not all(mallopt(parameter, value) == 1 for parameter, value in settings):
    return "host allocator: glibc refused the settings; freed memory goes back to the kernel"
  return "host allocator: freed memory kept for reuse (one arena, no mmap, no trim)"


class HostUsage:
  """What a run of steps cost the host, from construction to `per_step`:
  wall time, the cores kept busy (process CPU time over wall time; threads
  that spin while they wait count as busy), and the page faults and system
  time per step. Faults that do not fall to zero after a few steps mean
  freed memory is being mapped afresh (see above)."""

  def __init__(self):
    self._usage = resource.getrusage(resource.RUSAGE_SELF)
    self._cpu_s = time.process_time()
    self._wall_s = time.perf_counter()

  def per_step(self, steps: int) -> dict:
    wall_s = time.perf_counter() - self._wall_s
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return {
      "step_s": wall_s / steps,
      "cores_busy": (time.process_time() - self._cpu_s) / wall_s,
      "page_faults_per_step": (usage.ru_minflt - self._usage.ru_minflt) / steps,
      "system_s_per_step": (usage.ru_stime - self._usage.ru_stime) / steps,
    }
