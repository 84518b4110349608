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

Exit codes, each with one line on stderr (the launchers submit only on 0):
0 the step fits the chip's memory; 2 a bad argument or config (an unknown
topology or override key, a --json path that cannot be written: checked
before compiling); 4 it does not fit (with the levers that fit, each with
its figure); 5 the backend's package is not installed (the `aot` extra);
130 Ctrl-C (143 SIGTERM), at any moment: no report, no JSON.
`--json=FILE` writes every figure.

What it sets: when it runs (not on import), JAX's platform to the CPU
(jax_platforms=cpu: this host opens no accelerator) and
ALLOW_MULTIPLE_LIBTPU_LOAD=1 (libtpu's machine-wide lock is not this
process's to wait on: it drives no TPU), before JAX starts a backend.
"""

from __future__ import annotations

from hyperbolic_vl import errors

# The command's output files (--json), removed by an interrupt that comes
# after they were written: an interrupted check leaves no report.
_WRITTEN: list[str] = []
if __name__ == "__main__":
  # Ctrl-C from the first moment (the imports below take seconds): one
  # line and exit 130 at once, never a report, never exit 0. The launchers
  # submit only on exit 0.
  errors.exit_at_once_on_interrupt("the check stopped; no report, nothing written", _WRITTEN)

import contextlib  # noqa: E402
import dataclasses  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import re  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
import types  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from absl import app, flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from hyperbolic_vl import command_line  # noqa: E402
from hyperbolic_vl import objectives as objectives_lib  # noqa: E402
from hyperbolic_vl.data import tokenizer as tokenizer_lib  # noqa: E402
from hyperbolic_vl.models import compile_target  # noqa: E402
from hyperbolic_vl.models import registry as models_registry  # noqa: E402
from hyperbolic_vl.tools import aot_report, aot_targets, flops, hlo_text, step_throughput  # noqa: E402
from hyperbolic_vl.training import (  # noqa: E402
  compilation,
  run_context,
  setup,
  sharding,
  step_builder,
)

# Exit codes beyond errors.EXIT_USER_ERROR (2, a bad argument or config),
# one per reason the launchers name (launch/slurm_gpu.sbatch, tpu_vm.sh).
EXIT_DOES_NOT_FIT = 4
EXIT_MISSING_BACKEND = 5

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


# ---------------------------------------------------------------------------
# The step, compiled for the target.
# ---------------------------------------------------------------------------


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
  row = step_throughput.synthetic_batch(config, tokenizer, 1, objective)
  batch = int(config.input.batch_size)
  return {
    key: jax.ShapeDtypeStruct((batch, *value.shape[1:]), value.dtype, sharding=batch_sharding)
    for key, value in row.items()
  }


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
  config: object  # as `step_builder.benchmark_config` left it
  mesh: jax.sharding.Mesh
  jitted: object
  state: dict
  batch: dict


def step_for(config, target: aot_targets.Target) -> StepForTarget:
  """The run's train step and its abstract arguments for `target`, built
  by the trainer's own builder (training/step_builder) as the target's
  trainer would: nothing compiled, nothing allocated."""
  config = step_builder.benchmark_config(config)
  objective = objectives_lib.get(config.objective)
  tokenizer = run_tokenizer(config)
  mesh = step_builder.run_mesh(config, target.devices, devices_named=f"chips of {target.name}")
  initial = abstract_initial_state(config, objective, tokenizer)
  with compile_target.compiling_for(target.platform):
    # The package's compiler options are the target's platform's.
    train_step = step_builder.build_train_step(
      config, objective, initial, mesh, extra_compiler_options=target_compiler_options(target)
    )
  state = train_step.place_abstract(initial.state)
  batch = abstract_batch(config, tokenizer, objective, sharding.batch_sharding(mesh))
  return StepForTarget(target, config, mesh, train_step.jitted, state, batch)


@dataclasses.dataclass
class CompiledForTarget:
  target: aot_targets.Target
  config: object
  state: dict  # abstract, with the trainer's shardings
  compiled: compilation.CompiledStep  # executable None when XLA refused it
  mesh: jax.sharding.Mesh
  xla_refusal: str | None = None  # XLA's own "does not fit" line
  # XLA's rematerialization warning and the memory limit it names: the
  # program compiled, but XLA could not bring it under that limit.
  xla_memory_warning: str | None = None
  xla_memory_limit: int | None = None


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


# XLA's rematerialization pass, when the step needs more than its memory
# limit for the device (hlo_rematerialization.cc, a C++ warning on stderr).
XLA_REMAT_WARNING = re.compile(
  r"Can't reduce memory use below [\d.]+\w+ \((\d+) bytes\) by rematerialization; "
  r"only reduced to [\d.]+\w+ \((\d+) bytes\)[^\n]*"
)


@contextlib.contextmanager
def native_stderr_captured():
  """What the C++ libraries write to file descriptor 2 inside the block,
  as `captured["text"]` after it: XLA says there, not in an exception, when
  it could not fit a program into its memory limit."""
  captured = {"text": ""}
  sys.stderr.flush()
  saved = os.dup(2)
  with tempfile.TemporaryFile(mode="w+b") as sink:
    os.dup2(sink.fileno(), 2)
    try:
      yield captured
    finally:
      os.dup2(saved, 2)
      os.close(saved)
      sink.seek(0)
      captured["text"] = sink.read().decode(errors="replace")


def compile_for(config, target: aot_targets.Target) -> CompiledForTarget:
  """The run's train step compiled for `target` (nothing run, nothing allocated)."""
  result = None
  try:
    with native_stderr_captured() as native:
      result = _compile_for(config, target)
  finally:
    # What XLA said goes on to stderr as it came, but the rematerialization
    # warning of a step that compiled: the report shows it as its reason.
    text = native["text"]
    warned = XLA_REMAT_WARNING.search(text) if result is not None else None
    if warned is not None:
      result.xla_memory_warning = warned.group(0).strip()
      result.xla_memory_limit = int(warned.group(1))
      text = "".join(
        line for line in text.splitlines(keepends=True) if "rematerialization" not in line
      )
    os.write(2, text.encode())
  return result


def _compile_for(config, target: aot_targets.Target) -> CompiledForTarget:
  step = step_for(config, target)
  # Traced and lowered inside: every choice by platform is the target's.
  with compile_target.compiling_for(target.platform), compilation.without_persistent_cache():
    start = time.perf_counter()
    try:
      compiled = compilation.compile_step(step.jitted, step.state, step.batch)
    except KeyError as error:
      # The abstract batch holds the keys the objective declares
      # (`batch_inputs`); a loss that reads an undeclared one is refused in
      # one line rather than with the trace's KeyError.
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
    total = arguments + temporary + outputs
    figures.update(
      argument_bytes_per_chip=arguments,
      temp_bytes_per_chip=temporary,
      output_bytes_per_chip=outputs,
      total_bytes_per_chip=total,
      usable_bytes_per_chip=chip.memory_bytes,
      fits=total <= chip.memory_bytes,
    )
    if result.xla_memory_warning is not None:
      # XLA's own limit for the device is the figure trusted: below the
      # chip's memory (the runtime's reserve), and the program exceeds it.
      figures.update(
        xla_memory_warning=result.xla_memory_warning,
        usable_bytes_per_chip=min(chip.memory_bytes, result.xla_memory_limit),
        fits=False,
      )
  model_flops = flops.model_flops_per_step(config) / chips
  figures["model_flops_per_chip"] = model_flops
  if result.xla_refusal is not None:
    figures["xla_refusal"] = result.xla_refusal
    return figures
  cost = flops.cost_analysis(compiled.executable)
  xla_flops = cost.get("flops")
  figures["xla_flops_per_chip"] = float(xla_flops) if xla_flops else None
  accessed = cost.get("bytes accessed")
  figures["xla_bytes_accessed_per_chip"] = float(accessed) if accessed else None
  estimate = cost.get("optimal_seconds")
  figures["xla_optimal_seconds"] = float(estimate) if estimate and estimate > 0 else None
  hlo = compiled.executable.as_text()
  figures["program"] = hlo_text.program_summary(hlo)
  # Beside the bound, not in it: an estimate, not a least time.
  figures["hbm_traffic_bytes_per_chip"] = hlo_text.hbm_traffic_bytes(hlo)
  if chip.memory_bandwidth:
    figures["hbm_traffic_s"] = figures["hbm_traffic_bytes_per_chip"] / chip.memory_bandwidth
  # XLA:TPU's cost analysis counts a loop's body once (a step of 2 micro-
  # batches counted 3.99e13 FLOPs against one pass's 5.97e13). Its bytes are
  # scaled by what the loops add to this tool's traffic estimate, counted per
  # trip over counted once; 1.0 for a step without loops.
  once = hlo_text.hbm_traffic_bytes(hlo, per_trip=False)
  figures["loop_traffic_scale"] = figures["hbm_traffic_bytes_per_chip"] / once if once else 1.0
  if figures["xla_bytes_accessed_per_chip"]:
    figures["bytes_accessed_per_trip_per_chip"] = (
      figures["xla_bytes_accessed_per_chip"] * figures["loop_traffic_scale"]
    )
  kinds = hlo_text.collectives(hlo, target, result.mesh.devices.flatten())
  figures["collectives"] = kinds
  sent = sum(k["sent_bytes"] for k in kinds.values())
  across = sum(k["sent_bytes_across_hosts"] for k in kinds.values())
  figures["collective_sent_bytes_per_chip"] = sent
  figures["collective_sent_bytes_across_hosts_per_chip"] = across
  # The bound: each term the least time the chip could take for that work.
  # XLA's FLOP count (which includes recomputation) where the backend gives
  # one, else the model's; bytes accessed only where XLA counts them.
  if chip.peak_bf16_flops is None:
    # This host's CPU: no data sheet, no bound (its time is measured).
    figures.update(bound_terms_s={}, bound_s=None, bound_limited_by=None, mfu_at_bound=None)
    figures["hbm_traffic_s"] = None
    return figures
  compute_flops = max(model_flops, figures["xla_flops_per_chip"] or 0.0)
  terms = {"compute": compute_flops / chip.peak_bf16_flops}
  if figures["xla_bytes_accessed_per_chip"]:
    terms["memory"] = figures["bytes_accessed_per_trip_per_chip"] / chip.memory_bandwidth
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


def check_json_path(path: str) -> None:
  """Refuses, before the compile, a --json path the figures cannot be
  written to (a folder, a missing or read-only folder)."""
  if os.path.isdir(path):
    raise errors.ConfigError(f"--json={path} is a folder; give a file, e.g. {path}/figures.json")
  folder = os.path.dirname(os.path.abspath(path))
  if not os.path.isdir(folder):
    raise errors.ConfigError(f"--json={path}: folder {folder} does not exist")
  try:
    with tempfile.NamedTemporaryFile(dir=folder, prefix=".aot_check_"):
      pass
  except OSError as error:
    raise errors.ConfigError(
      f"--json={path}: cannot write in {folder} ({error.strerror})"
    ) from None


def write_json(path: str, figures: dict) -> None:
  """Written whole or not at all (a temporary file renamed), and listed for
  removal should an interrupt come before the command ends."""
  temporary = f"{path}.partial"
  _WRITTEN.append(temporary)
  with open(temporary, "w") as f:
    json.dump(figures, f, indent=1, sort_keys=True)
  _WRITTEN.append(path)
  os.replace(temporary, path)


def on_a_helper_thread(work, *args):
  """`work(*args)` on a helper thread while the main thread waits for it.
  Python runs signal handlers on the main thread only, between bytecodes:
  a Ctrl-C during XLA's compile (minutes inside one C++ call) would wait
  for the compile's end, and then meet JAX's garbage-collection callback,
  which swallows it ("Exception ignored in ... _xla_gc_callback"). Joined in
  short waits, the main thread takes the signal at once."""
  outcome = {}

  def run():
    try:
      outcome["value"] = work(*args)
    except BaseException as error:  # noqa: BLE001 (re-raised on the main thread)
      outcome["error"] = error

  thread = threading.Thread(target=run, name="aot-compile", daemon=True)
  thread.start()
  while thread.is_alive():
    thread.join(0.05)
  if "error" in outcome:
    raise outcome["error"]
  return outcome["value"]


def check(config, target: aot_targets.Target) -> tuple[dict, list[str], str | None]:
  """(figures, report lines, the refusal when the step does not fit)."""
  result = compile_for(config, target)
  figures = analyse(result)
  lines = aot_report.report_lines(figures)
  refused = None
  if figures.get("fits") is False:
    refused = aot_report.refusal(result, figures) or f"the step does not fit a {target.chip.name}"
  return figures, lines, refused


@errors.report_user_errors
def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  errors.quiet_library_info()
  if FLAGS.config is None:
    raise errors.ConfigError("--config is required, e.g. --config=configs/meru.py:vit_l")
  if not FLAGS.topology:
    raise errors.ConfigError(f"--topology is required: {aot_targets.VALID_NAMES}")
  if FLAGS.json:
    check_json_path(FLAGS.json)
  # Before JAX starts a backend (nothing has asked for a device yet).
  jax.config.update("jax_platforms", "cpu")
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
  try:
    target = aot_targets.resolve(FLAGS.topology)
  except aot_targets.MissingBackendError as error:
    print(f"error: {error}", file=sys.stderr, flush=True)
    sys.exit(EXIT_MISSING_BACKEND)
  # --attention=xla|cudnn (tools.step_throughput's flag): both towers'.
  step_throughput.set_attention_implementation(FLAGS.config, FLAGS.attention)
  print(
    f"Compiling the step for {target.name} ({target.num_chips} x {target.chip.name})...", flush=True
  )
  figures, lines, refused = on_a_helper_thread(check, FLAGS.config, target)
  # The report in one write, the figures whole: what an interrupt can cut short.
  sys.stdout.write("".join(f"{line}\n" for line in lines))
  sys.stdout.flush()
  if FLAGS.json:
    write_json(FLAGS.json, figures)
    print(f"figures written to {FLAGS.json}", flush=True)
  if refused is not None:
    print(f"error: {refused}", file=sys.stderr, flush=True)
  # The outcome is printed and written: end now. Python's and JAX's
  # teardown takes a second, and a Ctrl-C in it would turn a reported
  # outcome into exit 130 (the interrupt handler stays until the end).
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(0 if refused is None else EXIT_DOES_NOT_FIT)


def parse_flags(argv):
  """The command's flags (the package's one parser: a bad flag, config file
  or override is one line, exit 2), with `--help` on this command's own."""
  if "--help" in argv or "-h" in argv:
    print(__doc__ + "\nFlags:\n" + FLAGS.main_module_help(), flush=True)
    sys.exit(0)
  flags.FLAGS(argv[:1])  # absl's own flags, at their defaults
  return command_line.parse_flags(
    argv,
    FLAGS,
    example="python -m hyperbolic_vl.tools.aot --config=configs/meru.py:vit_b --topology=h100:8",
  )


if __name__ == "__main__":
  app.run(main, flags_parser=parse_flags)
