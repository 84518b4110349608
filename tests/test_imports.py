"""The training step and the benchmark import neither TensorFlow nor
TensorBoard, and a run's metrics reach TensorBoard without TensorFlow.

A GPU machine may have jax, flax, optax and orbax but no TensorFlow wheels:
the step must import and log there (metrics.jsonl without TensorBoard). And
importing TensorFlow took 4.8 s of every command's start-up: the event file
is written with tensorboard's protos alone. Run in a fresh interpreter so
modules imported by other tests do not count.
"""

import json
import subprocess
import sys
import textwrap

_CHECK = textwrap.dedent(
  """
  import json, sys, tempfile
  # An import of any of these now raises ImportError, as on a machine
  # without them.
  for name in ("tensorflow", "tensorflow_datasets", "tensorboard"):
    sys.modules[name] = None
  import hyperbolic_vl.tools.step_throughput
  import hyperbolic_vl.training.loop
  from hyperbolic_vl.runs import metrics_io
  workdir = tempfile.mkdtemp()
  writer = metrics_io.MetricsWriter(workdir)
  writer.write(3, {"train/loss": 1.5})
  writer.close()
  assert writer.writer is None
  print(json.dumps(metrics_io.read_metrics(workdir)))
  """
)


def test_step_and_benchmark_import_without_tensorflow_or_tensorboard():
  result = subprocess.run(
    [sys.executable, "-c", _CHECK], capture_output=True, text=True, timeout=300
  )
  assert result.returncode == 0, result.stderr[-3000:]
  assert result.stdout.strip().splitlines()[-1] == '[{"step": 3, "train/loss": 1.5}]'


_EVENT_FILE_CHECK = textwrap.dedent(
  """
  import glob, json, struct, sys, tempfile
  from hyperbolic_vl.runs import metrics_io
  workdir = tempfile.mkdtemp()
  writer = metrics_io.MetricsWriter(workdir)
  writer.write(3, {"train/loss": 1.5, "train/curv": 0.25})
  writer.write(7, {"train/loss": float("nan")})
  tensorflow_imported = "tensorflow" in sys.modules
  # Read back as TensorBoard does, by the record framing: length, its masked
  # CRC, the Event proto, the proto's masked CRC.
  from tensorboard.compat.proto import event_pb2
  from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c
  events = []
  (path,) = glob.glob(workdir + "/events.out.tfevents.*")
  data = open(path, "rb").read()
  while data:
    (length,) = struct.unpack("<Q", data[:8])
    assert struct.unpack("<I", data[8:12])[0] == masked_crc32c(data[:8])
    body = data[12 : 12 + length]
    assert struct.unpack("<I", data[12 + length : 16 + length])[0] == masked_crc32c(body)
    event = event_pb2.Event.FromString(body)
    events.append(
      [event.file_version, event.step, {v.tag: str(v.simple_value) for v in event.summary.value}]
    )
    data = data[16 + length :]
  writer.close()
  print(json.dumps([tensorflow_imported, events]))
  """
)


def test_event_file_holds_the_logged_scalars_without_importing_tensorflow():
  """Written before close (flushed per step: a killed run loses nothing
  logged), framed as TensorBoard reads it, and no TensorFlow imported."""
  result = subprocess.run(
    [sys.executable, "-c", _EVENT_FILE_CHECK], capture_output=True, text=True, timeout=300
  )
  assert result.returncode == 0, result.stderr[-3000:]
  tensorflow_imported, events = json.loads(result.stdout.strip().splitlines()[-1])
  assert not tensorflow_imported
  assert events == [
    ["brain.Event:2", 0, {}],
    ["", 3, {"train/loss": "1.5", "train/curv": "0.25"}],
    ["", 7, {"train/loss": "nan"}],
  ]


_ENVIRONMENT_CHECK = textwrap.dedent(
  """
  import importlib, json, os, pkgutil, sys
  import jax  # JAX's own import sets what it sets (TPU_SKIP_MDS_QUERY without TPUs)
  from absl import flags

  def settings():
    return {name: repr(jax.config.values[name]) for name in sorted(jax.config.values)}

  names = sys.argv[1:]
  if not names:
    import hyperbolic_vl
    names = [m.name for m in pkgutil.walk_packages(hyperbolic_vl.__path__, "hyperbolic_vl.")]
  environ, jax_settings = dict(os.environ), settings()
  alone = []  # commands that define a flag another command defined: each in its own process
  imported = 0
  for name in names:
    try:
      importlib.import_module(name)
      imported += 1
    except flags.DuplicateFlagError:
      alone.append(name)
  changed = sorted(k for k in set(environ) | set(os.environ) if environ.get(k) != os.environ.get(k))
  now = settings()
  moved = sorted(k for k in now if now[k] != jax_settings[k])
  print(json.dumps({"env": changed, "jax": moved, "alone": alone, "imported": imported}))
  """
)


def _import_and_compare(names: list[str]) -> subprocess.Popen:
  return subprocess.Popen(
    [sys.executable, "-c", _ENVIRONMENT_CHECK, *names],
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
  )


def _outcome(process: subprocess.Popen) -> dict:
  out, err = process.communicate(timeout=300)
  assert process.returncode == 0, err[-3000:]
  return json.loads(out.strip().splitlines()[-1])


def test_importing_any_module_changes_no_environment_variable_or_jax_setting():
  """Every module of the package imported (a notebook's `import`): the
  process's environment and JAX's settings are as they were. A command sets
  what it needs when it runs (tools/aot: the CPU platform and libtpu's lock
  in its main; the C++ log level in each command's start-up)."""
  first = _outcome(_import_and_compare([]))
  # The command modules whose flags clash with another's: each alone, at once.
  rest = [_outcome(p) for p in [_import_and_compare([name]) for name in first["alone"]]]
  assert first["imported"] > 100  # the whole package, but the clashing commands
  for outcome in [first, *rest]:
    assert outcome["env"] == [] and outcome["jax"] == [], outcome
  assert all(outcome["imported"] == 1 for outcome in rest)
