"""The grain machinery every training source shares: example order, per-process
slices, reader threads and worker processes.

Training order. The train split is a finite range of example indices,
shuffled per epoch from ``seed`` and repeated forever (grain ``shuffle`` +
``repeat``). Global position ``p`` of that stream holds example
``index(p)`` of epoch ``p // num_examples``; global batch ``k`` is positions
``[k B, (k+1) B)``. Process ``i`` of ``n`` reads the contiguous slice
``[k B + i b, k B + (i+1) b)`` with ``b = B / n``, so concatenating the
processes' batches in process order gives exactly the single-process global
batch: runs are reproducible across pod sizes.

Checkpointing. The iterator is a grain ``DatasetIterator``: ``get_state()``
is a small JSON-serialisable dict, ``set_state()`` on a fresh iterator built
from the same config resumes with identical batches.

A source turns a batch of ``(position, index)`` pairs into its batch dict
(uint8 images, int32 tokens, ...); its randomness is drawn from generators
seeded by the seed, the epoch or position and the index, never from shared
state, so batches do not depend on threads, workers or process count.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import grain

from hyperbolic_vl.data import transforms


def check_layout(batch_size: int, process_index: int, process_count: int, seed: int) -> int:
  """This process's share of the global batch, after checking the layout."""
  if batch_size % process_count:
    raise ValueError(f"batch_size {batch_size} is not divisible by process_count {process_count}")
  if not 0 <= process_index < process_count:
    raise ValueError(f"process_index {process_index} not in [0, {process_count})")
  if seed < 0:
    raise ValueError(f"seed must be non-negative, got {seed}")
  return batch_size // process_count


def sliced_batches(
  num_examples: int,
  *,
  seed: int,
  batch_size: int,
  process_index: int,
  process_count: int,
  assemble: Callable[[Sequence[tuple[int, int]]], dict[str, Any]],
) -> grain.MapDataset:
  """This process's batches: `assemble` of its slice of each global batch of
  (global position, example index) pairs."""
  local_batch = check_layout(batch_size, process_index, process_count, seed)
  positions = (
    grain.MapDataset.range(num_examples)
    .shuffle(seed=seed)
    .repeat(None)  # infinite; reshuffled every epoch
    .map_with_index(lambda position, index: (position, index))
  )
  # Batch the cheap (position, index) pairs first, then keep every
  # process_count-th chunk: process i gets chunk k * n + i, i.e. the i-th
  # contiguous slice of global batch k, and only renders its own examples.
  return (
    positions.batch(local_batch, batch_fn=list)
    .slice(slice(process_index, None, process_count))
    .map(assemble)
  )


def iterate(
  batches: grain.MapDataset,
  *,
  num_threads: int = 1,
  prefetch_batches: int = 2,
  num_workers: int = 0,
) -> grain.DatasetIterator:
  """A checkpointable iterator over `batches`, read ahead by `num_threads`
  threads (and `num_workers` worker processes when positive)."""
  dataset = batches.to_iter_dataset(
    grain.ReadOptions(
      num_threads=num_threads,
      prefetch_buffer_size=max(prefetch_batches, num_threads) if num_threads else 0,
    )
  )
  if num_workers > 0:
    # grain's worker processes read absl flags; outside an absl app (tests,
    # notebooks) they are unparsed, so take their defaults.
    from absl import flags  # pylint: disable=g-import-not-at-top

    if not flags.FLAGS.is_parsed():
      flags.FLAGS.mark_as_parsed()
    dataset = dataset.mp_prefetch(
      grain.MultiprocessingOptions(
        num_workers=num_workers, per_worker_buffer_size=max(prefetch_batches, 1)
      )
    )
  return iter(dataset)


def iterate_input(batches: grain.MapDataset, input_settings) -> grain.DatasetIterator:
  """`iterate` with the reader threads, read-ahead and worker processes of
  `config.input` (a data.settings.InputSettings)."""
  return iterate(
    batches,
    num_threads=input_settings.num_threads,
    prefetch_batches=input_settings.prefetch_batches,
    num_workers=input_settings.num_workers,
  )


def example_input(
  make_example, encode, num_examples: int, input_settings, *, seed: int, **layout
) -> grain.DatasetIterator:
  """The training iterator of a source whose examples are
  `make_example(epoch, index)` for index < num_examples: this process's
  slice of the shuffled epochs, collated by `transforms.Assemble` (tokens by
  `encode`), read as `config.input` says. `layout`: process_index,
  process_count (and the rest `sliced_batches` takes)."""
  batches = sliced_batches(
    num_examples,
    seed=seed,
    batch_size=input_settings.batch_size,
    assemble=transforms.Assemble(make_example, encode, num_examples),
    **layout,
  )
  return iterate_input(batches, input_settings)
