"""Towers run over their rows in micro-batches: gradient accumulation for
batch-coupled losses (`optim.accumulation_steps`).

A contrastive loss couples every row with the whole batch, so the usual
accumulation (K losses on K slices of the batch, gradients summed) would
change the loss: each slice would see only its own negatives. Here the
loss is untouched and sees every embedding; only the towers, whose rows
are independent of each other, run in K micro-batches (the GradCache
scheme of Gao et al., 2021):

  forward:   `lax.map` over the K slices of a checkpointed tower call keeps
             the slices' inputs and the (rows, D) features, no activations;
  backward:  the map's transpose visits the slices one at a time,
             recomputes that slice's activations and adds its parameter
             gradients to the others'.

The gradient is therefore that of one step on the whole batch (sums
reassociated, nothing else; tests/train/test_accumulation.py), with the
tower activations of one micro-batch alive at a time, for one extra forward
pass of the towers. Objectives know nothing of it: the trainer switches a
merged model to micro-batches (`set_micro_batches`), as it switches batch
norms to training. A model with batch norms is refused by the trainer (its
rows are not independent in training); a method that updates state in place
must not run here, since a recomputed slice's updates are not kept.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
from flax import nnx


class MicroBatched:
  """Mixin of a model whose per-row methods go through `map_rows`:
  `micro_batches` (1, the default, runs every call whole) is set on a merged
  module by `set_micro_batches`."""

  micro_batches: int = 1


def supports(module: nnx.Module) -> bool:
  """Whether some part of `module` runs its rows in micro-batches."""
  return any(isinstance(sub, MicroBatched) for _, sub in nnx.iter_modules(module))


def set_micro_batches(module: nnx.Module, count: int) -> None:
  """Every `MicroBatched` part of a merged `module` runs in `count` micro-batches."""
  if count < 1:
    raise ValueError(f"micro-batch count must be >= 1, got {count}")
  module.set_attributes(MicroBatched, micro_batches=int(count))


def map_rows(module: nnx.Module, method: Callable, *rows: jax.Array) -> jax.Array:
  """`method(module, *rows)`, computed in `module.micro_batches` slices of the rows.

  Every array of `rows` has the same leading (row) axis and `method` treats
  each row on its own. A row count the slice count does not divide (a
  one-row root caption) is padded to whole slices with copies of its last
  row, whose outputs are dropped, so their gradient is exactly zero.
  """
  count = getattr(module, "micro_batches", 1)
  total = rows[0].shape[0]
  if count <= 1 or total <= 1:
    return method(module, *rows)
  size = -(-total // count)  # rows per micro-batch
  slices = -(-total // size)
  padded = slices * size

  def split(x: jax.Array) -> jax.Array:
    if padded > total:
      x = jnp.concatenate([x, jnp.repeat(x[-1:], padded - total, axis=0)])
    return x.reshape(slices, size, *x.shape[1:])

  graphdef, state = nnx.split(module)

  # Nothing saveable: the forward pass keeps only the slice's inputs. The
  # map's loop already keeps the forward and the recomputation apart, so no
  # barrier against common-subexpression elimination is needed.
  @functools.partial(jax.checkpoint, prevent_cse=False)
  def one_slice(state, index, slice_rows):
    merged = nnx.merge(graphdef, state)
    # Parts that draw random numbers per row (LoRA's dropout) draw other
    # numbers in each slice instead of repeating the first slice's.
    for _, part in nnx.iter_modules(merged):
      if hasattr(part, "fold_in_slice"):
        part.fold_in_slice(index)
    return method(merged, *slice_rows)

  indices = jnp.arange(slices)
  out = jax.lax.map(lambda xs: one_slice(state, xs[0], xs[1]), (indices, tuple(map(split, rows))))
  return out.reshape(padded, *out.shape[2:])[:total]
