"""Compiling the step once per job: JAX's persistent compilation cache in the
directory `config.compilation_cache_dir` names, and the step compiled ahead
of its first call, so the console can say "compiling the step...", how long
it took, whether the cache held it, and what memory it needs."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import sys
import threading
import time

import jax
from jax.experimental.compilation_cache import compilation_cache

from hyperbolic_vl.models import compile_target

# JAX's monitoring events of its persistent cache (jax/_src/compiler.py).
_CACHE_HIT_EVENT = "/jax/compilation_cache/cache_hits"
_cache_hits = 0
_listener_lock = threading.Lock()
_listening = False


def _count_event(event: str, **kwargs) -> None:
  del kwargs
  global _cache_hits
  if event == _CACHE_HIT_EVENT:
    _cache_hits += 1


def _listen() -> None:
  global _listening
  with _listener_lock:
    if not _listening:
      jax.monitoring.register_event_listener(_count_event)
      _listening = True


def step_compiler_options() -> dict[str, str]:
  """XLA options the train step is compiled with (`jax.jit(compiler_options=)`).

  On a CPU: keep optimization barriers through fusion. XLA:CPU otherwise
  expands them first, and the model's `residual_gradient_stored` (which
  stops the backward pass recomputing the residual stream's gradient in
  every block) would do nothing. Elsewhere none: GPUs and TPUs keep
  barriers already."""
  if compile_target.platform() != "cpu":
    return {}
  return {"xla_disable_hlo_passes": "cse_barrier_expander"}


def default_cache_dir() -> str:
  """Where a run's compiled steps go unless the config or JAX names a folder:
  $XDG_CACHE_HOME (or ~/.cache)/hyperbolic_vl/jax_compilation_cache."""
  root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return os.path.join(root, "hyperbolic_vl", "jax_compilation_cache")


def resolve_cache_dir(config) -> str | None:
  """The cache directory of a run: `config.compilation_cache_dir` if it
  names one, None for "off"; for "" the folder JAX is already set to
  (JAX_COMPILATION_CACHE_DIR, e.g. a test session's), else the user cache."""
  value = str(config.get("compilation_cache_dir", "") or "").strip()
  if value.lower() in ("off", "none", "false", "0"):
    return None
  if value:
    return os.path.abspath(os.path.expanduser(value))
  return jax.config.jax_compilation_cache_dir or default_cache_dir()


def _set_cache(directory: str | None, min_compile_secs: float) -> None:
  # JAX reads the directory when it first uses the cache: a changed one
  # takes a reset to take effect.
  compilation_cache.reset_cache()
  jax.config.update("jax_compilation_cache_dir", directory)
  jax.config.update("jax_enable_compilation_cache", directory is not None)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", min_compile_secs)


@contextlib.contextmanager
def persistent_cache(config):
  """JAX's persistent compilation cache in the run's directory
  (`resolve_cache_dir`) for the length of a run, JAX's previous setting
  restored after it (the cache is process-wide). Yields the directory, or
  None when the config turns the cache off or the folder cannot be created
  (then a warning, and the run compiles as it would without a cache)."""
  directory = resolve_cache_dir(config)
  if directory is not None:
    try:
      os.makedirs(directory, exist_ok=True)
    except OSError as error:
      print(
        f"warning: compilation cache off: cannot create {directory} ({error.strerror}); "
        "set config.compilation_cache_dir to a writable folder",
        file=sys.stderr,
        flush=True,
      )
      directory = None
  _listen()
  previous = (
    jax.config.jax_compilation_cache_dir,
    jax.config.jax_persistent_cache_min_compile_time_secs,
  )
  previous_enabled = jax.config.jax_enable_compilation_cache
  # Every compile of a second or more is worth keeping (JAX's default), and
  # a tiny run's step compiles in about that: keep those too, unless the
  # environment chose.
  min_secs = previous[1]
  if "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS" not in os.environ:
    min_secs = min(min_secs, 0.5)
  changed = (directory, min_secs, directory is not None) != (*previous, previous_enabled)
  if changed:
    _set_cache(directory, min_secs)
  try:
    yield directory
  finally:
    if changed:
      _set_cache(previous[0], previous[1])
      jax.config.update("jax_enable_compilation_cache", previous_enabled)


@dataclasses.dataclass(frozen=True)
class CompiledStep:
  executable: object  # jax.stages.Compiled
  seconds: float
  cache_hit: bool
  memory: object | None  # CompiledMemoryStats, where the backend gives one

  def describe(self) -> str:
    where = "loaded from the compilation cache" if self.cache_hit else "compiled"
    return f"{where} in {self.seconds:.1f}s"


def without_persistent_cache():
  """JAX's persistent compilation cache off inside, as it was after (a
  config that turns it off, `persistent_cache`). For a compile for hardware
  this host lacks (`tools/aot`): JAX writes such an executable to the cache
  but cannot read it back without a client ("PjRtCompiler must be
  constructed with a Client"), so a second compile of the same step warned
  and compiled again."""
  return persistent_cache({"compilation_cache_dir": "off"})


def compile_step(jitted, *args) -> CompiledStep:
  """`jitted` compiled for `args` (arrays or ShapeDtypeStructs), timed."""
  hits_before = _cache_hits
  start = time.perf_counter()
  executable = jitted.lower(*args).compile()
  seconds = time.perf_counter() - start
  try:
    memory = executable.memory_analysis()
  except Exception:  # noqa: BLE001 (a backend without the analysis)
    memory = None
  hit = _cache_hits > hits_before
  logging.info("step %s in %.2fs", "loaded from the cache" if hit else "compiled", seconds)
  return CompiledStep(executable, seconds, hit, memory)
