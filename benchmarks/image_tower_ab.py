"""The image tower's forward + backward, two ways in alternating rounds.

  python benchmarks/image_tower_ab.py --compare=patch_embedding --threads=1
  python benchmarks/image_tower_ab.py --compare=patch_embedding_alone --threads=1
  python benchmarks/image_tower_ab.py --compare=token_drop --threads=1
  python benchmarks/image_tower_ab.py --compare=pooled_row --threads=1

patch_embedding: the ViT's patch embedding as the strided conv it used to
run (`patch_embed` applied to the pixels) against the matrix product on
flattened patches it runs now (`VisionTransformer.embed_patches`); the rest
of the tower is the same code. patch_embedding_alone: the same two patch
embeddings without the encoder (their own cost, which the whole tower's
run-to-run noise on a shared machine can hide). token_drop: the tower on whole images against
`--drop` of each image's patches dropped (`model.image_token_drop`'s path).
pooled_row: the last block computing every row, of which the tower reads
CLS's (the towers before commit 144e2eb), against it computing CLS's row
alone (`transformer.Encoder`'s `output_position`, what the tower runs).
Both sides are compiled first, then rounds alternate (A, B, A, ...) so that
the load of a shared machine hits both; medians are printed, with the load
average. The process is pinned to `--threads` cores (XLA:CPU ignores its
thread flags). Gradients are taken for the params only, as in training.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

PARSER = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
PARSER.add_argument(
  "--compare",
  choices=("patch_embedding", "patch_embedding_alone", "token_drop", "pooled_row"),
  required=True,
)
PARSER.add_argument("--variant", default="S/16")
PARSER.add_argument("--image_size", type=int, default=224)
PARSER.add_argument("--batch_size", type=int, default=8)
PARSER.add_argument("--drop", type=float, default=0.5)
PARSER.add_argument("--threads", type=int, default=1)
PARSER.add_argument("--rounds", type=int, default=5)
PARSER.add_argument("--steps", type=int, default=2, help="timed calls per round")
ARGS = PARSER.parse_args() if __name__ == "__main__" else None
if ARGS is not None:
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  os.sched_setaffinity(0, set(sorted(os.sched_getaffinity(0))[: ARGS.threads]))
  from hyperbolic_vl.training import host_memory

  # As the trainer runs on a CPU, set before JAX starts its threads.
  host_memory.keep_freed_host_memory("cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from flax import nnx  # noqa: E402

from hyperbolic_vl.models import lora, vit  # noqa: E402


def conv_patch_tower(tower, images):
  """The tower with its patch embedding as the strided conv (the old path)."""
  pixels = vit.normalized_pixels(images, tower.pixel_mean, tower.pixel_std, tower.dtype)
  batch = images.shape[0]
  tokens = tower.patch_embed(pixels).reshape(batch, tower.num_patches, tower.width)
  position = tower.position_embedding()
  tokens = tokens + jnp.asarray(position[1:], tower.dtype)
  cls = tower.cls_token[...][0] + jnp.asarray(position[:1], tower.dtype)
  tokens = jnp.concatenate([jnp.broadcast_to(cls, (batch, 1, tower.width)), tokens], axis=1)
  return tower.norm(tower.encoder(tokens, output_position=jnp.zeros((batch,), jnp.int32)))


def every_row_tower(tower, images):
  """The tower with its last block computing every row (the old path)."""
  return tower.norm(tower.encoder(tower.encoder_input(images))[:, 0])


def timed(fn, args, steps):
  t0 = time.perf_counter()
  for _ in range(steps):
    out = fn(*args)
  jax.block_until_ready(out)
  return (time.perf_counter() - t0) / steps


def main():
  tower = vit.VisionTransformer(ARGS.variant, ARGS.image_size, rngs=nnx.Rngs(params=0))
  graphdef, params = nnx.split(tower, nnx.Param)
  images = jax.random.uniform(
    jax.random.key(1), (ARGS.batch_size, ARGS.image_size, ARGS.image_size, 3)
  )
  keep = vit.random_keep_indices(jax.random.key(2), ARGS.batch_size, tower.num_patches, ARGS.drop)

  def grad_fn(forward):
    def loss(p, x, k):
      return jnp.mean(jnp.square(forward(nnx.merge(graphdef, p), x, k)))

    return jax.jit(jax.grad(loss))

  if ARGS.compare == "patch_embedding":
    sides = {
      "conv": grad_fn(lambda t, x, k: conv_patch_tower(t, x)),
      "matmul": grad_fn(lambda t, x, k: t(x)),
    }
  elif ARGS.compare == "patch_embedding_alone":

    def conv_alone(t, x, k):
      pixels = vit.normalized_pixels(x, t.pixel_mean, t.pixel_std, t.dtype)
      return t.patch_embed(pixels)

    def matmul_alone(t, x, k):
      pixels = vit.normalized_pixels(x, t.pixel_mean, t.pixel_std, t.dtype)
      return t.embed_patches(lora.patches(pixels, t.patch_size))

    sides = {"conv": grad_fn(conv_alone), "matmul": grad_fn(matmul_alone)}
  elif ARGS.compare == "pooled_row":
    sides = {
      "every row": grad_fn(lambda t, x, k: every_row_tower(t, x)),
      "CLS row alone": grad_fn(lambda t, x, k: t(x)),
    }
  else:
    sides = {
      "whole images": grad_fn(lambda t, x, k: t(x)),
      f"{ARGS.drop:.0%} dropped": grad_fn(lambda t, x, k: t(x, keep_indices=k)),
    }
  args = (params, images, keep)
  for fn in sides.values():
    jax.block_until_ready(fn(*args))
  times = {name: [] for name in sides}
  for _ in range(ARGS.rounds):
    for name, fn in sides.items():
      times[name].append(timed(fn, args, ARGS.steps))
  (name_a, a), (name_b, b) = ((n, statistics.median(t)) for n, t in times.items())
  print(
    f"{ARGS.compare}: ViT-{ARGS.variant} {ARGS.image_size} px, batch {ARGS.batch_size}, float32, "
    f"{ARGS.threads} core(s), forward + backward, median of {ARGS.rounds} alternating rounds"
  )
  for name, values in times.items():
    print(
      f"  {name}: {statistics.median(values) * 1e3:.1f} ms  (rounds: "
      + ", ".join(f"{v * 1e3:.0f}" for v in values)
      + ")"
    )
  print(f"  {name_b} / {name_a} speed: {a / b:.2f}x; load average {os.getloadavg()}")


if __name__ == "__main__":
  main()
