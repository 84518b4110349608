"""The platform a program is compiled for: the host's JAX backend, or the
accelerator an ahead-of-time compile names (`tools/aot.py` compiles a TPU
slice's or GPUs' step on a CPU machine). Every choice the code makes by
platform (the attention kernel, the NaN guard's form, the CPU-only
gradients and compiler options) asks `platform()`, so the step compiled
for a target is the step that target's own trainer would compile."""

from __future__ import annotations

import contextlib

import jax

# The platform `compiling_for` set; None: the host's backend.
_target: str | None = None
PLATFORMS = ("cpu", "gpu", "tpu")


def platform() -> str:
  """ "cpu", "gpu" or "tpu": the target being compiled for, else the host's
  default backend."""
  return _target or jax.default_backend()


@contextlib.contextmanager
def compiling_for(name: str):
  """Within the block, `platform()` is `name`: trace and lower there. JAX's
  caches of traced functions are cleared on entry and exit, so nothing
  traced for one platform is reused for another."""
  global _target
  if name not in PLATFORMS:
    raise ValueError(f"platform {name!r}: one of {PLATFORMS}")
  previous = _target
  jax.clear_caches()
  _target = name
  try:
    yield
  finally:
    _target = previous
    jax.clear_caches()
