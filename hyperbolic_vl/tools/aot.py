"""A run's train step compiled ahead of time for hardware that is not here:
a TPU slice or GPUs, from a CPU machine, with the memory, FLOPs,
collectives and a lower bound on the step time per chip.

  python -m hyperbolic_vl.tools.aot --config=configs/meru.py:vit_l --topology=v5p:2x2x2
  python -m hyperbolic_vl.tools.aot --config=configs/meru.py:vit_b --topology=h100:8 \
      --config.mesh.fsdp=8 --json=/tmp/meru_h100.json

The step is the trainer's own (`training.step.make_run_step` from the
settings `training.setup` derives: mesh, fsdp, locks, micro-batches, the
objective's loss), compiled on the abstract train state (`jax.eval_shape`
of the trainer's `init_state`: nothing is allocated, so `vit_l` costs no
host memory) and an abstract batch of the config's shapes, with every
choice the code makes by platform (attention kernel, NaN guard, compiler
options) made for the target (`compile_target`). Topologies and the
chips' data-sheet figures: `tools/aot_targets.py`.

Exit codes: 0 the step fits the chip's memory; 2 it does not (one line on
stderr with the levers, as the trainer's preflight names them), or an
unknown topology, or the backend's package is not installed (the `aot`
extra). `--json=FILE` writes every figure.
"""

from __future__ import annotations

import collections
import copy
import dataclasses
import json
import math
import os
import re
import sys
import time
import types

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # the host opens no accelerator
# libtpu takes a machine-wide lock file for the TPU it drives; this process
# drives none and must not wait on (or refuse beside) another one's lock.
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from absl import app, flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from hyperbolic_vl import compile_target, errors  # noqa: E402
from hyperbolic_vl import objectives as objectives_lib  # noqa: E402
from hyperbolic_vl.data import tokenizer as tokenizer_lib  # noqa: E402
from hyperbolic_vl.models import registry as models_registry  # noqa: E402
from hyperbolic_vl.tools import aot_targets, flops, step_throughput  # noqa: E402
from hyperbolic_vl.training import (  # noqa: E402
  compilation,
  preflight,
  run_context,
  setup,
  sharding,
)
from hyperbolic_vl.training import step as step_lib  # noqa: E402

# The command's own flags, apart from absl's global ones, where
# tools.step_throughput (whose synthetic batch this tool shapes) defines
# --config and --attention for its own command.
FLAGS = flags.FlagValues()
config_flags.DEFINE_config_file(
  "config", None, "Config file, e.g. configs/meru.py:vit_l.", flag_values=FLAGS
)
flags.DEFINE_string("topology", None, aot_targets.VALID_NAMES, flag_values=FLAGS)
flags.DEFINE_string("json", None, "Write every figure to this JSON file.", flag_values=FLAGS)
flags.DEFINE_enum(
  "attention",
  None,
  ["xla", "cudnn"],
  "Sets model.attention_implementation (both towers); default: the config's (cuDNN's fused "
  "attention on GPUs where it applies).",
  flag_values=FLAGS,
)

GIB = 2**30
COLLECTIVES = ("all-gather", "all-reduce", "reduce-scatter", "collective-permute", "all-to-all")
_DTYPE_BYTES = {
  "pred": 1,
  "s8": 1,
  "u8": 1,
  "s16": 2,
  "u16": 2,
  "f16": 2,
  "bf16": 2,
  "s32": 4,
  "u32": 4,
  "f32": 4,
  "s64": 8,
  "u64": 8,
  "f64": 8,
  "c64": 8,
  "c128": 16,
}


# ---------------------------------------------------------------------------
# The step, compiled for the target.
# ---------------------------------------------------------------------------


def prepared_config(config):
  """`config` as a benchmark of its step runs it (step_throughput's rules):
  a run sized in epochs gets placeholder lengths, a recipe that starts from
  another run starts from random weights, HMID-Net without a teacher workdir
  gets a random teacher of `objective.teacher_model`'s size."""
  config = step_throughput._placeholder_run_length(copy.deepcopy(config))
  with config.unlocked():
    if "init_from" in config and config.init_from is None:
      config.init_from = ""
  step_throughput._set_mask_ratio(config, None)
  return config


def run_tokenizer(config):
  """The run's tokenizer, built as the trainer builds it: an objective may
  encode prompts at start-up (Radial), and the vocabulary sizes the model."""
  return tokenizer_lib.get_tokenizer(config.input.tokenizer)


def abstract_initial_state(config, objective, tokenizer) -> setup.InitialState:
  """The trainer's step-0 `InitialState` with its state abstract: the
  trainer's own `setup.init_state` under `jax.eval_shape`, so its shapes,
  dtypes and tree are the run's and nothing is allocated. The model and the
  objective's context come back built on the abstract module (the traced
  ones hold the trace's values)."""
  module = models_registry.abstract_model(config, tokenizer.vocab_size, tokenizer.context_length)
  model_def = models_registry.ModelDef.from_module(module)[0]
  # Built here, outside the trace: a teacher's weights (HMID-Net's) are
  # concrete, made or restored as the trainer does.
  context = run_context.build(config, objective, tokenizer, model_def.module)
  built = {}

  def init():
    initial = setup.init_state(config, objective, tokenizer, context=context)
    built["initial"] = initial
    return initial.state

  state = jax.eval_shape(init)
  return built["initial"]._replace(model_def=model_def, state=state)


def abstract_batch(config, tokenizer, objective, batch_sharding) -> dict:
  """ShapeDtypeStructs of a global batch of the config's shapes: the keys,
  dtypes and row shapes of step_throughput's synthetic batch (one row
  built), placed as the trainer places batches."""
  row = step_throughput.synthetic_batch(config, tokenizer, 1, objective.tower_inputs)
  batch = int(config.input.batch_size)
  return {
    key: jax.ShapeDtypeStruct((batch, *value.shape[1:]), value.dtype, sharding=batch_sharding)
    for key, value in row.items()
  }


def placed(tree, shardings):
  return jax.tree.map(
    lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings
  )


def target_compiler_options(target: aot_targets.Target) -> dict:
  """What a compile without the hardware changes: on GPUs, XLA's Triton
  GEMMs off. A GPU's own compile autotunes between Triton's and cuBLAS's
  matrix products; without a GPU nothing is timed, and XLA:GPU (jaxlib
  0.10.2) refused its default tiling of the tiny model's attention output
  product ("Couldn't find output tile sizes", f32[1088,64]). cuBLAS's
  products, among those a GPU run chooses from, compile for every shape."""
  return {"xla_gpu_enable_triton_gemm": False} if target.platform == "gpu" else {}


@dataclasses.dataclass
class StepForTarget:
  """The run's step for a target, jitted as the loop jits it, and its
  abstract arguments (state and batch, with the trainer's shardings)."""

  target: aot_targets.Target
  config: object  # as `prepared_config` left it
  mesh: jax.sharding.Mesh
  jitted: object
  state: dict
  batch: dict


def step_for(config, target: aot_targets.Target) -> StepForTarget:
  """The run's train step and its abstract arguments for `target`, traced
  as the target's trainer would (nothing compiled, nothing allocated)."""
  config = prepared_config(config)
  objective = objectives_lib.get(config.objective)
  tokenizer = run_tokenizer(config)
  mesh = sharding.make_mesh(
    config.get("num_devices"), sharding.mesh_settings(config).fsdp, devices=target.devices
  )
  if config.input.batch_size % mesh.devices.size:
    raise errors.ConfigError(
      f"input.batch_size={config.input.batch_size} must be divisible by the number of "
      f"chips of {target.name} ({mesh.devices.size})"
    )
  initial = abstract_initial_state(config, objective, tokenizer)
  settings = setup.derive_step_settings(config, initial.model_def, mesh, initial.trainable)
  state = placed(
    initial.state, sharding.state_shardings(initial.state, mesh, settings.fsdp_min_elements)
  )
  batch = abstract_batch(config, tokenizer, objective, sharding.batch_sharding(mesh))
  with compile_target.compiling_for(target.platform):
    # As the loop jits it (training/loop.py); the options are the target's.
    jitted = jax.jit(
      step_lib.make_run_step(
        initial.model_def, objective, initial.tx, initial.schedule, settings, initial.context
      ),
      donate_argnums=(0,),
      compiler_options={**compilation.step_compiler_options(), **target_compiler_options(target)},
    )
  return StepForTarget(target, config, mesh, jitted, state, batch)


@dataclasses.dataclass
class CompiledForTarget:
  target: aot_targets.Target
  config: object
  state: dict  # abstract, with the trainer's shardings
  compiled: compilation.CompiledStep  # executable None when XLA refused it
  mesh: jax.sharding.Mesh
  xla_refusal: str | None = None  # XLA's own "does not fit" line


_UNITS = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def refused_for_memory(message: str, step: StepForTarget):
  """(memory analysis, XLA's line) when XLA refused to compile the step
  because its temporaries exceed the chip's memory (XLA:TPU checks at
  compile time): the arguments as the state's and batch's shards, the
  temporaries as XLA says. None for any other error."""
  if not message.startswith("RESOURCE_EXHAUSTED"):
    return None
  found = re.search(r"temporaries \(([\d.]+)([KMGT])\)", message)
  if found is None:
    return None
  temporaries = int(float(found.group(1)) * _UNITS[found.group(2)])
  memory = types.SimpleNamespace(
    argument_size_in_bytes=shard_bytes(step.state) + shard_bytes(step.batch),
    temp_size_in_bytes=temporaries,
    output_size_in_bytes=0,
    alias_size_in_bytes=0,
  )
  return memory, message.splitlines()[0]


def compile_for(config, target: aot_targets.Target) -> CompiledForTarget:
  """The run's train step compiled for `target` (nothing run, nothing allocated)."""
  step = step_for(config, target)
  # Traced and lowered inside: every choice by platform is the target's.
  with compile_target.compiling_for(target.platform):
    start = time.perf_counter()
    try:
      compiled = compilation.compile_step(step.jitted, step.state, step.batch)
    except KeyError as error:
      # The abstract batch holds the objective's tower inputs; a loss that
      # reads other keys of its source's rows (HCL's two views, Radial's
      # tiers) needs them built here too.
      raise errors.ConfigError(
        f"objective {step.config.objective.name!r} reads batch key {error} beyond its tower "
        f"inputs ({sorted(step.batch)}), which tools/aot does not build yet"
      ) from None
    except jax.errors.JaxRuntimeError as error:
      refused = refused_for_memory(str(error), step)
      if refused is not None:
        memory, message = refused
        compiled = compilation.CompiledStep(None, time.perf_counter() - start, False, memory)
        return CompiledForTarget(
          target, step.config, step.state, compiled, step.mesh, xla_refusal=message
        )
      # What the chip cannot run (a V100's bfloat16 products) is the
      # config's to change; anything else is a bug and keeps its traceback.
      if not str(error).startswith(("UNIMPLEMENTED", "INVALID_ARGUMENT: Unsupported")):
        raise
      raise errors.ConfigError(
        f"XLA cannot compile this step for {target.name} ({target.chip.name}): "
        f"{str(error).splitlines()[0]}"
        + (
          "; its towers compute in bfloat16: try --config.model.dtype=float16"
          if "BF16" in str(error)
          else ""
        )
      ) from None
  return CompiledForTarget(target, step.config, step.state, compiled, step.mesh)


# ---------------------------------------------------------------------------
# What the compiled program says.
# ---------------------------------------------------------------------------


def shard_bytes(tree) -> int:
  """Bytes of `tree`'s leaves one chip holds, as their shardings divide them."""
  total = 0
  for leaf in jax.tree.leaves(tree):
    shape = leaf.sharding.shard_shape(leaf.shape) if leaf.sharding is not None else leaf.shape
    total += math.prod(shape) * jnp.dtype(leaf.dtype).itemsize
  return total


def _shape_bytes(text: str) -> int:
  """Bytes of every array shape written in `text` ("f32[8,128]{1,0} ...")."""
  total = 0
  for dtype, dims in re.findall(r"\b([a-z]+\d*)\[([\d,]*)\]", text):
    if dtype in _DTYPE_BYTES:
      total += math.prod(int(d) for d in dims.split(",") if d) * _DTYPE_BYTES[dtype]
  return total


def _replica_groups(line: str, num_chips: int) -> list[list[int]]:
  """The device groups of a collective: explicit {{0,1},{2,3}} lists or the
  iota form [G,N]<=[dims]T(perm); all chips when none are given."""
  iota = re.search(r"replica_groups=\[([\d,]+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?", line)
  if iota:
    shape = [int(d) for d in iota.group(1).split(",")]
    dims = [int(d) for d in iota.group(2).split(",")]
    ids = np.arange(math.prod(dims)).reshape(dims)
    if iota.group(3):
      ids = ids.transpose([int(p) for p in iota.group(3).split(",")])
    return ids.reshape(-1, shape[-1]).tolist()
  explicit = re.search(r"replica_groups=\{(\{[\d,]*\}(?:,\{[\d,]*\})*)\}", line)
  if explicit:
    groups = re.findall(r"\{([\d,]*)\}", explicit.group(1))
    groups = [[int(i) for i in g.split(",") if i] for g in groups]
    if groups and groups[0]:
      return groups
  pairs = re.findall(r"\{(\d+),(\d+)\}", line.partition("source_target_pairs=")[2][:2000])
  if pairs:
    return [[int(a), int(b)] for a, b in pairs]
  return [list(range(num_chips))]


def _top_level_parts(text: str) -> list[str]:
  """The comma-separated parts of a tuple type "(A, (B, C))" at its top level."""
  inner = text.strip()[1:-1]
  parts, depth, begin = [], 0, 0
  for i, ch in enumerate(inner):
    depth += ch in "({["
    depth -= ch in ")}]"
    if ch == "," and depth == 0:
      parts.append(inner[begin:i])
      begin = i + 1
  parts.append(inner[begin:])
  return parts


def _buffer_bytes(kind: str, result_type: str, started: bool, n: int) -> int:
  """Bytes of the whole buffer a collective reduces or gathers: an
  all-gather's output, a reduce-scatter's input, an all-reduce's,
  all-to-all's or permute's operand. A `-start` op's type is (inputs,
  outputs) for gathers and scatters (GPU); a plain op's is its output."""
  if started and kind in ("all-gather", "reduce-scatter") and result_type.startswith("(("):
    inputs, outputs = _top_level_parts(result_type)[:2]
    return _shape_bytes(outputs if kind == "all-gather" else inputs)
  if started and kind == "collective-permute" and result_type.startswith("("):
    return _shape_bytes(_top_level_parts(result_type)[0])
  if kind == "reduce-scatter":
    return _shape_bytes(result_type) * n
  return _shape_bytes(result_type)


def _stack_files(hlo: str) -> dict[int, list[str]]:
  """The source files of each stack frame id XLA's metadata names, the
  innermost first (the FileNames / FileLocations / StackFrames tables at the
  end of the program's text)."""
  tables, table = collections.defaultdict(dict), None
  for line in hlo.splitlines():
    if line in ("FileNames", "FunctionNames", "FileLocations", "StackFrames"):
      table = line
      continue
    if table is None or not line or not line[0].isdigit():
      continue
    key, _, value = line.partition(" ")
    tables[table][int(key)] = value
  files = {k: v.strip('"') for k, v in tables["FileNames"].items()}
  location_file = {}
  for key, value in tables["FileLocations"].items():
    found = re.search(r"file_name_id=(\d+)", value)
    location_file[key] = files.get(int(found.group(1)), "") if found else ""
  frames = {}
  for key, value in tables["StackFrames"].items():
    location = re.search(r"file_location_id=(\d+)", value)
    parent = re.search(r"parent_frame_id=(\d+)", value)
    frames[key] = (
      location_file.get(int(location.group(1)), "") if location else "",
      int(parent.group(1)) if parent else 0,
    )
  chains = {}
  for key in frames:
    chain, frame, seen = [], key, set()
    while frame in frames and frame not in seen:
      seen.add(frame)
      chain.append(frames[frame][0])
      frame = frames[frame][1]
    chains[key] = chain
  return chains


def _part_of_step(kind: str, line: str, stack_files: dict[int, list[str]]) -> str:
  """Which part of the step a collective belongs to: the innermost file of
  this package on its stack (XLA's metadata), forward or backward by its op
  name. A collective XLA combined from several keeps no metadata."""
  op_name = re.search(r'op_name="([^"]*)"', line)
  combined = re.match(r"^\s*(?:ROOT\s+)?%?[\w.\-]+\s*=\s*\(", line) and "-start" not in line
  if op_name is None or (combined and kind == "all-reduce"):
    return "combined by XLA"
  backward = "transpose(" in op_name.group(1)
  frame = re.search(r"stack_frame_id=(\d+)", line)
  chain = stack_files.get(int(frame.group(1)), []) if frame else []
  source = next((f for f in chain if "/hyperbolic_vl/" in f), "")
  if source.endswith("training/sharding.py"):
    if kind == "all-gather" and not backward:
      return "fsdp gathers"
    return "fsdp gradient scatter" if backward else "replicated state"
  if "/objectives/" in source or "/geometry/" in source:
    return "loss columns (backward)" if backward else "loss columns"
  if backward:
    return "gradients"
  if source.endswith("training/step.py"):
    return "loss and metrics"
  if "/models/" in source:
    return "model (batch statistics)"
  return "other"


def _computations(hlo: str):
  """(computation name, its instruction lines) of the program's text."""
  current, lines = None, []
  for line in hlo.splitlines():
    if line and not line.startswith(" ") and line.rstrip().endswith("{"):
      header = re.match(r"^(?:ENTRY\s+)?%?([\w.\-]+)", line)
      current, lines = (header.group(1) if header else None), []
      if line.startswith("ENTRY"):
        current = "ENTRY:" + current
      continue
    if line.startswith("}") and current is not None:
      yield current, lines
      current = None
      continue
    if current is not None:
      lines.append(line)


def _multipliers(computations: dict[str, list[str]]) -> dict[str, int]:
  """How many times per step each computation that holds a collective runs:
  while bodies by their known trip count (1 when XLA does not know it)
  within their callers. A TPU's asynchronous collective appears in its
  start, its overlapping fusion and its done computation: only the start's
  counts (the others get 0)."""
  callers = collections.defaultdict(list)  # callee -> [(caller, times)]
  for name, lines in computations.items():
    for line in lines:
      body = re.search(r"body=%?([\w.\-]+)", line)
      if body:
        trips = re.search(r'"known_trip_count":\{"n":"(\d+)"', line)
        callers[body.group(1)].append((name, int(trips.group(1)) if trips else 1))
      target = re.match(r"\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=", line)
      copies = target is not None and "collective-done" in target.group(1)
      for called in re.findall(r"(?:calls|to_apply)=%?([\w.\-]+)", line):
        callers[called].append((name, 0 if copies else 1))
  times = {}

  def multiplier(name, seen=()):
    if name.startswith("ENTRY:"):
      return 1
    if name.startswith("async_collective_fusion"):
      return 0
    if name in times:
      return times[name]
    if name in seen or not callers.get(name):
      return 1
    value = max(multiplier(caller, (*seen, name)) * n for caller, n in callers[name])
    times[name] = value
    return value

  return {name: multiplier(name) for name in computations}


def collectives(hlo: str, target: aot_targets.Target, devices) -> dict:
  """Per kind of collective in the compiled program: how many run per step,
  the bytes of their buffers and the bytes each chip sends (ring
  algorithms: an all-reduce sends 2 (n-1)/n of its buffer, an all-gather,
  reduce-scatter or all-to-all (n-1)/n, a permute all of it), what of that
  crosses hosts (GPUs), and which part of the step each belongs to."""
  computations = dict(_computations(hlo))
  multipliers = _multipliers(computations)
  stack_files = _stack_files(hlo)
  pattern = re.compile(
    r"^\s*(?:ROOT\s+)?%?[\w.\-]+\s*=\s*(.*?)\s(" + "|".join(COLLECTIVES) + r")(-start)?\("
  )
  kinds = {
    kind: {
      "count": 0,
      "buffer_bytes": 0,
      "sent_bytes": 0,
      "sent_bytes_across_hosts": 0,
      "parts": collections.Counter(),
    }
    for kind in COLLECTIVES
  }
  for name, lines in computations.items():
    times = multipliers.get(name, 1)
    if not times:
      continue
    for line in lines:
      match = pattern.match(line)
      if not match:
        continue
      result_type, kind, started = match.group(1), match.group(2), bool(match.group(3))
      groups = _replica_groups(line, target.num_chips)
      n = max(len(groups[0]), 1)
      buffer = _buffer_bytes(kind, result_type, started, n)
      factor = {"all-reduce": 2 * (n - 1) / n, "collective-permute": 1.0}.get(kind, (n - 1) / n)
      sent = buffer * factor * times
      crosses = False
      if target.gpus_per_host is not None:
        hosts = {devices[i].process_index for i in groups[0] if i < len(devices)}
        crosses = len(hosts) > 1
      entry = kinds[kind]
      entry["count"] += times
      entry["buffer_bytes"] += buffer * times
      entry["sent_bytes"] += sent
      if crosses:
        entry["sent_bytes_across_hosts"] += sent
      entry["parts"][_part_of_step(kind, line, stack_files)] += times
  for entry in kinds.values():
    entry["parts"] = dict(entry["parts"])
  return kinds


# Instructions that move no data of their own.
_NO_TRAFFIC = {
  "parameter",
  "constant",
  "tuple",
  "get-tuple-element",
  "bitcast",
  "after-all",
  "partition-id",
  "replica-id",
  # Loops and calls: their bodies' instructions are counted.
  "while",
  "call",
  "conditional",
}


def hbm_traffic_bytes(hlo: str) -> int:
  """Bytes the program's top-level instructions (the entry computation and
  loop bodies, times their trip counts) read and write: each fusion, kernel
  call and copy's operands and output. Every such instruction reads its
  operands from and writes its output to device memory unless a cache
  holds them, so this estimates the step's memory traffic where XLA's cost
  model gives none (GPUs); layouts' padding is not counted."""
  computations = dict(_computations(hlo))
  multipliers = _multipliers(computations)
  bodies = {
    body
    for lines in computations.values()
    for line in lines
    for body in re.findall(r"body=%?([\w.\-]+)", line)
  }
  instruction = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*?)\s([a-z][\w\-]*)\((.*)$")
  total = 0
  for name, lines in computations.items():
    if not name.startswith("ENTRY:") and name not in bodies:
      continue
    times = multipliers.get(name, 1)
    sizes = {}
    for line in lines:
      match = instruction.match(line)
      if not match:
        continue
      target, result_type, op, rest = match.groups()
      sizes[target] = _shape_bytes(result_type)
      if op in _NO_TRAFFIC or op.endswith("-done"):
        continue
      operands = rest.split(")")[0].split(",")
      read = sum(sizes.get(o.strip().lstrip("%"), 0) for o in operands)
      total += (sizes[target] + read) * times
  return total


def program_summary(hlo: str) -> dict:
  """What to read first in a compiled program: its fusions, the copies and
  transposes left outside them, and the fused attention calls (cuDNN's
  `__cudnn$fmha` forward and backward kernels on GPUs)."""
  computations = dict(_computations(hlo))
  entry = next((lines for name, lines in computations.items() if name.startswith("ENTRY:")), [])
  count = lambda op, lines: sum(1 for line in lines if re.search(rf"\s{op}\(", line))
  everywhere = [line for lines in computations.values() for line in lines]
  return {
    "entry_fusions": count("fusion", entry),
    "entry_copies": count("copy", entry) + count("copy-start", entry),
    "entry_transposes": count("transpose", entry),
    "cudnn_attention_calls": sum('custom_call_target="__cudnn$fmha' in line for line in everywhere),
  }


def analyse(result: CompiledForTarget) -> dict:
  """Every figure per chip, as `--json` writes them."""
  target, config, compiled = result.target, result.config, result.compiled
  chip = target.chip
  chips = result.mesh.devices.size
  memory = compiled.memory
  params_bytes = shard_bytes(result.state["params"])
  opt_bytes = shard_bytes(result.state["opt_state"])
  figures = {
    "topology": target.name,
    "chip": chip.name,
    "chips": chips,
    "chip_source": chip.source,
    "mesh": dict(result.mesh.shape),
    "global_batch": int(config.input.batch_size),
    "batch_per_chip": int(config.input.batch_size) // chips,
    "compile_s": compiled.seconds,
    "params_bytes_per_chip": params_bytes,
    "opt_state_bytes_per_chip": opt_bytes,
    "state_bytes_per_chip": shard_bytes(result.state),
    "chip_memory_bytes": chip.memory_bytes,
  }
  if memory is not None:
    arguments = int(memory.argument_size_in_bytes)
    temporary = int(memory.temp_size_in_bytes)
    outputs = max(int(memory.output_size_in_bytes) - int(memory.alias_size_in_bytes), 0)
    figures.update(
      argument_bytes_per_chip=arguments,
      temp_bytes_per_chip=temporary,
      output_bytes_per_chip=outputs,
      total_bytes_per_chip=arguments + temporary + outputs,
      fits=arguments + temporary + outputs <= chip.memory_bytes,
    )
  model_flops = flops.model_flops_per_step(config) / chips
  figures["model_flops_per_chip"] = model_flops
  if result.xla_refusal is not None:
    figures["xla_refusal"] = result.xla_refusal
    return figures
  cost = compiled.executable.cost_analysis()
  if isinstance(cost, (list, tuple)):
    cost = cost[0] if cost else None
  cost = cost or {}
  xla_flops = cost.get("flops")
  figures["xla_flops_per_chip"] = float(xla_flops) if xla_flops else None
  accessed = cost.get("bytes accessed")
  figures["xla_bytes_accessed_per_chip"] = float(accessed) if accessed else None
  estimate = cost.get("optimal_seconds")
  figures["xla_optimal_seconds"] = float(estimate) if estimate and estimate > 0 else None
  hlo = compiled.executable.as_text()
  figures["program"] = program_summary(hlo)
  # Beside the bound, not in it: an estimate, not a least time.
  figures["hbm_traffic_bytes_per_chip"] = hbm_traffic_bytes(hlo)
  figures["hbm_traffic_s"] = figures["hbm_traffic_bytes_per_chip"] / chip.memory_bandwidth
  kinds = collectives(hlo, target, result.mesh.devices.flatten())
  figures["collectives"] = kinds
  sent = sum(k["sent_bytes"] for k in kinds.values())
  across = sum(k["sent_bytes_across_hosts"] for k in kinds.values())
  figures["collective_sent_bytes_per_chip"] = sent
  figures["collective_sent_bytes_across_hosts_per_chip"] = across
  # The bound: each term the least time the chip could take for that work.
  # XLA's FLOP count (which includes recomputation) where the backend gives
  # one, else the model's; bytes accessed only where XLA counts them.
  compute_flops = max(model_flops, figures["xla_flops_per_chip"] or 0.0)
  terms = {"compute": compute_flops / chip.peak_bf16_flops}
  if figures["xla_bytes_accessed_per_chip"]:
    terms["memory"] = figures["xla_bytes_accessed_per_chip"] / chip.memory_bandwidth
  network = (sent - across) / chip.interconnect_bandwidth
  if across:
    network += across / chip.host_network_bandwidth
  terms["collectives"] = network
  bound = max(terms.values())
  figures["bound_terms_s"] = terms
  figures["bound_s"] = bound
  figures["bound_limited_by"] = max(terms, key=terms.get)
  figures["mfu_at_bound"] = model_flops / bound / chip.peak_bf16_flops if bound else None
  return figures


# ---------------------------------------------------------------------------
# The report.
# ---------------------------------------------------------------------------


def _size(nbytes: float) -> str:
  if nbytes >= GIB / 10:
    return f"{nbytes / GIB:.2f} GiB"
  return f"{nbytes / 2**20:.2f} MiB"


def _seconds(value: float) -> str:
  if value < 1e-3:
    return f"{value * 1e6:.1f} us"
  return f"{value * 1e3:.2f} ms" if value < 1 else f"{value:.3f} s"


def report_lines(figures: dict) -> list[str]:
  chip = aot_targets.CHIPS[figures["topology"].split(":")[0]]
  mesh = " x ".join(f"{k}={v}" for k, v in figures["mesh"].items())
  lines = [
    f"Target {figures['topology']}: {figures['chips']} x {figures['chip']} ({figures['chip_source']}); "
    f"mesh {mesh}; batch {figures['global_batch']} = {figures['batch_per_chip']} per chip",
    f"Compiled in {figures['compile_s']:.1f}s on this host ({jax.default_backend()}, nothing run)",
    f"State per chip: params {_size(figures['params_bytes_per_chip'])} + optimizer state "
    f"{_size(figures['opt_state_bytes_per_chip'])} (train state "
    f"{_size(figures['state_bytes_per_chip'])}; what mesh.fsdp divides)",
  ]
  if "total_bytes_per_chip" in figures:
    verdict = "fits" if figures["fits"] else "does NOT fit"
    lines.append(
      f"Memory per chip: arguments {_size(figures['argument_bytes_per_chip'])} + temporaries "
      f"{_size(figures['temp_bytes_per_chip'])} + outputs {_size(figures['output_bytes_per_chip'])}"
      f" = {_size(figures['total_bytes_per_chip'])} of {_size(chip.memory_bytes)}: {verdict}"
    )
  if "xla_refusal" in figures:
    lines.append(f"XLA refused to compile it: {figures['xla_refusal']}")
    return lines
  xla = figures["xla_flops_per_chip"]
  lines.append(
    f"FLOPs per chip per step: model {figures['model_flops_per_chip']:.4g} (tools/flops), "
    + (f"XLA counted {xla:.4g}" if xla else "XLA counted: not given by this backend")
  )
  program = figures["program"]
  lines.append(
    f"Program: {program['entry_fusions']} fusions, {program['entry_copies']} copies and "
    f"{program['entry_transposes']} transposes in its entry computation; "
    f"{program['cudnn_attention_calls']} cuDNN fused attention calls"
  )
  lines.append("Collectives per chip per step (count, buffer bytes, bytes sent; part of the step):")
  for kind, entry in figures["collectives"].items():
    if not entry["count"]:
      lines.append(f"  {kind:<18} none")
      continue
    parts = ", ".join(f"{name} {n}" for name, n in sorted(entry["parts"].items()))
    across = entry["sent_bytes_across_hosts"]
    lines.append(
      f"  {kind:<18} {entry['count']:>5} x, {_size(entry['buffer_bytes']):>11}, sent "
      f"{_size(entry['sent_bytes'])}"
      + (f" ({_size(across)} across hosts)" if across else "")
      + f"; {parts}"
    )
  terms = figures["bound_terms_s"]
  sources = {
    "compute": f"FLOPs / {chip.peak_bf16_flops / 1e12:.0f} TFLOP/s bf16 peak",
    "memory": f"XLA's bytes accessed / {chip.memory_bandwidth / 1e9:.0f} GB/s HBM",
    "collectives": f"bytes sent / {chip.interconnect_bandwidth / 1e9:.0f} GB/s chip links"
    + (
      f", {chip.host_network_bandwidth / 1e9:.0f} GB/s between hosts"
      if chip.host_network_bandwidth
      else ""
    ),
  }
  lines.append(
    f"Step time lower bound: {_seconds(figures['bound_s'])} ({figures['bound_limited_by']}-bound) "
    "= max("
    + "; ".join(f"{name} {_seconds(value)} [{sources[name]}]" for name, value in terms.items())
    + ")"
    + ("" if "memory" in terms else "; bytes accessed: not given by this backend")
  )
  lines.append(
    f"Memory traffic estimate (the top-level ops' operands and outputs, {_size(figures['hbm_traffic_bytes_per_chip'])}"
    f" per step) over the HBM bandwidth: {_seconds(figures['hbm_traffic_s'])}"
  )
  mfu = figures["mfu_at_bound"]
  estimate = figures["xla_optimal_seconds"]
  lines.append(
    f"MFU the bound allows: {100 * mfu:.1f}%; XLA's own estimate: "
    + (f"{_seconds(estimate)}" if estimate else "not given by this backend")
  )
  return lines


def refusal(result: CompiledForTarget, figures: dict) -> str | None:
  """The preflight's one line with the levers, against the target chip's memory."""
  gradient_bytes = figures["params_bytes_per_chip"]
  _, line = preflight.memory_line(
    result.config,
    result.compiled.memory,
    figures["chips"],
    gradient_bytes,
    device=(result.target.chip.memory_bytes, f"a {result.target.chip.name} has {{:.1f}} GiB"),
  )
  return line


@errors.report_user_errors
def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  errors.quiet_library_info()
  if FLAGS.config is None:
    raise errors.ConfigError("--config is required, e.g. --config=configs/meru.py:vit_l")
  if not FLAGS.topology:
    raise errors.ConfigError(f"--topology is required: {aot_targets.VALID_NAMES}")
  target = aot_targets.resolve(FLAGS.topology)
  # --attention=xla|cudnn (tools.step_throughput's flag): both towers'.
  step_throughput.set_attention_implementation(FLAGS.config, FLAGS.attention)
  print(
    f"Compiling the step for {target.name} ({target.num_chips} x {target.chip.name})...", flush=True
  )
  result = compile_for(FLAGS.config, target)
  figures = analyse(result)
  for line in report_lines(figures):
    print(line, flush=True)
  if FLAGS.json:
    with open(FLAGS.json, "w") as f:
      json.dump(figures, f, indent=1, sort_keys=True)
    print(f"figures written to {FLAGS.json}", flush=True)
  if figures.get("fits") is False:
    raise preflight.StepDoesNotFitError(
      refusal(result, figures) or f"the step does not fit a {target.chip.name}"
    )


def parse_flags(argv):
  """The command's flags parsed, with a bad flag, config file or override
  as one line (exit 2) instead of a traceback."""
  if "--help" in argv or "-h" in argv:
    print(__doc__ + "\nFlags:\n" + FLAGS.main_module_help(), flush=True)
    sys.exit(0)
  flags.FLAGS(argv[:1])  # absl's own flags, at their defaults
  try:
    return FLAGS(argv)
  except Exception as error:  # noqa: BLE001 (every refusal of the command line)
    cause = errors.innermost_user_error(error)
    if cause is not None:
      message = errors.one_line(cause)
    elif isinstance(error, (AttributeError, KeyError)):
      message = f"a --config. override names a key the config does not have: {error}"
    else:
      message = str(error).strip().splitlines()[0] if str(error).strip() else repr(error)
    print(f"error: {message}", file=sys.stderr, flush=True)
    sys.exit(errors.EXIT_USER_ERROR)


if __name__ == "__main__":
  app.run(main, flags_parser=parse_flags)
