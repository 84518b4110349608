"""The one-device step all-reduces no gradient.

Params enter the step's shard_map replicated on a multi-device mesh, and
their gradient is summed over the devices on the way out. On one device that
sum is an all-reduce that only copies every gradient (55-80 ms of a ViT-S
CPU step), so there they enter split over the one-device data axis
(`sharding.step_param_specs`). The values are the same either way: the objectives'
1 device == 8 devices identities (tests/objectives) compare the two paths.
"""

import math
import re

from configs import meru as meru_config
from hyperbolic_vl.models import text as text_lib
from hyperbolic_vl.tools import step_throughput as benchmark


def all_reduce_element_counts(hlo_text: str) -> list[int]:
  """Element count of every operand of every all-reduce in compiled HLO."""
  counts = []
  for line in hlo_text.splitlines():
    match = re.match(r"\s*(?:ROOT )?%?[\w.\-]+ = (.*?) all-reduce(?:-start)?\(", line)
    if match:
      for dims in re.findall(r"\w+\[([\d,]*)\]", match.group(1)):
        counts.append(math.prod(int(d) for d in dims.split(",") if d))
  return counts


def compiled_tiny_step_text(num_devices: int) -> str:
  # Batch 16 on one device: the step test_step_throughput.py compiles too,
  # a load from the session's compilation cache.
  config = meru_config.get_config("tiny")
  with config.unlocked():
    config.input.batch_size = 16
    config.num_devices = num_devices
  compiled, *_ = benchmark.compile_step(config)
  return compiled.as_text()


def test_one_device_step_all_reduces_scalars_only():
  counts = all_reduce_element_counts(compiled_tiny_step_text(1))
  # The loss's and metrics' means and the scalar params' gradients remain.
  assert counts and max(counts) == 1


def test_two_device_step_all_reduces_every_gradient():
  # The contrast that shows the parser finds gradient all-reduces: the
  # text tower's token embedding (vocab x width) is among them.
  config = meru_config.get_config("tiny")
  width = text_lib.TEXT_SIZES[config.model.text_variant]["width"]
  embedding = config.input.tokenizer.vocab_size * width
  counts = all_reduce_element_counts(compiled_tiny_step_text(2))
  assert max(counts) >= embedding
