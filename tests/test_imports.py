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
