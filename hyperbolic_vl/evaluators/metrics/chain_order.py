"""Hierarchy accuracy of chains ordered by distance to the origin (ATMG,
Ramasinghe et al., CVPR 2024, Tables 3-4 / 9-10).

A chain lists concepts most general first. With d[n, l] the distance to the
origin of level l of chain n (l = 0 the most general), every contiguous
window of k + 1 levels is a depth-k chain:

  depth-k accuracy = mean over n, i of  prod_{j=i}^{i+k-1} [d[n, j] < d[n, j+1]]

so depth 1 is the accuracy over all adjacent pairs and depth L-1 ("chain")
the fraction of whole chains ordered; `pair/<a>_<b>` is one adjacent pair's
accuracy. Ties count as wrong: the hierarchy asks for a strict order.
"""

from __future__ import annotations

import numpy as np


def chain_order_accuracy(distances, level_names) -> dict[str, float]:
  """Hierarchy accuracies of (N chains, L levels) distances, general first.

  {"depth<k>": k = 1 .. L-1, "chain": depth L-1, "pair/<a>_<b>": each
  adjacent pair, "mean_dist/<level>": mean distance per level}.
  """
  distances = np.asarray(distances)
  if distances.ndim != 2 or distances.shape[1] < 2:
    raise ValueError(f"distances must be (chains, levels >= 2), got {distances.shape}")
  levels = distances.shape[1]
  if len(level_names) != levels:
    raise ValueError(f"{len(level_names)} level names for {levels} levels")
  ordered = distances[:, 1:] > distances[:, :-1]  # (N, L-1): deeper = farther
  figures = {}
  for depth in range(1, levels):
    # Window i of `depth` pairs is right when all its pairs are.
    windows = np.stack([ordered[:, i : i + depth].all(1) for i in range(levels - depth)], 1)
    figures[f"depth{depth}"] = float(windows.mean())
  figures["chain"] = figures[f"depth{levels - 1}"]
  for i in range(levels - 1):
    figures[f"pair/{level_names[i]}_{level_names[i + 1]}"] = float(ordered[:, i].mean())
  for i, name in enumerate(level_names):
    figures[f"mean_dist/{name}"] = float(distances[:, i].mean())
  return figures
