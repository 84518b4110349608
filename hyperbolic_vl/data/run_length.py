"""A run's length from its data: `epochs` passes over the training rows.

A config with `total_steps = 0` and `epochs = E > 0` (HCL's and Radial's
paper variants, whose released scripts count epochs) trains

  total_steps = E * steps_per_epoch,
  steps_per_epoch = rows // batch         epoch_last_batch="drop" (a PyTorch
                                          DataLoader with drop_last=True, as
                                          HCL's released loader)
                  = ceil(rows / batch)    epoch_last_batch="fill" (every row
                                          at least once; the released Radial
                                          script's smaller last batch is
                                          filled from the next pass)

with `rows` the source's training rows (`DataSource.num_train_examples`,
e.g. a HierarCaps train CSV's rows) and `batch` the global batch. Batches
are cut from one continuous shuffled stream (data/pipeline.py), so an
"epoch" here is a count of steps; with "drop" each pass leaves its last
rows % batch rows to the next one. A `total_steps > 0` wins over `epochs`
(a short trial of a paper config). `optim.steps_per_epoch = 0` (the
per-epoch cosine schedule's, hyperbolic_vl/training/optimizer.py) is filled the same
way.

The trainer calls `resolve(config)` once, before the workdir's config.json
is written, so that file holds the resolved lengths.
"""

from __future__ import annotations

import copy
import math

from hyperbolic_vl import errors
from hyperbolic_vl.data import registry

LAST_BATCH = ("drop", "fill")


def steps_per_epoch(num_rows: int, batch_size: int, last_batch: str = "drop") -> int:
  """Steps of one pass over `num_rows` rows at global batch `batch_size`."""
  if last_batch not in LAST_BATCH:
    raise errors.ConfigError(f"epoch_last_batch={last_batch!r}; valid: {list(LAST_BATCH)}")
  if batch_size <= 0:
    raise errors.ConfigError(f"input.batch_size={batch_size} must be positive")
  steps = num_rows // batch_size if last_batch == "drop" else math.ceil(num_rows / batch_size)
  if steps <= 0:
    raise errors.ConfigError(
      f"the training data holds {num_rows} rows, less than one batch of {batch_size}"
    )
  return steps


def num_train_rows(input_config) -> int:
  """Rows in one pass over `config.input`'s training source."""
  source, _, settings = registry.read_config(input_config)
  return int(source.num_train_examples(settings))


def resolve(config):
  """`config` itself when its lengths are given, else a copy with
  total_steps (from epochs) and optim.steps_per_epoch filled from the data."""
  epochs = int(config.get("epochs", 0) or 0)
  total_steps = int(config.total_steps)
  optim = config.get("optim") or {}
  needs_epoch_steps = optim.get("schedule") == "cosine_per_epoch" and not optim.get(
    "steps_per_epoch", 0
  )
  if total_steps > 0 and not needs_epoch_steps:
    return config
  if total_steps <= 0 and epochs <= 0:
    raise errors.ConfigError(
      f"total_steps={total_steps} and epochs={epochs}: set total_steps > 0, or epochs > 0 "
      "with total_steps=0"
    )
  last_batch = config.get("epoch_last_batch", "drop")
  per_epoch = steps_per_epoch(
    num_train_rows(config.input), int(config.input.batch_size), last_batch
  )
  resolved = copy.deepcopy(config)
  with resolved.unlocked():
    if total_steps <= 0:
      resolved.total_steps = epochs * per_epoch
    if needs_epoch_steps:
      resolved.optim.steps_per_epoch = per_epoch
  return resolved
