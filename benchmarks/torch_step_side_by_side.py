"""Our MERU training step vs MERU's PyTorch step, side by side (CPU or GPU).

Both sides train the same architecture at the same shapes and precision: a ViT
image tower, a pre-LN causal text tower, MERU's loss (Lorentz contrastive +
entailment), AdamW and gradient clipping. The PyTorch side uses MERU's own
model classes (`meru.models.MERU`, `meru.encoders.text_encoders`, a timm
ViT), imported from a checkout of facebookresearch/meru that the user passes
(nothing of it is part of this repository), in eager mode:

  git clone https://github.com/facebookresearch/meru /path/to/meru
  pip install -e '.[bench]'            # torch, timm, loguru (MERU imports it)
  python benchmarks/torch_step_side_by_side.py --meru_repo=/path/to/meru \\
      --shapes=tiny,vit_s --rounds=3 --threads=2

Shapes: "tiny" is configs/meru.py's tiny model (batch 128, 32 px, mu/8 ViT,
mu text tower); "vit_s" is ViT-S/16 at 224 px with the L12/W512 text tower,
batch 8 (configs/meru.py:vit_s in float32). Untimed rounds run first, until a
round of each side faults in no new host memory (steady state); then the
timed rounds alternate (ours, theirs, ours, ...) so that machine load hits
both, and the medians are compared. Both
steps run in this one process, under the host allocator setting the trainer
uses on a CPU (`training/host_memory.py`: freed memory kept for reuse), so
neither pays for mapping its buffers afresh each step. On a CPU each round
also prints the cores each side kept busy: the process's CPU time over the
round's wall time (threads that spin while they wait count as busy:
PyTorch's OpenMP workers spin between its parallel regions), and the page
faults per step.

On a GPU (`--device=gpu`) the towers run in bf16: ours with bf16 towers and
float32 geometry (the configs' default), MERU's under
`torch.autocast("cuda", torch.bfloat16)` (its loss code already forces
float32 inside); "vit_b" is ViT-B/16 + L12/W512 at batch 256, 224 px:

  python benchmarks/torch_step_side_by_side.py --meru_repo=/path/to/meru \
      --device=gpu --shapes=vit_b --rounds=3 --vit_steps=10
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile


def _args():
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--meru_repo", required=True, help="checkout of facebookresearch/meru")
  parser.add_argument("--shapes", default="tiny,vit_s")
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--threads", type=int, default=2, help="CPU threads (--device=cpu)")
  parser.add_argument("--device", choices=("cpu", "gpu"), default="cpu")
  parser.add_argument("--tiny_steps", type=int, default=10, help="timed steps per round")
  parser.add_argument(
    "--vit_steps", "--vit_s_steps", type=int, default=2, help="timed steps per round (ViT shapes)"
  )
  parser.add_argument(
    "--max_warmup_rounds",
    type=int,
    default=5,
    help="untimed rounds before the timed ones: until a round of each side faults in no "
    "new host memory, or this many",
  )
  parser.add_argument(
    "--torch_profile",
    action="store_true",
    help="after the rounds, trace one PyTorch step per shape and print its per-op table "
    "(ours: step_throughput --profile_dir and benchmarks/profile_split.py)",
  )
  return parser.parse_args()


ARGS = _args() if __name__ == "__main__" else None
if ARGS is not None and ARGS.device == "gpu":
  # Both libraries share the one GPU: JAX's default takes 75% of it up front,
  # which left PyTorch 19 GiB of an 80 GB H100 (out of memory at batch 256;
  # an H200's 141 GiB hid it). JAX allocates as it needs instead.
  os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
if ARGS is not None and ARGS.device == "cpu":
  # Thread counts must be fixed before either library starts its pools.
  os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "")
    + f" --xla_cpu_multi_thread_eigen={'true' if ARGS.threads > 1 else 'false'}"
    + f" intra_op_parallelism_threads={ARGS.threads}"
  ).strip()
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  # XLA:CPU's runtime keeps its own pool of one thread per core whatever
  # those flags say (a "1 thread" 2048^2 matmul took 2x its wall time in CPU
  # time), so the process is pinned to `threads` cores: both libraries then
  # get exactly that many.
  os.sched_setaffinity(0, set(sorted(os.sched_getaffinity(0))[: ARGS.threads]))
  # One process runs both steps, so both get the allocator setting the
  # trainer runs with on a CPU (hyperbolic_vl/training/host_memory.py),
  # set before either library starts its threads.
  from hyperbolic_vl.training import host_memory

  print(host_memory.keep_freed_host_memory("cpu"), flush=True)

import jax  # noqa: E402
import numpy as np  # noqa: E402

from configs import meru as meru_config  # noqa: E402
from hyperbolic_vl.models import text as text_lib  # noqa: E402
from hyperbolic_vl.models import vit as vit_lib  # noqa: E402
from hyperbolic_vl.tools import step_throughput as benchmark  # noqa: E402
from hyperbolic_vl.training import host_memory, setup  # noqa: E402

SHAPES = {
  "tiny": dict(config_arg="tiny", batch_size=128, image_size=32),
  "vit_s": dict(config_arg="vit_s", batch_size=8, image_size=224),
  "vit_b": dict(config_arg="vit_b", batch_size=256, image_size=224),
}


def our_config(shape: str, device: str):
  spec = SHAPES[shape]
  config = meru_config.get_config(spec["config_arg"])
  config.unlock()
  config.input.batch_size = spec["batch_size"]
  config.input.image_size = spec["image_size"]
  config.model.dtype = "bfloat16" if device == "gpu" else "float32"
  config.num_devices = 1
  return config


class OurStep:
  def __init__(self, config):
    self.compiled, self.state, self.batch, model_def, _, self.compile_s = benchmark.compile_step(
      config
    )
    self.num_params = setup.param_count(self.state["params"])
    self.numpy_batch = jax.device_get(self.batch)

  def __call__(self, steps: int) -> float:
    usage = host_memory.HostUsage()
    for _ in range(steps):
      self.state, metrics = self.compiled(self.state, self.batch)
    jax.block_until_ready(metrics)
    self.usage = usage.per_step(steps)
    return self.usage["step_s"]


class TorchMeruStep:
  """MERU's model classes at our shapes, AdamW + clipping, eager; float32 on
  the CPU, bf16 autocast on a GPU."""

  def __init__(self, config, numpy_batch, meru_repo: str, device: str):
    sys.path.insert(0, os.path.abspath(meru_repo))
    import timm.models.vision_transformer as timm_vit
    import torch
    from meru.encoders.text_encoders import TransformerTextEncoder
    from meru.models import MERU

    self.torch = torch
    if not torch.distributed.is_initialized():
      # MERU's step asks torch.distributed for the world size: one process.
      store = tempfile.NamedTemporaryFile(prefix="meru_pg_", delete=False).name
      torch.distributed.init_process_group(
        "gloo", init_method=f"file://{store}", rank=0, world_size=1
      )
    image = vit_lib.decode_variant(config.model.image_variant)
    text = text_lib.TEXT_SIZES[config.model.text_variant]
    visual = timm_vit.VisionTransformer(
      img_size=config.input.image_size,
      patch_size=image["patch_size"],
      embed_dim=image["width"],
      depth=image["depth"],
      num_heads=image["heads"],
      mlp_ratio=image["mlp_dim"] / image["width"],
      num_classes=0,
      global_pool="token",
      norm_layer=torch.nn.LayerNorm,
    )
    visual.width = visual.embed_dim
    visual.pos_embed.requires_grad = False  # MERU's fixed sin-cos table
    textual = TransformerTextEncoder(
      f"L{text['depth']}_W{text['width']}_A{text['heads']}",
      vocab_size=config.input.tokenizer.vocab_size,
      context_length=config.input.tokenizer.context_length,
    )
    self.model = MERU(visual, textual, embed_dim=config.model.embed_dim, entail_weight=0.2)
    self.device = torch.device("cuda" if device == "gpu" else "cpu")
    self.model.to(self.device)
    self.model.train()
    self.num_params = sum(p.numel() for p in self.model.parameters() if p.requires_grad)
    self.optimizer = torch.optim.AdamW(
      [p for p in self.model.parameters() if p.requires_grad],
      lr=config.optim.lr,
      betas=(config.optim.b1, config.optim.b2),
      weight_decay=config.optim.weight_decay,
    )
    self.clip = config.optim.grad_clip_norm
    # MERU takes BCHW images in [0, 1] and a list of token tensors.
    images = np.ascontiguousarray(numpy_batch["image"].transpose(0, 3, 1, 2))
    self.images = torch.from_numpy(images).to(self.device)
    # MERU's training loop hands the model a list of host token tensors,
    # which the model pads and moves to the device itself.
    self.tokens = [torch.from_numpy(row.astype(np.int64)) for row in numpy_batch["tokens"]]
    self.autocast = torch.autocast(
      self.device.type,
      dtype=torch.bfloat16 if self.device.type == "cuda" else torch.float32,
      enabled=self.device.type == "cuda",
    )

  def __call__(self, steps: int) -> float:
    torch = self.torch
    if self.device.type == "cuda":
      torch.cuda.synchronize()
    usage = host_memory.HostUsage()
    for _ in range(steps):
      self.optimizer.zero_grad(set_to_none=True)
      with self.autocast:
        loss = self.model(self.images, list(self.tokens))["loss"]
      loss.backward()
      torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip)
      self.optimizer.step()
    if self.device.type == "cuda":
      torch.cuda.synchronize()
    self.usage = usage.per_step(steps)
    return self.usage["step_s"]


def warm_up(ours, theirs, steps: int, max_rounds: int) -> int:
  """Untimed rounds of `steps` steps, alternating sides as the timed rounds
  do, until a round of each side faults in no new host memory (or
  `max_rounds`); returns how many rounds ran.

  The timed rounds compare steady-state steps. Both sides allocate from the
  same process heap, and ours keeps its freed memory for reuse
  (hyperbolic_vl/training/host_memory.py): until the heap has grown to the
  peak of the pattern the rounds repeat, a ViT-S step of ours faults in up
  to 300,000 new pages (about 1.8 s on this 2-core VM); PyTorch's, none
  after its first step. One fixed warm-up step used to leave those faults
  in our first timed rounds."""
  for round_index in range(1, max_rounds + 1):
    ours(steps), theirs(steps)
    if ours.usage["page_faults_per_step"] == 0 and theirs.usage["page_faults_per_step"] == 0:
      return round_index
  return max_rounds


def main():
  import torch

  if ARGS.device == "cpu":
    torch.set_num_threads(ARGS.threads)
    print(f"jax {jax.__version__}, torch {torch.__version__}, {ARGS.threads} threads, float32")
  else:
    print(
      f"jax {jax.__version__} on {jax.devices()[0].device_kind}, torch {torch.__version__} on "
      f"{torch.cuda.get_device_name()}, bf16 towers (torch: autocast)"
    )
  print(f"load average at start: {os.getloadavg()}")
  rows = []
  for shape in ARGS.shapes.split(","):
    steps = ARGS.tiny_steps if shape == "tiny" else ARGS.vit_steps
    config = our_config(shape, ARGS.device)
    ours = OurStep(config)
    theirs = TorchMeruStep(config, ours.numpy_batch, ARGS.meru_repo, ARGS.device)
    print(
      f"[{shape}] parameters: ours {ours.num_params:,}, MERU torch {theirs.num_params:,}; "
      f"our compile {ours.compile_s:.1f} s",
      flush=True,
    )
    ours(1), theirs(1)  # first-call allocations
    warmup_rounds = warm_up(ours, theirs, steps, ARGS.max_warmup_rounds)
    print(f"[{shape}] warm-up: {warmup_rounds} untimed rounds after one step", flush=True)
    our_times, their_times = [], []
    for round_index in range(ARGS.rounds):
      our_times.append(ours(steps))
      their_times.append(theirs(steps))
      busy = (
        f" (cores busy: ours {ours.usage['cores_busy']:.2f},"
        f" MERU torch {theirs.usage['cores_busy']:.2f}; page faults per step:"
        f" ours {ours.usage['page_faults_per_step']:,.0f},"
        f" MERU torch {theirs.usage['page_faults_per_step']:,.0f})"
        if ARGS.device == "cpu"
        else ""
      )
      print(
        f"[{shape}] round {round_index + 1}: ours {our_times[-1] * 1e3:.1f} ms/step, "
        f"MERU torch {their_times[-1] * 1e3:.1f} ms/step{busy}",
        flush=True,
      )
    ours_median, theirs_median = statistics.median(our_times), statistics.median(their_times)
    rows.append((shape, config.input.batch_size, ours_median, theirs_median))
    if ARGS.torch_profile:
      with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as trace:
        theirs(1)
      print(f"[{shape}] one MERU torch step, traced:")
      print(trace.key_averages().table(sort_by="self_cpu_time_total", row_limit=20))
  print(f"load average at end: {os.getloadavg()}")
  print(
    "| shape | batch | ours ms/step | MERU torch ms/step | ours pairs/s | MERU torch pairs/s "
    "| speed-up ours vs torch |"
  )
  print("|---|---|---|---|---|---|---|")
  for shape, batch, ours_median, theirs_median in rows:
    print(
      f"| {shape} | {batch} | {ours_median * 1e3:.1f} | {theirs_median * 1e3:.1f} "
      f"| {batch / ours_median:.0f} | {batch / theirs_median:.0f} "
      f"| {theirs_median / ours_median:.2f}x |"
    )


if __name__ == "__main__":
  main()
