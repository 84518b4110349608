"""Per-device memory of the contrastive loss step at huge global batches.

Compiles value_and_grad of the objectives' real `loss`, shard_mapped over 8
virtual CPU devices exactly as in training, on given (B, 512) float32
embeddings (the towers are left out: their memory does not depend on how the
logits are computed), and prints XLA's `memory_analysis()` of the compiled
per-device program, materialised logits vs column blocks, and the sigmoid
loss (SigLIP's, objectives/pairwise_sigmoid.py) with gathered columns vs
columns passed around the ring of devices:

  python benchmarks/contrastive_memory.py --global_batches=8192,32768,65536 \
      --chunk_sizes=1024,256
  python benchmarks/contrastive_memory.py --global_batches=65536 --chunk_sizes=1024 \
      --sigmoid=gathered,ring

Nothing is executed: the figures are the compiler's buffer assignment.
"beyond embeddings" subtracts the four (B, D) float32 buffers any
all-gather contrastive loss holds whatever it does with the logits (the
gathered image and text embeddings and their cotangents): what is left is
the memory of the logits and their softmax. (The ring loss gathers nothing:
it holds one received text block per ring step for the backward pass, (B, D)
in all, so the subtraction is still a fair "beyond what any loss holds".)
"""

from __future__ import annotations

import argparse
import os

# 8 virtual devices, set before jax is imported.
os.environ["XLA_FLAGS"] = (
  os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from hyperbolic_vl import objectives as objectives_lib  # noqa: E402
from hyperbolic_vl.training import sharding  # noqa: E402
from hyperbolic_vl.training import step as step_lib  # noqa: E402

GIB = 2**30


class GivenEmbeddings:
  """A model whose towers return the batch's embeddings unchanged."""

  def __init__(self, params, geometry):
    self.params, self.geometry = params, geometry

  def encode_image(self, image):
    return image

  def encode_text(self, tokens):
    return tokens

  def logit_scale(self):
    return jnp.exp(self.params["log_logit_scale"])

  def curv(self):
    return jnp.exp(self.params["log_curv"])

  def has_logit_bias(self):
    return "logit_bias" in self.params

  def learned_logit_bias(self):
    return self.params["logit_bias"]

  def alpha(self, which):
    del which
    return jnp.asarray(1.0)


class GivenEmbeddingsDef:
  def __init__(self, geometry):
    self.geometry = geometry

  def merge(self, params):
    return GivenEmbeddings(params, self.geometry)


def compiled_memory(
  objective_name: str, global_batch: int, embed: int, chunk: int, mesh, sigmoid_columns: str = ""
):
  """memory_analysis() of the loss step; sigmoid_columns "gathered"/"ring":
  the sigmoid loss with its columns visited that way ("": the softmax loss)."""
  geometry = "euclidean" if objective_name == "clip" else "lorentz"
  settings = {"name": objective_name, "logit_chunk_size": chunk}
  if sigmoid_columns:
    settings.update(pairwise_loss="sigmoid", sigmoid_columns=sigmoid_columns)
  objective = objectives_lib.get(settings)
  sharded = step_lib.make_sharded_loss(GivenEmbeddingsDef(geometry), objective, mesh)
  # Gradients w.r.t. the embeddings too: that is what flows into the towers.
  grad_fn = jax.value_and_grad(
    lambda params, batch: sharded(params, {}, batch, jax.random.key(0))[0], argnums=(0, 1)
  )
  params = {
    "log_logit_scale": jax.ShapeDtypeStruct((), jnp.float32),
    "log_curv": jax.ShapeDtypeStruct((), jnp.float32),
  }
  if sigmoid_columns:
    params["logit_bias"] = jax.ShapeDtypeStruct((), jnp.float32)
  rows = NamedSharding(mesh, P(step_lib.DATA_AXIS))
  batch = {
    "image": jax.ShapeDtypeStruct((global_batch, embed), jnp.float32, sharding=rows),
    "tokens": jax.ShapeDtypeStruct((global_batch, embed), jnp.float32, sharding=rows),
  }
  return jax.jit(grad_fn).lower(params, batch).compile().memory_analysis()


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--global_batches", default="8192,32768,65536")
  parser.add_argument("--chunk_sizes", default="1024,256")
  parser.add_argument("--embed", type=int, default=512)
  parser.add_argument("--objectives", default="clip,meru")
  parser.add_argument(
    "--sigmoid",
    default="",
    help="comma-separated column visits of the sigmoid loss to add (gathered, ring), "
    "each materialised and in every --chunk_sizes block",
  )
  args = parser.parse_args()
  mesh = sharding.make_mesh(8)
  print(
    f"devices: {mesh.devices.size} x {jax.devices()[0].device_kind}, embed {args.embed}, "
    "float32; per-device GiB from compile().memory_analysis()"
  )
  print(
    "| objective | global batch | logits | temp GiB | beyond embeddings GiB "
    "| args+outputs GiB | total GiB |"
  )
  print("|---|---|---|---|---|---|---|")
  # (chunk size, sigmoid column visit or "" for the softmax loss) of each row.
  chunks = [0] + [int(c) for c in filter(None, args.chunk_sizes.split(","))]
  visits = [""] + list(filter(None, args.sigmoid.split(",")))
  variants = [(chunk, visit) for visit in visits for chunk in chunks]
  for name in args.objectives.split(","):
    for global_batch in (int(b) for b in args.global_batches.split(",")):
      embeddings = 4 * global_batch * args.embed * 4 / GIB
      for chunk, visit in variants:
        stats = compiled_memory(name, global_batch, args.embed, chunk, mesh, visit)
        temp = stats.temp_size_in_bytes / GIB
        io = (stats.argument_size_in_bytes + stats.output_size_in_bytes) / GIB
        if visit:
          label = f"sigmoid, {visit}" + (f", chunk {chunk}" if chunk else "")
        else:
          label = "softmax, materialised" if not chunk else f"softmax, chunk {chunk}"
        print(
          f"| {name} | {global_batch} | {label} | {temp:.3f} | {temp - embeddings:.3f} "
          f"| {io:.3f} | {temp + io:.3f} |",
          flush=True,
        )


if __name__ == "__main__":
  main()
