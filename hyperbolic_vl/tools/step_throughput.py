"""Training-step throughput on synthetic inputs: compile time, step time,
steps/s, pairs/s, images/s per device, FLOPs per step, peak device memory
(GPU/TPU) and, on GPUs/TPUs with a known peak, model FLOPs utilisation.

  python -m hyperbolic_vl.tools.step_throughput --config=configs/meru.py:vit_b \
      --config.input.batch_size=256 --steps=20

The synthetic batch holds every tower input the objective declares
(`Objective.batch_inputs`; HyCoCLIP's box crops and phrases, HCL's views, Radial's tiers too), and the
model FLOPs count each of them:

  python -m hyperbolic_vl.tools.step_throughput --config=configs/hycoclip.py \
      --config.objective.box_tower_calls=2 --steps=20

MFU = model FLOPs per step / step time / the chip's dense bf16 peak, over
steady-state steps after `--warmup` untimed ones. Model FLOPs are counted
from the architecture (3x the towers' forward matmul FLOPs, plus HMID-Net's
teacher forward; `flops.model_flops_per_step`). XLA's cost analysis of the compiled
step is printed too (`step_flops_per_device`), but it is not used for MFU: on
GPUs it leaves out the matrix products XLA hands to cuBLAS/cuDNN, so it
reads several times too low there. The image tower's forward FLOPs (XLA's
count) and, with `--mask_ratios`, its forward + backward time alone are
reported per mask ratio (they fall with HMID-Net's masking).

`--mask_ratios=0,0.5` repeats the benchmark per ratio: the image-tower FLOPs
are those of a forward pass on the kept patches only, and for HMID-Net the
step itself runs with `objective.mask_ratio` set to that ratio. An HMID-Net
config without `objective.teacher_workdir` benchmarks against a RANDOMLY
INITIALISED teacher of `objective.teacher_model`'s size (printed):

  python -m hyperbolic_vl.tools.step_throughput --config=configs/hmid.py --mask_ratios=0,0.5

Sharded params (`--config.mesh.fsdp=N`) print the train state's bytes per
device and XLA's memory analysis of the compiled step. `--profile_dir=DIR`
traces 3 more steady steps with jax.profiler and writes the compiled
step's HLO beside the trace; `benchmarks/profile_split.py --profile=DIR` splits the
device time by kernel class:

  python -m hyperbolic_vl.tools.step_throughput --config=configs/meru.py:vit_b \
      --config.input.batch_size=256 --steps=10 --profile_dir=/tmp/profile_meru

`--dry_run` compiles the config's step at tiny shapes (mu towers, 32 px,
2 rows per device) and runs nothing: a command's flags, config keys and
options checked in seconds on a CPU (benchmarks/gpu_figures.sh --dry_run).
"""

from __future__ import annotations

import copy
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags
from ml_collections import config_flags

from hyperbolic_vl import command_line
from hyperbolic_vl import objectives as objectives_lib
from hyperbolic_vl.models import vit
from hyperbolic_vl.tools import flops, input_throughput
from hyperbolic_vl.training import host_memory, setup, sharding, step_builder

flags.DEFINE_integer("steps", 10, "Timed steps.")
flags.DEFINE_integer("warmup", 2, "Untimed steps after compilation.")
flags.DEFINE_bool("input_only", False, "Time the input pipeline alone (images/s).")
flags.DEFINE_list(
  "mask_ratios",
  [],
  "Patch mask ratios to compare, e.g. 0,0.5 (image-tower FLOPs; HMID-Net's step uses each ratio).",
)
flags.DEFINE_enum(
  "attention",
  None,
  ["xla", "cudnn"],
  "Sets model.attention_implementation (both towers): cudnn = cuDNN fused attention on GPUs.",
)
flags.DEFINE_integer(
  "check_finite_every",
  0,
  "If > 0: fetch the step's scalar metrics every this many timed steps and stop with an "
  "error at the first NaN/Inf (a stability run; the fetches sync the host, so step times "
  "include them).",
)
flags.DEFINE_string(
  "profile_dir",
  None,
  "If set: a jax.profiler trace of PROFILE_STEPS steady steps (after the timed ones) and the "
  "compiled step's HLO are written here; benchmarks/profile_split.py reads them.",
)
flags.DEFINE_bool(
  "dry_run",
  False,
  "Compile the step at tiny shapes (mu towers, 32 px, 2 rows per device) and stop: checks a "
  "command's flags and config without the hardware or the time it needs.",
)
flags.DEFINE_bool(
  "keep_freed_host_memory",
  True,
  "On a CPU, glibc's allocator keeps freed memory for reuse, as the trainer sets it "
  "(training/host_memory.py); --nokeep_freed_host_memory measures glibc's default.",
)
config_flags.DEFINE_config_file("config", None, "Config file.", lock_config=True)

PROFILE_STEPS = 3
# The CPU backend emits per-op trace events only with this flag (GPU kernels
# are always traced); it must be in XLA_FLAGS before the backend starts.
CPU_TRACE_FLAG = "--xla_cpu_enable_xprof_traceme=true"
FLAGS = flags.FLAGS


class _FixedTokenizer:
  """Shapes only: the benchmark needs no trained tokenizer."""

  def __init__(self, vocab_size: int, context_length: int):
    self.vocab_size, self.context_length = vocab_size, context_length

  def encode(self, texts) -> np.ndarray:
    """Rows of the right shape for texts an objective encodes at start-up
    (Radial's root text): a start and an end token, then padding."""
    rows = np.zeros((len(texts), self.context_length), np.int32)
    rows[:, 0], rows[:, 1] = self.vocab_size - 2, self.vocab_size - 1
    return rows


def synthetic_batch(config, tokenizer, batch_size: int, objective, seed: int = 0) -> dict:
  """Random rows for every (key, tower) the objective's step reads
  (`batch_inputs`: images uint8, as the input pipelines send them, scaled
  to [0, 1] on the device; token ids ending in the end token), plus global
  example indices; a several-boxes source's box keys get every slot filled
  (`box_mask`), a key with several inputs per row (Radial's tiers) each."""
  rng = np.random.default_rng(seed)
  size = config.input.image_size
  batch = {"index": np.arange(batch_size, dtype=np.int64)}
  slots = flops.box_slots(config)
  for key, tower in objective.batch_inputs():
    per_row = flops.inputs_per_row(config, key, objective)
    boxed = slots and key.startswith("box_")
    rows = (batch_size, per_row) if boxed or per_row > 1 else (batch_size,)
    if tower == "image":
      batch[key] = rng.integers(0, 256, size=(*rows, size, size, 3), dtype=np.uint8)
    else:
      tokens = rng.integers(1, tokenizer.vocab_size - 2, size=(*rows, tokenizer.context_length))
      tokens[..., -1] = tokenizer.vocab_size - 1
      batch[key] = tokens.astype(np.int32)
  if slots:
    batch["box_mask"] = np.ones((batch_size, slots), bool)
  return batch


def peak_memory_bytes(device) -> int | None:
  """Peak bytes the device allocator has handed out (GPU/TPU; None on CPU)."""
  stats = device.memory_stats() if hasattr(device, "memory_stats") else None
  if not stats:
    return None
  return stats.get("peak_bytes_in_use")


def image_tower_train_seconds(
  model_def, params, config, batch_size: int, keep_indices=None, steps: int = 10
) -> float:
  """Seconds of one forward + backward pass of the image tower alone (the
  part HMID-Net's masking shrinks), mean over `steps` calls after one warm-up call."""
  rng = np.random.default_rng(1)
  size = config.input.image_size
  images = jnp.asarray(rng.uniform(size=(batch_size, size, size, 3)), jnp.float32)

  def loss(p):
    features = model_def.merge(p).image_tower(images, keep_indices=keep_indices)
    return jnp.mean(jnp.square(features.astype(jnp.float32)))

  grad_fn = jax.jit(jax.grad(loss))
  jax.block_until_ready(grad_fn(params))
  t0 = time.perf_counter()
  for _ in range(steps):
    grads = grad_fn(params)
  jax.block_until_ready(grads)
  return (time.perf_counter() - t0) / steps


def compile_step(config):
  """(compiled step, state, batch, model_def, devices, compile seconds) of the
  training step on a synthetic batch (`config` as `step_builder.benchmark_config`
  runs it); the state argument is donated."""
  config = step_builder.benchmark_config(config)
  objective = objectives_lib.get(config.objective)
  tokenizer = _FixedTokenizer(
    config.input.tokenizer.get("vocab_size", 49408), config.input.tokenizer.context_length
  )
  mesh = step_builder.run_mesh(config)
  initial = setup.init_state(config, objective, tokenizer)
  train_step = step_builder.build_train_step(config, objective, initial, mesh, seed=0)
  state = train_step.place(initial.state)
  batch = synthetic_batch(config, tokenizer, config.input.batch_size, objective)
  batch = jax.device_put(batch, sharding.batch_sharding(mesh))
  t0 = time.perf_counter()
  compiled = train_step.jitted.lower(state, batch).compile()
  compile_s = time.perf_counter() - t0
  return compiled, state, batch, initial.model_def, mesh.devices.size, compile_s


def state_mesh(state) -> jax.sharding.Mesh:
  return jax.tree.leaves(state)[0].sharding.mesh


def memory_figures(compiled, state) -> dict:
  """Bytes per device: the params and optimizer state held on the first
  device (their addressable shards, what mesh.fsdp divides), and XLA's
  buffer assignment of the compiled step (arguments: state + batch rows;
  temp: activations, gradients, collectives' buffers)."""
  device = jax.local_devices()[0]
  out = {
    "params_bytes_per_device": sharding.addressable_bytes(state["params"], device),
    "opt_state_bytes_per_device": sharding.addressable_bytes(state["opt_state"], device),
  }
  analysis = compiled.memory_analysis()
  if analysis is not None:
    out["compiled_argument_bytes"] = int(analysis.argument_size_in_bytes)
    out["compiled_output_bytes"] = int(analysis.output_size_in_bytes)
    out["compiled_temp_bytes"] = int(analysis.temp_size_in_bytes)
  return out


def tiny_shapes(config):
  """A copy of `config` at tiny shapes, everything else kept (objective,
  optimizer, mesh, dtypes, options): mu towers (RN-mu for a ResNet tower),
  32 px images, 16 tokens of a 256-word vocabulary, 2 rows per device."""
  config = copy.deepcopy(config)
  num_devices = config.get("num_devices") or jax.device_count()

  def shrink(model):
    resnet = str(model.image_variant).startswith("RN")
    model.image_variant = "RN-mu" if resnet else "mu/8"
    model.text_variant = "mu"
    model.embed_dim = 64
    if "image_num_heads" in model:
      model.image_num_heads = None
    if "head_dim" in model:
      model.head_dim = 128

  with config.unlocked():
    shrink(config.model)
    if config.objective.get("teacher_model") is not None:
      shrink(config.objective.teacher_model)
    config.input.image_size = 32
    # Two rows per device and micro-batch (`optim.accumulation_steps` must
    # divide each device's rows).
    micro_batches = int(config.optim.get("accumulation_steps", 1) or 1)
    config.input.batch_size = 2 * num_devices * micro_batches
    config.input.tokenizer.context_length = 16
    config.input.tokenizer.vocab_size = 256
  return config


def dry_run(config, mask_ratio: float | None = None) -> dict:
  """Compiles the step of `config` at tiny shapes; runs nothing."""
  config = tiny_shapes(step_builder.benchmark_config(config, mask_ratio))
  compiled, state, _, _, devices, compile_s = compile_step(config)
  return {
    "mask_ratio": float(mask_ratio or 0.0),
    "device": jax.devices()[0].device_kind,
    "devices": devices,
    "fsdp": sharding.fsdp_size(state_mesh(state)),
    "global_batch": config.input.batch_size,
    "compile_s": compile_s,
    **memory_figures(compiled, state),
  }


def profile_steps(compiled, state, batch, profile_dir: str, steps: int = PROFILE_STEPS):
  """Traces `steps` steps (state donated, returned) into profile_dir with
  jax.profiler (the trace as perfetto JSON too) and writes the compiled
  step's HLO there (step.hlo.txt), which names what each kernel computes."""
  os.makedirs(profile_dir, exist_ok=True)
  with open(os.path.join(profile_dir, "step.hlo.txt"), "w") as f:
    f.write(compiled.as_text())
  with jax.profiler.trace(profile_dir, create_perfetto_trace=True):
    for _ in range(steps):
      state, metrics = compiled(state, batch)
    jax.block_until_ready((state, metrics))
  return state


def set_attention_implementation(config, implementation: str | None) -> None:
  if implementation is None:
    return
  with config.unlocked():
    config.model.attention_implementation = implementation
    if config.objective.get("teacher_model") is not None:
      config.objective.teacher_model.attention_implementation = implementation


def check_finite(step: int, metrics: dict) -> dict:
  """Host copies of the scalar metrics; raises at the first NaN/Inf."""
  values = {k: float(v) for k, v in jax.device_get(metrics).items() if np.ndim(v) == 0}
  bad = sorted(k for k, v in values.items() if not np.isfinite(v))
  if bad:
    raise FloatingPointError(f"step {step}: non-finite {bad}: {values}")
  return values


def run(
  config,
  steps: int,
  warmup: int,
  mask_ratio: float | None = None,
  check_finite_every: int = 0,
  profile_dir: str | None = None,
) -> dict:
  config = step_builder.benchmark_config(config, mask_ratio)
  compiled, state, batch, model_def, devices, compile_s = compile_step(config)
  step_flops = flops.compiled_flops(compiled)
  memory = memory_figures(compiled, state)
  for _ in range(warmup):
    state, metrics = compiled(state, batch)
  jax.block_until_ready(state)
  checks = 0
  host_usage = host_memory.HostUsage()
  for step in range(1, steps + 1):
    state, metrics = compiled(state, batch)
    if check_finite_every and (step % check_finite_every == 0 or step == steps):
      values = check_finite(step, metrics)
      checks += 1
      print(
        f"step {step}: finite; loss {values['train/loss']:.5g}",
        flush=True,
      )
  jax.block_until_ready(metrics)
  host = host_usage.per_step(steps)
  seconds = host["step_s"]
  if profile_dir:
    state = profile_steps(compiled, state, batch, profile_dir)
  # The tower-alone figures below compile a single-tower function: whole
  # params, so that sharded ones do not partition it.
  params = sharding.gather_to_replicated(state["params"], state_mesh(state))
  per_device_batch = config.input.batch_size // devices
  # The tower-alone figures drop what the step drops (HMID-Net's mask or
  # token dropping).
  ratio = mask_ratio if mask_ratio is not None else config.model.get("image_token_drop", 0.0)
  keep = None
  if ratio:
    keep = vit.random_keep_indices(
      jax.random.key(0), per_device_batch, model_def.module.image_tower.num_patches, ratio
    )
  result = {
    "mask_ratio": float(mask_ratio or 0.0),
    "device": jax.devices()[0].device_kind,
    "devices": devices,
    "global_batch": config.input.batch_size,
    "compile_s": compile_s,
    "step_s": seconds,
    # What the host's kernel spent on the process per timed step: the page
    # faults of freshly mapped memory and the system time they cost
    # (training/host_memory.py).
    "host_page_faults_per_step": host["page_faults_per_step"],
    "host_system_s_per_step": host["system_s_per_step"],
    "steps_per_s": 1 / seconds,
    "pairs_per_s": config.input.batch_size / seconds,
    "images_per_s_per_device": per_device_batch / seconds,
    "step_flops_per_device": step_flops,
    "image_tower_fwd_flops_per_device": flops.image_tower_forward_flops(
      model_def, params, config, per_device_batch, keep
    ),
    "loss": float(metrics["train/loss"]),
    "fsdp": sharding.fsdp_size(state_mesh(state)),
    **memory,
  }
  if mask_ratio is not None:
    result["image_tower_fwd_bwd_s"] = image_tower_train_seconds(
      model_def, params, config, per_device_batch, keep, steps
    )
  if check_finite_every:
    result["finite_checks_passed"] = checks
  peak_memory = peak_memory_bytes(jax.local_devices()[0])
  if peak_memory is not None:
    result["peak_device_memory_gib"] = peak_memory / 2**30
  model_flops = flops.model_flops_per_step(config, mask_ratio) / devices
  result["model_flops_per_device"] = model_flops
  result["model_tflops_per_s_per_device"] = model_flops / seconds / 1e12
  peak = flops.peak_flops(jax.devices()[0])
  if peak is not None:
    result["mfu"] = model_flops / seconds / peak
  return result


def print_result(result: dict) -> None:
  for key, value in result.items():
    print(f"{key:>32}: {value:.4g}" if isinstance(value, float) else f"{key:>32}: {value}")


def main(argv):
  del argv
  if FLAGS.keep_freed_host_memory:
    print(host_memory.keep_freed_host_memory(), flush=True)
  else:
    print("host allocator: glibc's default (--nokeep_freed_host_memory)", flush=True)
  if FLAGS.profile_dir and CPU_TRACE_FLAG not in os.environ.get("XLA_FLAGS", ""):
    # Before the first device query starts the backend.
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {CPU_TRACE_FLAG}".strip()
  if FLAGS.input_only:
    input_throughput.print_input_benchmark(FLAGS.config, FLAGS.steps, FLAGS.warmup)
    return
  attention = FLAGS.attention
  if FLAGS.dry_run and attention == "cudnn" and jax.default_backend() != "gpu":
    print("dry run: --attention=cudnn needs a GPU; compiling with xla attention", flush=True)
    attention = "xla"
  set_attention_implementation(FLAGS.config, attention)
  ratios = [float(r) for r in FLAGS.mask_ratios] or [None]
  if FLAGS.dry_run:
    print(f"jax {jax.__version__}, dry run at tiny shapes on {jax.default_backend()}", flush=True)
    for ratio in ratios:
      print_result(dry_run(FLAGS.config, ratio))
      print(flush=True)
    return
  if FLAGS.config.objective.name == "hmid" and not FLAGS.config.objective.get("teacher_workdir"):
    print(
      "NOTE: no objective.teacher_workdir: the HMID-Net step uses a RANDOMLY INITIALISED "
      "teacher of objective.teacher_model's size",
      flush=True,
    )
  print(f"jax {jax.__version__}, XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}", flush=True)
  results = []
  for ratio in ratios:
    result = run(
      FLAGS.config,
      FLAGS.steps,
      FLAGS.warmup,
      ratio,
      FLAGS.check_finite_every,
      FLAGS.profile_dir if ratio == ratios[-1] else None,
    )
    results.append(result)
    print_result(result)
    if "mfu" not in result:
      print(f"{'mfu':>32}: n/a (no bf16 peak known for {result['device']!r})")
    if "peak_device_memory_gib" not in result:
      print(f"{'peak_device_memory_gib':>32}: n/a (the device reports no memory stats)")
    print(flush=True)
  if FLAGS.profile_dir:
    print(
      f"profile of {PROFILE_STEPS} steps in {FLAGS.profile_dir}; split it with: python "
      f"benchmarks/profile_split.py --profile={FLAGS.profile_dir}",
      flush=True,
    )
  if len(results) > 1:
    base_flops = results[0]["image_tower_fwd_flops_per_device"]
    base_tower_s = results[0]["image_tower_fwd_bwd_s"]
    print("mask_ratio  image_tower_fwd_flops  ratio_vs_first  tower_fwd_bwd_s  speed-up  step_s")
    for r in results:
      tower_flops = r["image_tower_fwd_flops_per_device"]
      rel = tower_flops / base_flops if tower_flops and base_flops else float("nan")
      tower_s = r["image_tower_fwd_bwd_s"]
      print(
        f"{r['mask_ratio']:>10.2f}  {tower_flops or float('nan'):>21.4g}  {rel:>14.3f}  "
        f"{tower_s:>15.4g}  {base_tower_s / tower_s:>7.2f}x  {r['step_s']:.4g}"
      )


def parse_flags(argv):
  """The package's one parser of a `--config` command (hyperbolic_vl.command_line)."""
  return command_line.parse_flags(
    argv,
    flags.FLAGS,
    example="python -m hyperbolic_vl.tools.step_throughput --config=configs/meru.py:vit_b",
  )


if __name__ == "__main__":
  flags.mark_flags_as_required(["config"])
  app.run(main, flags_parser=parse_flags)
