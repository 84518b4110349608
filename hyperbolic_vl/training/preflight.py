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


def _meminfo_bytes(field: str) -> int | None:
  """A field of /proc/meminfo ("MemAvailable"), in bytes; None off Linux."""
  try:
    with open("/proc/meminfo") as f:
      for line in f:
        name, _, value = line.partition(":")
        if name == field:
          return int(value.split()[0]) * 1024  # given in kB
  except (OSError, ValueError, IndexError):
    return None
  return None


def _own_resident_bytes() -> int:
  try:
    with open("/proc/self/statm") as f:
      return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
  except (OSError, ValueError, IndexError):
    return 0


def device_memory() -> tuple[int, str] | None:
  """(bytes, where they are: "the device has {} GiB") of one local device: the
  accelerator's limit; on CPU the machine's memory this process can have
  now (what is free plus what it holds already: other programs share it),
  split between its local devices."""
  devices = jax.local_devices()
  try:
    stats = devices[0].memory_stats()
  except Exception:  # noqa: BLE001
    stats = None
  if stats and stats.get("bytes_limit"):
    return int(stats["bytes_limit"]), "the device has {:.1f} GiB"
  try:
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
  except (ValueError, OSError):
    return None
  free = _meminfo_bytes("MemAvailable")
  if free is not None:
    total = min(total, free + _own_resident_bytes())
  return total // max(len(devices), 1), "the machine has {:.1f} GiB free"


def memory_line(
  config, memory, num_devices: int, gradient_bytes: int = 0
) -> tuple[str | None, str | None]:
  """(the memory line, the refusal) of a compiled step's memory analysis:
  the refusal (one line with the levers) when the step needs more than the
  device has. `gradient_bytes`: a device's share of the gradients, the part
  of the temporaries that no lever on the rows shrinks."""
  if memory is None:
    return None, None
  arguments = int(memory.argument_size_in_bytes)
  temporary = int(memory.temp_size_in_bytes)
  outputs = int(memory.output_size_in_bytes) - int(memory.alias_size_in_bytes)
  needed = arguments + temporary + max(outputs, 0)
  device = device_memory()
  if device is None:
    return f"Memory per device: the step needs {needed / GIB:.2f} GiB", None
  available, where = device
  has = where.format(available / GIB)
  line = f"Memory per device: the step needs {needed / GIB:.2f} GiB; {has}"
  if needed <= available:
    return line, None
  # What each lever leaves, from the analysis's parts: the activations
  # (the temporaries but the gradients) shrink with the rows a device holds
  # at once, the arguments (params, optimizer state, batch) with fsdp.
  # First-order figures: the compiled step with the lever says the exact one.
  per_device = int(config.input.batch_size) // num_devices
  fixed = arguments + min(gradient_bytes, temporary)
  activations = temporary - min(gradient_bytes, temporary)
  fits = lambda rows_divisor: fixed + activations / rows_divisor <= available
  about = lambda rows_divisor: f"about {(fixed + activations / rows_divisor) / GIB:.1f} GiB"
  # Powers of two up to one row per micro-batch: the smallest K that fits
  # (the batch, its loss and gradient stay those of the config). A lever
  # already set is not named again: K multiplies the accumulation in use.
  accumulation = int(config.get("optim", {}).get("accumulation_steps", 1) or 1)
  rows = per_device // max(accumulation, 1)  # the rows the analysed step holds at once
  divisors = [2**i for i in range(1, rows.bit_length()) if 2**i <= rows]
  levers = []
  for k in divisors:
    if rows % k == 0 and fits(k):
      levers.append(f"optim.accumulation_steps={accumulation * k} ({about(k)})")
      break
  model = config.get("model", {})
  if (model.get("image_remat"), model.get("text_remat")) != ("full", "full"):
    levers.append(
      f"model.image_remat=full and model.text_remat=full (activations kept per block: {about(4)})"
    )
  if num_devices > 1 and int(config.get("mesh", {}).get("fsdp", 1) or 1) < num_devices:
    levers.append(
      f"mesh.fsdp={num_devices} (params and optimizer state split: about "
      f"{((arguments + gradient_bytes) / num_devices + activations) / GIB:.1f} GiB)"
    )
  for k in divisors:
    if fits(k):
      levers.append(f"input.batch_size={int(config.input.batch_size) // k} ({about(k)})")
      break
  if not levers:
    # Not even one row at a time fits: the params, optimizer state and
    # gradients alone are too much for this device.
    return line, (
      f"the step needs {needed / GIB:.1f} GiB per device and {has}; the params, optimizer "
      f"state and gradients alone need about {fixed / GIB:.1f} GiB, more than a lever on the "
      "rows can free: split them over more devices (mesh.fsdp) or use a device with more memory"
    )
  refusal = (
    f"the step needs {needed / GIB:.1f} GiB per device and {has}; to fit, set one of: "
    + "; ".join(levers)
  )
  return line, refusal


def _size(nbytes: int) -> str:
  return f"{nbytes / GIB:.1f} GiB" if nbytes >= GIB / 10 else f"{nbytes / 2**20:.1f} MiB"


def refuse_a_state_that_cannot_fit(state_bytes: int) -> None:
  """Raises StepDoesNotFitError when a device's share of the params, their
  optimizer state and gradients (`state_bytes`) is more than the device has:
  said before any of it is built, since no lever on the batch frees it and a
  CPU machine's kernel would end the process while building it."""
  device = device_memory()
  if device is None or state_bytes <= device[0]:
    return
  available, where = device
  raise StepDoesNotFitError(
    f"the params, optimizer state and gradients alone need {_size(state_bytes)} per device "
    f"and {where.format(available / GIB)}, before any activation: no lever on the "
    "batch frees that; split them over more devices (mesh.fsdp), use a smaller model "
    "variant or a machine with more memory"
  )


def print_lines(lines: list[str]) -> None:
  for line in lines:
    stream = sys.stderr if line.startswith("warning:") else sys.stdout
    print(line, file=stream, flush=True)


class StepDoesNotFitError(errors.ConfigError):
  """The compiled step needs more memory per device than the device has."""
