"""Per-device memory of a MERU training step's loss and gradients under the
two tower-memory levers: `model.image_remat` / `model.text_remat` and
`optim.accumulation_steps`.

Compiles value_and_grad of the trainer's own sharded loss (the towers, the
MERU loss, its gradients w.r.t. every parameter) for a ViT-S/16 + base text
tower (MERU's vit_s) at a given per-device batch, and prints per setting:

  XLA temp   `compile().memory_analysis().temp_size_in_bytes`: the compiled
             program's scratch buffers (activations, their gradients);
  saved      what JAX hands XLA to keep from the forward pass for the
             backward one: the residuals of `jax.vjp`, parameters included;
  args+out   parameters, batch, loss and gradients.

  python benchmarks/memory_levers.py --batch=32 --image_size=224

Nothing is executed: the figures are the compiler's buffer assignment and
JAX's residual shapes. The loss is compiled with the train step's compiler
options (`compilation.step_compiler_options`): on a CPU they keep the
optimisation barriers that hold a rematerialised block's recomputation apart
from its forward pass, which XLA:CPU otherwise removes, merging the two again
(remat then changed "saved" but not "XLA temp"). Accumulation runs the
micro-batches in a loop, which no compiler merges.
"""

from __future__ import annotations

import argparse
import math
import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from configs import meru  # noqa: E402
from hyperbolic_vl import objectives as objectives_lib  # noqa: E402
from hyperbolic_vl.models import registry as models_registry  # noqa: E402
from hyperbolic_vl.training import compilation, sharding, step_builder  # noqa: E402
from hyperbolic_vl.training import step as step_lib  # noqa: E402

MIB = 2**20


def step_config(batch: int, image_size: int, dtype: str, remat: str, accumulation_steps: int):
  config = meru.get_config("vit_s")
  with config.unlocked():
    config.input.batch_size = batch
    config.input.image_size = image_size
    config.model.dtype = dtype
    config.model.image_remat = remat
    config.model.text_remat = remat
    config.optim.accumulation_steps = accumulation_steps
  return config


def nbytes(tree) -> int:
  return sum(math.prod(x.shape) * jnp.dtype(x.dtype).itemsize for x in jax.tree.leaves(tree))


def memory(config, mesh) -> dict:
  """{"temp", "saved", "io"} in bytes on a one-device `mesh`."""
  objective = objectives_lib.get(config.objective)
  module = models_registry.abstract_model(config)
  model_def, params = models_registry.ModelDef.from_module(module)
  steps = step_builder.checked_accumulation_steps(config, model_def, mesh.devices.size)
  sharded = step_lib.make_sharded_loss(model_def, objective, mesh, accumulation_steps=steps)
  rows = NamedSharding(mesh, P(step_lib.DATA_AXIS))
  size, context = config.input.image_size, config.input.tokenizer.context_length
  batch = {
    "image": jax.ShapeDtypeStruct(
      (config.input.batch_size, size, size, 3), jnp.uint8, sharding=rows
    ),
    "tokens": jax.ShapeDtypeStruct((config.input.batch_size, context), jnp.int32, sharding=rows),
  }
  rng = jax.random.key(0)
  loss = lambda params, batch: sharded(params, {}, batch, rng)[0]
  # Compiled as the trainer compiles its step (`step_compiler_options`).
  compiled = jax.jit(
    jax.value_and_grad(loss), compiler_options=compilation.step_compiler_options()
  ).lower(params, batch)
  stats = compiled.compile().memory_analysis()
  residuals = jax.eval_shape(lambda p, b: jax.vjp(lambda q: loss(q, b), p)[1], params, batch)
  return {
    "temp": stats.temp_size_in_bytes,
    "saved": nbytes(residuals),
    "io": stats.argument_size_in_bytes + stats.output_size_in_bytes,
  }


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--batch", type=int, default=32, help="global batch (1 device: per device)")
  parser.add_argument("--image_size", type=int, default=224)
  parser.add_argument("--dtype", default="float32")
  parser.add_argument("--remats", default="none,dots_saveable,full")
  parser.add_argument("--accumulation_steps", default="1,2,4")
  parser.add_argument("--remat_with_accumulation", action="store_true")
  args = parser.parse_args()
  mesh = sharding.make_mesh(1)
  print(
    f"MERU vit_s (ViT-S/16 + base text, 77 tokens), {args.image_size} px, batch {args.batch}, "
    f"{args.dtype} towers, 1 x {jax.devices()[0].device_kind}; MiB per device"
  )
  print("| image/text remat | accumulation steps | XLA temp | saved for backward | args+out |")
  print("|---|---|---|---|---|")
  settings = [(remat, 1) for remat in args.remats.split(",")]
  settings += [("none", int(k)) for k in args.accumulation_steps.split(",") if int(k) > 1]
  if args.remat_with_accumulation:
    settings += [
      (remat, int(k))
      for remat in args.remats.split(",")
      if remat != "none"
      for k in args.accumulation_steps.split(",")
      if int(k) > 1
    ]
  for remat, steps in settings:
    figures = memory(step_config(args.batch, args.image_size, args.dtype, remat, steps), mesh)
    print(
      f"| {remat} | {steps} | {figures['temp'] / MIB:.1f} | {figures['saved'] / MIB:.1f} "
      f"| {figures['io'] / MIB:.1f} |",
      flush=True,
    )


if __name__ == "__main__":
  main()
