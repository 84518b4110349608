"""What a run will do, said before it compiles, and whether its step fits
the device: the data source and its size, the global and per-device batch,
the steps and the precision; before anything is built, whether the batch's
own inputs (every image and token row a row carries: box slots, crops,
caption tiers, unsafe counterparts) and the params with their optimizer
state can fit; then, from the compiled step's own memory analysis, the
memory per device it needs against what the device has. Each refusal is one
line naming the levers that would make the run fit."""

from __future__ import annotations

import dataclasses
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


def model_get(config, key: str):
  return config.get("model", {}).get(key)


def memory_line(
  config, memory, num_devices: int, gradient_bytes: int = 0, device=None
) -> tuple[str | None, str | None]:
  """(the memory line, the refusal) of a compiled step's memory analysis:
  the refusal (one line with the levers) when the step needs more than the
  device has. `gradient_bytes`: a device's share of the gradients, the part
  of the temporaries that no lever on the rows shrinks. `device`: (bytes,
  "the device has {} GiB") of a device compiled for ahead of time
  (tools/aot.py); None: this process's (`device_memory`)."""
  if memory is None:
    return None, None
  arguments = int(memory.argument_size_in_bytes)
  temporary = int(memory.temp_size_in_bytes)
  outputs = int(memory.output_size_in_bytes) - int(memory.alias_size_in_bytes)
  needed = arguments + temporary + max(outputs, 0)
  device = device_memory() if device is None else device
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
  # Each lever is named only where its own estimate fits, with that figure.
  # Full remat keeps about one activation in four (a block's inputs);
  # fsdp=N divides the params, optimizer state and gradients by N.
  remat_set = (model_get(config, "image_remat"), model_get(config, "text_remat")) == (
    "full",
    "full",
  )
  fsdp = int(config.get("mesh", {}).get("fsdp", 1) or 1)
  shared = num_devices if num_devices > 1 and fsdp < num_devices else 1

  def estimate(rows_divisor: int = 1, remat: bool = False, split: int = 1) -> float:
    return fixed / split + activations / rows_divisor / (4 if remat else 1)

  about = lambda nbytes: f"about {nbytes / GIB:.1f} GiB"
  # Powers of two up to one row per micro-batch: the smallest K that fits
  # (the batch, its loss and gradient stay those of the config). A lever
  # already set is not named again: K multiplies the accumulation in use.
  accumulation = int(config.get("optim", {}).get("accumulation_steps", 1) or 1)
  rows = per_device // max(accumulation, 1)  # the rows the analysed step holds at once
  divisors = [2**i for i in range(1, rows.bit_length()) if 2**i <= rows]

  def smallest_k(**other) -> int | None:
    return next((k for k in divisors if rows % k == 0 and estimate(k, **other) <= available), None)

  remat_text = "model.image_remat=full and model.text_remat=full"
  levers = []
  k = smallest_k()
  if k is not None:
    levers.append(f"optim.accumulation_steps={accumulation * k} ({about(estimate(k))})")
  if not remat_set and estimate(remat=True) <= available:
    levers.append(f"{remat_text} ({about(estimate(remat=True))})")
  if shared > 1 and estimate(split=shared) <= available:
    levers.append(f"mesh.fsdp={shared} ({about(estimate(split=shared))})")
  batch_k = next((k for k in divisors if estimate(k) <= available), None)
  if batch_k is not None:
    levers.append(
      f"input.batch_size={int(config.input.batch_size) // batch_k} ({about(estimate(batch_k))})"
    )
  if not levers:
    # No single lever is enough: two together, each pair's smallest.
    for name, other in ((remat_text, {"remat": True}), (f"mesh.fsdp={shared}", {"split": shared})):
      if (name == remat_text and remat_set) or (other.get("split") == 1):
        continue
      k = smallest_k(**other)
      if k is not None:
        levers.append(
          f"{name} with optim.accumulation_steps={accumulation * k} ({about(estimate(k, **other))})"
        )
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


# Bytes of one input as the pipelines send it: a uint8 pixel channel, an
# int32 token; and of a pixel channel once the image tower has scaled it to
# [0, 1] in float32 (models/vit.py, models/resnet.py).
_PIXEL_BYTES, _TOKEN_BYTES, _FLOAT_PIXEL_BYTES = 1, 4, 4


def row_bytes(row_inputs, image_size: int, context_length: int) -> tuple[int, int]:
  """(bytes of one batch row's inputs, pixel channels of its images): every
  image a uint8 image_size^2 x 3 array, every token row context_length int32s."""
  pixels = 3 * image_size * image_size
  images = sum(r.count for r in row_inputs if r.kind == "image")
  texts = sum(r.count for r in row_inputs if r.kind == "text")
  return images * pixels * _PIXEL_BYTES + texts * context_length * _TOKEN_BYTES, images * pixels


@dataclasses.dataclass(frozen=True)
class InputMemory:
  """The least memory a run's inputs take, before any activation: on the
  host, the batch being fed and the `input.prefetch_batches` read ahead; on
  the devices, the batch itself and its images in float32 (the image tower
  scales each row's images at once, a micro-batch of rows at a time)."""

  host: int
  device: int  # all local devices together

  @classmethod
  def of(
    cls,
    row_inputs,
    *,
    rows: int,
    image_size: int,
    context_length: int,
    prefetch: int,
    accumulation_steps: int,
  ) -> InputMemory:
    nbytes, pixels = row_bytes(row_inputs, image_size, context_length)
    rows_at_once = rows // max(accumulation_steps, 1)
    return cls(
      host=(1 + prefetch) * rows * nbytes,
      device=rows * nbytes + rows_at_once * pixels * _FLOAT_PIXEL_BYTES,
    )


def _inputs_fit(memory: InputMemory, num_local_devices: int) -> tuple[bool, int, str]:
  """(whether `memory` fits, the bytes compared, the memory they are
  compared with as a phrase): on a CPU host and devices share the machine's
  free memory; an accelerator's own limit holds a device's share."""
  device = device_memory()
  if device is None:
    return True, 0, ""
  available, where = device
  if where.startswith("the machine"):
    total = available * num_local_devices
    needed = memory.host + memory.device
    return needed <= total, needed, where.format(total / GIB)
  needed = memory.device // max(num_local_devices, 1)
  return needed <= available, needed, where.format(available / GIB) + " per device"


def refuse_inputs_that_cannot_fit(
  config, source, settings, *, context_length: int, num_devices: int
) -> None:
  """Raises StepDoesNotFitError, in one line naming the levers, when the
  inputs of the run's batches alone cannot fit (`InputMemory`): said before
  the data iterator or the step is built, since a CPU machine's kernel ends
  a process that builds such a batch with no word (`input.data.max_boxes`
  = 100000 on UNCHA's tiny run wanted over 100 GiB)."""
  processes = jax.process_count()
  local_devices = max(jax.local_device_count(), 1)
  batch = int(config.input.batch_size)
  image_size = int(config.input.get("image_size", 0) or 0)
  prefetch = int(config.input.get("prefetch_batches", 2) or 0)
  accumulation = config.get("optim", {}).get("accumulation_steps", 1)
  accumulation = accumulation if isinstance(accumulation, int) and accumulation >= 1 else 1

  def memory(settings_=settings, batch_=batch, prefetch_=prefetch) -> InputMemory:
    return InputMemory.of(
      source.row_inputs(settings_),
      rows=batch_ // processes,
      image_size=image_size,
      context_length=context_length,
      prefetch=prefetch_,
      accumulation_steps=accumulation,
    )

  fits, needed, has = _inputs_fit(memory(), local_devices)
  if fits:
    return
  about = lambda m: f"inputs about {_size(_inputs_fit(m, local_devices)[1])}"
  row_inputs = source.row_inputs(settings)
  levers = []
  # A setting a count follows (box slots): the largest value whose inputs fit.
  for name in dict.fromkeys(r.setting for r in row_inputs if r.setting):
    with_value = lambda value, name=name: memory(dataclasses.replace(settings, **{name: value}))
    best = _largest_fitting(1, int(getattr(settings, name)) - 1, with_value, local_devices)
    if best is not None:
      levers.append(f"input.data.{name}={_at_most(best)} ({about(with_value(best))})")
  step = num_devices * accumulation  # a batch size the mesh and micro-batches divide
  best = _largest_fitting(1, (batch - 1) // step, lambda k: memory(batch_=k * step), local_devices)
  if best is not None:
    levers.append(f"input.batch_size={_at_most(best * step)} ({about(memory(batch_=best * step))})")
  if prefetch and _inputs_fit(memory(prefetch_=0), local_devices)[0]:
    levers.append(f"input.prefetch_batches=0 ({about(memory(prefetch_=0))})")
  count = lambda kind: sum(r.count for r in row_inputs if r.kind == kind)
  following = ", ".join(
    f"{r.key} {r.count:,} = input.data.{r.setting}" for r in row_inputs if r.setting
  )
  what = (
    f"the batch's inputs alone need {_size(needed)} before any activation: {batch} rows, each "
    f"{count('image'):,} images of {image_size} px and {count('text'):,} token rows of "
    f"{context_length}" + (f" ({following})" if following else "") + f"; {has}"
  )
  if not levers:
    raise StepDoesNotFitError(f"{what}; not even one row fits: use a machine with more memory")
  raise StepDoesNotFitError(
    f"{what}; to fit them (the compiled step's own check follows), set one of: " + "; ".join(levers)
  )


def _at_most(value: int) -> str:
  return f"{value} or less" if value > 1 else f"{value}"


def _largest_fitting(low: int, high: int, memory_of, num_local_devices: int) -> int | None:
  """The largest v in [low, high] whose `memory_of(v)` fits (memory grows with v)."""
  if high < low or not _inputs_fit(memory_of(low), num_local_devices)[0]:
    return None
  while low < high:
    middle = (low + high + 1) // 2
    if _inputs_fit(memory_of(middle), num_local_devices)[0]:
      low = middle
    else:
      high = middle - 1
  return low


def print_lines(lines: list[str]) -> None:
  for line in lines:
    stream = sys.stderr if line.startswith("warning:") else sys.stdout
    print(line, file=stream, flush=True)


class StepDoesNotFitError(errors.ConfigError):
  """The compiled step needs more memory per device than the device has."""
