"""Input health: the share of training examples the pipeline could not decode.

A bad sample in web data is skipped by the data source and counted; this
stops a run only when the skipped share passes `input.max_bad_fraction`.
"""

from __future__ import annotations

import numpy as np

from hyperbolic_vl import errors

_MIN_EXAMPLES_FOR_BAD_FRACTION = 1000


class InputHealth:
  """Counts the undecodable examples the input pipeline skipped.

  Batches carry host-side ``input/*`` entries, which this pops. Counts are
  this process's; a run stops when the skipped share of all examples read
  passes ``max_bad_fraction``, naming the first bad files.
  """

  def __init__(self, max_bad_fraction: float):
    self.max_bad_fraction = max_bad_fraction
    self.bad, self.read = 0, 0
    self._window_bad = 0
    self.first_names: list[str] = []

  def update(self, batch: dict) -> None:
    counts = batch.pop("input/bad_samples", None)
    names = batch.pop("input/bad_names", None)
    if counts is None:
      return
    bad = int(np.sum(counts))
    self.bad += bad
    self._window_bad += bad
    self.read += bad + len(counts)
    if bad and len(self.first_names) < 5:
      self.first_names += [n for row in names for n in str(row).split("\n") if n][:5]
    # Judged over at least _MIN_EXAMPLES_FOR_BAD_FRACTION examples, so two bad
    # files among the first batch do not end a run that a 1% limit allows.
    if self.bad > self.max_bad_fraction * max(self.read, _MIN_EXAMPLES_FOR_BAD_FRACTION):
      raise BadInputError(
        f"{self.bad} of {self.read} training examples read so far are bad (missing or "
        f"undecodable images, empty captions): {self.bad / self.read:.2%} > "
        f"input.max_bad_fraction={self.max_bad_fraction:.2%}; first: {self.first_names[:3]}"
      )

  def window_metrics(self) -> dict:
    """Bad examples since the last call, and the run's bad fraction."""
    if not self.read:
      return {}
    metrics = {
      "train/input/bad_samples": float(self._window_bad),
      "train/input/bad_fraction": self.bad / self.read,
    }
    self._window_bad = 0
    return metrics


class BadInputError(errors.DataError):
  """Too many training examples could not be decoded (a user's data: one
  line on the command line, exit code 2)."""
