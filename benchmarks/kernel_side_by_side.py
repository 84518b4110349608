"""The MERU ViT-S step's two kinds of kernels, ours against PyTorch's, on a CPU.

Where the training step's time goes is matrix products: the dense layers'
(forward, input gradient, weight gradient) and attention's. This times each
alone, forward and backward, at the shapes the side by side
(benchmarks/torch_step_side_by_side.py --shapes=vit_s) trains: ViT-S/16 at
batch 8 (197 tokens of width 384, MLP 1536, 12 heads of 32) and MERU's text
tower (77 tokens of width 512, MLP 2048, 8 heads of 64).

Ours: `cpu_gradients.linear` (what the towers' dense layers run on a CPU)
and `cpu_gradients.softmax_attention`, jitted with their gradients, so
XLA:CPU picks its kernels (YNNPACK's or Eigen's) as in the step. PyTorch's:
`torch.nn.functional.linear` and `scaled_dot_product_attention` in eager
mode, with autograd. Rounds alternate between the two; medians are printed,
per shape and summed over one block of each tower (the step runs 12 of each).

  pip install -e '.[bench]'
  python benchmarks/kernel_side_by_side.py --threads=2
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time


def _args():
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--threads", type=int, default=2, help="cores the process is pinned to")
  parser.add_argument("--rounds", type=int, default=5)
  parser.add_argument("--calls", type=int, default=10, help="timed calls per round")
  return parser.parse_args()


ARGS = _args() if __name__ == "__main__" else None
if ARGS is not None:
  # As in the side by side: both libraries get exactly `threads` cores.
  os.sched_setaffinity(0, set(sorted(os.sched_getaffinity(0))[: ARGS.threads]))
  os.environ.setdefault("JAX_PLATFORMS", "cpu")

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

if ARGS is not None:
  # Freed host memory kept for reuse, as the trainer and the side by side run
  # (training/host_memory.py); otherwise every call's fresh output buffers
  # would be mapped and faulted in again, on both sides.
  from hyperbolic_vl.training import host_memory

  print(host_memory.keep_freed_host_memory("cpu"), flush=True)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from hyperbolic_vl.models import cpu_gradients  # noqa: E402

BATCH = 8
# (name, rows, in, out): the dense layers of one block of each tower.
DENSE = (
  ("image qkv", BATCH * 197, 384, 3 * 384),
  ("image out", BATCH * 197, 384, 384),
  ("image fc1", BATCH * 197, 384, 1536),
  ("image fc2", BATCH * 197, 1536, 384),
  ("text qkv", BATCH * 77, 512, 3 * 512),
  ("text out", BATCH * 77, 512, 512),
  ("text fc1", BATCH * 77, 512, 2048),
  ("text fc2", BATCH * 77, 2048, 512),
)
# (name, heads, tokens, head width, causal)
ATTENTION = (("image attention", 12, 197, 32, False), ("text attention", 8, 77, 64, True))


def our_dense(rows, fan_in, fan_out, rng):
  x, kernel, cotangent = (
    jnp.asarray(rng.standard_normal(shape, dtype=np.float32))
    for shape in ((rows, fan_in), (fan_in, fan_out), (rows, fan_out))
  )
  bias = jnp.zeros((fan_out,), jnp.float32)

  def step(x, kernel, bias):
    # The output is returned beside the gradients: unused, XLA would drop
    # the forward product.
    output, backward = jax.vjp(cpu_gradients.linear, x, kernel, bias)
    return output, backward(cotangent)

  step = jax.jit(step).lower(x, kernel, bias).compile()
  return lambda: jax.block_until_ready(step(x, kernel, bias))


def torch_dense(rows, fan_in, fan_out, rng):
  import torch

  x = torch.tensor(rng.standard_normal((rows, fan_in), dtype=np.float32), requires_grad=True)
  weight = torch.tensor(
    rng.standard_normal((fan_out, fan_in), dtype=np.float32), requires_grad=True
  )
  bias = torch.zeros(fan_out, requires_grad=True)
  cotangent = torch.tensor(rng.standard_normal((rows, fan_out), dtype=np.float32))

  def call():
    # Gradients set to None first, as the step's zero_grad(set_to_none=True)
    # does: backward then writes them afresh instead of adding to them.
    x.grad = weight.grad = bias.grad = None
    torch.nn.functional.linear(x, weight, bias).backward(cotangent)

  return call


def our_attention(heads, tokens, width, causal, rng):
  query, key, value, cotangent = (
    jnp.asarray(rng.standard_normal((BATCH, heads, tokens, width), dtype=np.float32))
    for _ in range(4)
  )
  allowed = jnp.ones((1, 1, tokens, tokens), bool)
  if causal:
    allowed = jnp.tril(allowed)

  def step(query, key, value):
    output, backward = jax.vjp(
      lambda q, k, v: cpu_gradients.softmax_attention(q, k, v, allowed), query, key, value
    )
    return output, backward(cotangent)

  step = jax.jit(step).lower(query, key, value).compile()
  return lambda: jax.block_until_ready(step(query, key, value))


def torch_attention(heads, tokens, width, causal, rng):
  import torch

  query, key, value = (
    torch.tensor(
      rng.standard_normal((BATCH, heads, tokens, width), dtype=np.float32), requires_grad=True
    )
    for _ in range(3)
  )
  cotangent = torch.tensor(rng.standard_normal((BATCH, heads, tokens, width), dtype=np.float32))

  def call():
    query.grad = key.grad = value.grad = None
    attended = torch.nn.functional.scaled_dot_product_attention(query, key, value, is_causal=causal)
    attended.backward(cotangent)

  return call


def milliseconds(call, calls):
  start = time.perf_counter()
  for _ in range(calls):
    call()
  return (time.perf_counter() - start) / calls * 1e3


def main():
  import torch

  torch.set_num_threads(ARGS.threads)
  print(f"jax {jax.__version__}, torch {torch.__version__}, {ARGS.threads} cores, float32")
  rng = np.random.default_rng(0)
  cases = [(name, our_dense(*shape, rng), torch_dense(*shape, rng)) for name, *shape in DENSE]
  cases += [
    (name, our_attention(*shape, rng), torch_attention(*shape, rng)) for name, *shape in ATTENTION
  ]
  print("| kernel, forward + backward | ours ms | PyTorch ms | speed-up ours vs PyTorch |")
  print("|---|---|---|---|")
  totals = {"dense": [0.0, 0.0], "attention": [0.0, 0.0]}
  for name, ours, theirs in cases:
    ours(), theirs()  # compile, first-call allocations
    our_times, their_times = [], []
    for _ in range(ARGS.rounds):
      our_times.append(milliseconds(ours, ARGS.calls))
      their_times.append(milliseconds(theirs, ARGS.calls))
    our_ms, their_ms = statistics.median(our_times), statistics.median(their_times)
    kind = "attention" if "attention" in name else "dense"
    totals[kind][0] += our_ms
    totals[kind][1] += their_ms
    print(f"| {name} | {our_ms:.2f} | {their_ms:.2f} | {their_ms / our_ms:.2f}x |", flush=True)
  for kind, (our_ms, their_ms) in totals.items():
    print(
      f"| one block of each tower, {kind} | {our_ms:.2f} | {their_ms:.2f} "
      f"| {their_ms / our_ms:.2f}x |"
    )


if __name__ == "__main__":
  main()
