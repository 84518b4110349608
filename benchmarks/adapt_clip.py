"""The hyperbolic adaptation recipe end to end on a CPU, and what locking and
LoRA save: prints every command it runs and the figures.

1. A random-weight open_clip ViT-B/32 (QuickGELU, OpenAI's layout; nothing
   is downloaded) saved as a state dict, converted with the documented
   command, then adapted with `configs/adapt_clip.py:vit_b32` for 20 steps on
   the synthetic world (`data=world`, so no dataset is needed), evaluated on
   200 world scenes.
2. The recipe's training step compiled for the CPU four ways (full
   fine-tuning, image tower locked, LoRA on both towers as the recipe has
   it, and without its dropout): XLA's `memory_analysis()` (temporaries = activations kept for the
   backward plus work space; arguments = params + optimizer state + batch)
   and the step time, at the recipe's batch 32.

  python benchmarks/adapt_clip.py            # both parts (about 10 minutes on 2 cores)
  python benchmarks/adapt_clip.py --part=memory
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

MIB = 2**20


def run_command(args: list[str]) -> float:
  print("$ " + " ".join(args), flush=True)
  t0 = time.perf_counter()
  subprocess.run(args, cwd=REPO, check=True)
  return time.perf_counter() - t0


def recipe(steps: int) -> None:
  import open_clip
  import torch

  with tempfile.TemporaryDirectory() as tmp:
    checkpoint = os.path.join(tmp, "vit_b32_random.pt")
    torch.manual_seed(0)
    torch.save(open_clip.create_model("ViT-B-32-quickgelu").state_dict(), checkpoint)
    clip_dir, adapted_dir = os.path.join(tmp, "openai_b32"), os.path.join(tmp, "hyperbolic_b32")
    python = sys.executable
    convert_s = run_command(
      [
        python,
        "-m",
        "hyperbolic_vl.convert",
        "--source=open_clip",
        f"--checkpoint={checkpoint}",
        "--config=configs/clip.py:openai_vit_b32",
        f"--workdir={clip_dir}",
      ]
    )
    train_s = run_command(
      [
        python,
        "-m",
        "hyperbolic_vl.main",
        "--config=configs/adapt_clip.py:vit_b32,data=world",
        f"--workdir={adapted_dir}",
        f"--config.init_from={clip_dir}",
        f"--config.total_steps={steps}",
        "--config.epochs=0",
        "--config.log_training_steps=5",
        "--config.evals.world.num_examples=200",
      ]
    )
    with open(os.path.join(adapted_dir, "metrics.jsonl")) as f:
      rows = [json.loads(line) for line in f]
    losses = {r["step"]: r["train/loss"] for r in rows if "train/loss" in r}
    print(f"convert: {convert_s:.0f} s; adapt {steps} steps + evaluation: {train_s:.0f} s")
    print("train/loss by step: " + ", ".join(f"{s}: {v:.4f}" for s, v in sorted(losses.items())))


def memory(steps: int) -> None:
  import jax

  from configs import adapt_clip
  from hyperbolic_vl import objectives as objectives_lib
  from hyperbolic_vl.tools import step_throughput
  from hyperbolic_vl.training import setup

  def variant(name: str):
    config = adapt_clip.get_config("vit_b32")
    with config.unlocked():
      config.total_steps = 1000
      if name == "full fine-tuning":
        config.model.lora.rank = 0
      elif name == "image tower locked":
        config.model.lora.rank = 0
        config.model.lock_image = True
      elif name == "LoRA r16, no dropout":
        config.model.lora.dropout = 0.0
    return config

  print(
    f"{'ViT-B/32, batch 32, float32':28s} {'trainable':>12s} {'arguments':>10s} "
    f"{'temporaries':>12s} {'step':>8s}"
  )
  for name in (
    "full fine-tuning",
    "image tower locked",
    "LoRA r16 (recipe)",
    "LoRA r16, no dropout",
  ):
    config = variant(name)
    compiled, state, batch, _, _, _ = step_throughput.compile_step(config)
    objective = objectives_lib.get(config.objective)
    params = state["params"]
    mask = setup.run_trainable_mask(params, setup.trainable_predicate(config, objective, params))
    total = setup.param_count(state["params"])
    trainable = (
      total
      if mask is None
      else setup.param_count(
        [p for p, t in zip(jax.tree.leaves(state["params"]), jax.tree.leaves(mask)) if t]
      )
    )
    analysis = compiled.memory_analysis()
    state, _ = compiled(state, batch)  # warm
    jax.block_until_ready(state)
    t0 = time.perf_counter()
    for _ in range(steps):
      state, metrics = compiled(state, batch)
    jax.block_until_ready(metrics)
    step_s = (time.perf_counter() - t0) / steps
    print(
      f"{name:28s} {trainable:>12,} {analysis.argument_size_in_bytes / MIB:>8.0f} MiB "
      f"{analysis.temp_size_in_bytes / MIB:>8.0f} MiB {step_s:>7.2f} s",
      flush=True,
    )


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--part", choices=("all", "recipe", "memory"), default="all")
  parser.add_argument("--steps", type=int, default=20, help="recipe steps")
  parser.add_argument("--timed_steps", type=int, default=3, help="timed steps per memory row")
  args = parser.parse_args()
  print(f"machine: {os.cpu_count()} CPUs; {sys.version.split()[0]}", flush=True)
  if args.part in ("all", "recipe"):
    recipe(args.steps)
  if args.part in ("all", "memory"):
    memory(args.timed_steps)


if __name__ == "__main__":
  main()
