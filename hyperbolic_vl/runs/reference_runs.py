"""Each method's reference curves as data: the logged rows of its tiny run
as configured, shipped with the package in reference_metrics/<method>.jsonl
(the metrics.jsonl layout, one {"step", "train/...": value} row per logged
step), so `python -m hyperbolic_vl.plot --workdir=RUN --compare=meru` draws
a run against them and the collapse warning's thresholds are tested on them.

The runs, their commits and machine are listed in
docs/training.md#reference-curves-of-every-tiny-variant; each row keeps the
losses, curvature, distances to the origin and cone shares the run logged
(not its throughput or logit scale).
"""

from __future__ import annotations

import os

from hyperbolic_vl import errors

FOLDER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "reference_metrics")
SUFFIX = ".jsonl"


def methods() -> list[str]:
  """The methods whose reference curves ship with the package, sorted."""
  return sorted(name.removesuffix(SUFFIX) for name in os.listdir(FOLDER) if name.endswith(SUFFIX))


def metrics_path(method: str) -> str:
  """The reference metrics.jsonl of `method`; one ConfigError line naming
  the known methods for any other name."""
  known = methods()
  if method not in known:
    raise errors.ConfigError(
      f"no reference curves for {method!r}; methods with reference curves: {', '.join(known)}"
    )
  return os.path.join(FOLDER, method + SUFFIX)
