"""Test session set-up: 8 virtual CPU devices, a session compilation cache,
and the shared helpers of tests/fixtures/ on the import path."""

import os
import sys
import tempfile

# Must happen before jax is imported anywhere: the 1-device vs 8-device tests
# build meshes over these virtual devices.
os.environ["XLA_FLAGS"] = (
  os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
# The tests that compile for TPUs in-process (tools/aot's functions) load
# libtpu in every xdist worker: its machine-wide lock is no worker's to hold
# (python -m hyperbolic_vl.tools.aot sets the same in its main).
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
# Many tests build the same tiny step (train, resume, colab): JAX's persistent
# cache turns every repeat compile into a load. A fresh directory per session
# keeps timings honest and never reuses results across JAX versions; with
# pytest-xdist every worker of one run (and the command-line runs they start,
# which inherit the variable) shares it, so a step compiled by one worker is
# loaded by the other.
# The session's folder also holds the tiny runs that tests share
# (fixtures/shared_runs.py), trained once for all workers. A folder given in
# HVL_TEST_SESSION_DIR is used as it is: .ci/run gives its two pytest runs
# (push tier, then slow tier) one folder, so the slow tier reads the shared
# runs the push tier trained.
_run_id = os.environ.get("PYTEST_XDIST_TESTRUNUID")
if os.environ.get("HVL_TEST_SESSION_DIR"):
  _session = os.environ["HVL_TEST_SESSION_DIR"]
  os.makedirs(_session, exist_ok=True)
elif _run_id:
  _session = os.path.join(tempfile.gettempdir(), f"hvl_test_session_{_run_id}")
  os.makedirs(_session, exist_ok=True)
else:
  _session = tempfile.mkdtemp(prefix="hvl_test_session_")
os.environ["HVL_TEST_SESSION_DIR"] = _session
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(_session, "jax_cache"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")

# The shared helpers (tiny models, float64 references, paths, small configs)
# live in one folder; every test folder imports them by module name.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures"))

import cheap_codegen  # noqa: E402
import compile_meter  # noqa: E402
import pytest  # noqa: E402

# Per-test compile and run seconds when HVL_COMPILE_METER_DIR is set
# (benchmarks/suite_compile_time.py).
pytest_runtest_protocol = compile_meter.pytest_runtest_protocol


@pytest.fixture(scope="session")
def tiny_meru_run() -> str:
  """Workdir of the session's shared tiny MERU run (read it, never change it)."""
  import shared_runs

  return shared_runs.trained_run("meru")


@pytest.fixture(scope="session")
def tiny_clip_run() -> str:
  """Workdir of the session's shared tiny CLIP run (read it, never change it)."""
  import shared_runs

  return shared_runs.trained_run("clip")


def pytest_configure(config):
  """Every test session compiles with XLA's cheap code generation: the tests
  compile hundreds of tiny steps (and the slow tier's command-line runs one
  each) and run each a few times, so LLVM's optimisation passes cost more
  than they save (about 30% of those tests' time here). It changes no
  numerics that the tests pin: XLA's graph passes (fusion, layouts, buffer
  assignment, the FLOP and memory analyses) still run, and float arithmetic
  is not reassociated at any level (the emitters below: see there). The
  optimised code generation a user gets stays tested by the slow tier's
  Quick start run (tests/test_docs.py), which runs README block 1 with
  `cheap_codegen.default_env()`: 1,000 steps, its figures against the README's."""
  del config
  compile_meter.start()
  os.environ.update(cheap_codegen.ENV)  # command-line runs inherit it
  # XLA:CPU's older elemental emitters in place of its fusion emitters:
  # a third less compile time (tests/objectives/test_hmid.py +
  # test_atmg.py: 70 -> 46 CPU s). The same operations in another loop
  # structure; float64 results moved by rounding only (1.7e-15 on a mu ViT),
  # and the 1 vs 8 device identities compile both sides alike. Read when
  # the CPU backend starts, which is after this hook.
  os.environ["XLA_FLAGS"] += " " + cheap_codegen.XLA_FLAG
  import jax

  jax.config.update("jax_disable_most_optimizations", True)
