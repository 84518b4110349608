"""Input-pipeline throughput: images/s of a config's training iterator alone.

Reads, decodes and augments batches exactly as training does (the data
source's iterator, this process's slice), without a model, so the figure is the
rate at which the input side could feed the step.
"""

from __future__ import annotations

import time

from hyperbolic_vl.data import registry as data_registry
from hyperbolic_vl.data import tokenizer as tokenizer_lib


def measure_input(config, steps: int, warmup: int = 2) -> dict:
  """{"images_per_sec", "seconds_per_batch", "batch_size"} over `steps` batches."""
  if steps < 1:
    raise ValueError(f"steps must be positive, got {steps}")
  tokenizer = tokenizer_lib.get_tokenizer(config.input.tokenizer)
  iterator = data_registry.make_train_iterator(config.input, tokenizer, seed=config.seed)
  for _ in range(warmup):  # thread start-up and first reads are not timed
    next(iterator)
  start = time.perf_counter()
  images = 0
  for _ in range(steps):
    images += len(next(iterator)["image"])
  elapsed = time.perf_counter() - start
  return {
    "images_per_sec": images / elapsed,
    "seconds_per_batch": elapsed / steps,
    "batch_size": images // steps,
  }


def print_input_benchmark(config, steps: int, warmup: int = 2) -> dict:
  result = measure_input(config, steps, warmup)
  print(
    f"input only: {result['images_per_sec']:.1f} images/s "
    f"({result['seconds_per_batch'] * 1e3:.1f} ms per batch of {result['batch_size']}, "
    f"{steps} batches)",
    flush=True,
  )
  return result
