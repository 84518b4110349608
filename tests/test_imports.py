"""The training step and the benchmark import neither TensorFlow nor clu.

A GPU machine may have jax, flax, optax and orbax but no TensorFlow wheels:
the step must import and log there (metrics.jsonl without TensorBoard). Run in
a fresh interpreter so modules imported by other tests do not count.
"""

import subprocess
import sys
import textwrap

_CHECK = textwrap.dedent(
  """
  import json, sys, tempfile
  # An import of any of these now raises ImportError, as on a machine
  # without them.
  for name in ("tensorflow", "clu", "tensorflow_datasets", "tensorboard"):
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


def test_step_and_benchmark_import_without_tensorflow_or_clu():
  result = subprocess.run(
    [sys.executable, "-c", _CHECK], capture_output=True, text=True, timeout=300
  )
  assert result.returncode == 0, result.stderr[-3000:]
  assert result.stdout.strip().splitlines()[-1] == '[{"step": 3, "train/loss": 1.5}]'
