"""What a run will do, said before it compiles, and whether its step fits
the device: the data source and its size, the global and per-device batch,
the steps and the precision; then, from the compiled step's own memory
analysis, the memory per device it needs against what the device has, and
when it does not fit, one line naming the levers that would make it fit."""

from __future__ import annotations

import os
import sys

import jax

from hyperbolic_vl import errors
from hyperbolic_vl.data import registry as data_registry

GIB = 2**30
# The synthetic sources: a paper-size model trained on them gives no paper figure.
SYNTHETIC_SOURCES = ("world", "world_boxes")
PAPER_IMAGE_VARIANTS = ("S/16", "B/16", "B/32", "L/16", "L/14")


def data_size(input_config) -> int | None:
  """Training rows of the run's source; None when it cannot count them."""
  try:
    source, _, settings = data_registry.read_config(input_config)
    return int(source.num_train_examples(settings))
  except Exception:  # noqa: BLE001 (a source that cannot count: size unknown)
    return None


def describe(config, num_devices: int, start_step: int) -> list[str]:
  """The plan's lines (and warnings, prefixed "warning:")."""
  batch = int(config.input.batch_size)
  source = config.input.data.get("name", "?")
  rows = data_size(config.input)
  size = f"{rows:,} training examples" if rows is not None else "size not known ahead"
  steps = int(config.total_steps)
  resume = f" (from step {start_step})" if start_step else ""
  dtype = config.model.get("dtype", "float32")
  lines = [
    f"Plan: data {source!r} ({size}); batch {batch} = {batch // num_devices} per device x "
    f"{num_devices} device(s); {steps} steps{resume}; compute in {dtype}"
  ]
  if rows is not None and batch > rows:
    lines.append(
      f"warning: the batch ({batch}) is larger than the training data ({rows} examples): "
      "every batch repeats examples; a smaller input.batch_size fits this data"
    )
  if source in SYNTHETIC_SOURCES and config.model.get("image_variant") in PAPER_IMAGE_VARIANTS:
    lines.append(
      f"warning: a paper-size model (model.image_variant={config.model.image_variant!r}) "
      f"on the synthetic {source!r} data: no paper figure comes from this run; give "
      "real data (e.g. the config argument data=image_text_csv and input.data.path)"
    )
  return lines


def device_memory_bytes() -> int | None:
  """Memory of one local device: the accelerator's limit, or on CPU the
  machine's memory shared by its local devices."""
  device = jax.local_devices()[0]
  try:
    stats = device.memory_stats()
  except Exception:  # noqa: BLE001
    stats = None
  if stats and stats.get("bytes_limit"):
    return int(stats["bytes_limit"])
  try:
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
  except (ValueError, OSError):
    return None
  return total // max(len(jax.local_devices()), 1)


def memory_line(config, memory, num_devices: int) -> tuple[str | None, str | None]:
  """(the memory line, the refusal) of a compiled step's memory analysis:
  the refusal (one line with the levers) when the step needs more than the
  device has."""
  if memory is None:
    return None, None
  arguments = int(memory.argument_size_in_bytes)
  temporary = int(memory.temp_size_in_bytes)
  outputs = int(memory.output_size_in_bytes) - int(memory.alias_size_in_bytes)
  needed = arguments + temporary + max(outputs, 0)
  available = device_memory_bytes()
  if available is None:
    return f"Memory per device: the step needs {needed / GIB:.2f} GiB", None
  line = (
    f"Memory per device: the step needs {needed / GIB:.2f} GiB of the device's "
    f"{available / GIB:.1f} GiB"
  )
  if needed <= available:
    return line, None
  # What each lever leaves, from the analysis's parts: the activations
  # (temporaries) shrink with the rows a device holds at once, the
  # arguments (params, optimizer state, batch) with fsdp. First-order
  # figures: the compiled step with the lever says the exact one.
  per_device = int(config.input.batch_size) // num_devices
  levers = []
  for k in (2, 4, 8, 16, 32):
    if per_device % k == 0 and arguments + temporary / k <= available:
      levers.append(
        f"optim.accumulation_steps={k} (about {(arguments + temporary / k) / GIB:.1f} GiB)"
      )
      break
  levers.append(
    f"model.image_remat=full and model.text_remat=full (activations kept per block: about "
    f"{(arguments + temporary / 4) / GIB:.1f} GiB)"
  )
  if num_devices > 1:
    levers.append(
      f"mesh.fsdp={num_devices} (params and optimizer state split: about "
      f"{(arguments / num_devices + temporary) / GIB:.1f} GiB)"
    )
  for k in (2, 4, 8, 16, 32, 64, 128, 256):
    if per_device // k >= 1 and arguments + temporary / k <= available:
      levers.append(
        f"input.batch_size={int(config.input.batch_size) // k} (about "
        f"{(arguments + temporary / k) / GIB:.1f} GiB)"
      )
      break
  refusal = (
    f"the step needs {needed / GIB:.1f} GiB per device and the device has "
    f"{available / GIB:.1f} GiB; to fit, set one of: " + "; ".join(levers)
  )
  return line, refusal


def print_lines(lines: list[str]) -> None:
  for line in lines:
    stream = sys.stderr if line.startswith("warning:") else sys.stdout
    print(line, file=stream, flush=True)


class StepDoesNotFitError(errors.ConfigError):
  """The compiled step needs more memory per device than the device has."""
