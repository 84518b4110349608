"""Hierarchical classification metrics (HyCoCLIP's, Pal et al. 2025): how far
in a class tree a classifier's mistakes land, computed as HyCoCLIP's released
evaluation computes them.

For a class c, anc(c) is the set of its strict ancestors: every node from its
parent up to the root, the root included, c itself excluded. For a predicted
class p and a true class t, with I = anc(p) & anc(t):

  tie            tree-induced error: the number of edges on the tree path
                 between p and t (0 when p == t)
  lca            |anc(p)| - |I| + 1: for two different leaves, the number of
                 edges from p up to the lowest common ancestor; 1 (not 0)
                 when p == t, as the released formula gives
  jaccard        |I| / |anc(p) | anc(t)|
  hier_precision |I| / |anc(p)|
  hier_recall    |I| / |anc(t)|

Each figure is the mean over images (lower is better for tie and lca, higher
for the other three). Because the sets leave the classes out, a wrong guess
among siblings scores like a correct one on jaccard, precision and recall.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import numpy as np

FIGURES = ("tie", "lca", "jaccard", "hier_precision", "hier_recall")


@dataclasses.dataclass(frozen=True)
class ClassTree:
  """A rooted tree whose nodes include the classes.

  nodes: node names; parent: (N,) parent node index, -1 at the root;
  class_nodes: (C,) the node index of each class, in class-index order."""

  nodes: tuple[str, ...]
  parent: np.ndarray
  class_nodes: np.ndarray

  @classmethod
  def from_parents(cls, parents: Mapping[str, str], classes: Sequence[str]) -> ClassTree:
    """A tree from a child -> parent map; `classes` in class-index order.
    ValueError unless the map is a tree with one root holding every class
    (no root class: its ancestor set would be empty)."""
    names = sorted(set(parents) | set(parents.values()))
    roots = [n for n in names if n not in parents]
    if len(roots) != 1:
      raise ValueError(f"the parent map must have exactly one root; it has {roots[:5]}")
    index = {name: i for i, name in enumerate(names)}
    parent = np.array([index[parents[n]] if n in parents else -1 for n in names], np.int64)
    missing = [c for c in classes if c not in index]
    if missing:
      raise ValueError(f"classes {missing[:5]} are not nodes of the tree")
    if roots[0] in classes:
      raise ValueError(f"class {roots[0]!r} is the root: it has no ancestors")
    tree = cls(tuple(names), parent, np.array([index[c] for c in classes], np.int64))
    tree.paths()  # raises on a cycle
    return tree

  @property
  def num_classes(self) -> int:
    return len(self.class_nodes)

  def paths(self) -> np.ndarray:
    """(C, N) bool: row c marks the nodes from class c up to the root,
    both ends included."""
    paths = np.zeros((self.num_classes, len(self.nodes)), bool)
    for row, node in enumerate(self.class_nodes):
      steps = 0
      while node >= 0:
        if paths[row, node] or steps > len(self.nodes):
          raise ValueError(f"the parent map has a cycle through {self.nodes[node]!r}")
        paths[row, node] = True
        node = self.parent[node]
        steps += 1
    return paths


def per_image(
  tree: ClassTree, predictions: np.ndarray, labels: np.ndarray, chunk: int = 4096
) -> dict[str, np.ndarray]:
  """(N,) predicted and true class indices -> {figure: (N,) float64}."""
  predictions = np.asarray(predictions, np.int64)
  labels = np.asarray(labels, np.int64)
  if predictions.shape != labels.shape or predictions.ndim != 1:
    raise ValueError(f"{predictions.shape} predictions for {labels.shape} labels")
  for name, values in (("predictions", predictions), ("labels", labels)):
    if values.size and (values.min() < 0 or values.max() >= tree.num_classes):
      raise ValueError(f"{name} outside [0, {tree.num_classes})")
  paths = tree.paths()
  ancestors = paths.copy()
  ancestors[np.arange(tree.num_classes), tree.class_nodes] = False
  out = {name: np.empty(len(labels)) for name in FIGURES}
  for begin in range(0, len(labels), chunk):
    p, t = predictions[begin : begin + chunk], labels[begin : begin + chunk]
    rows = slice(begin, begin + len(p))
    # Paths to the root share exactly the nodes from the lowest common
    # ancestor up, so their symmetric difference is the path between p and t.
    shared_path = (paths[p] & paths[t]).sum(1)
    out["tie"][rows] = paths[p].sum(1) + paths[t].sum(1) - 2 * shared_path
    predicted, true = ancestors[p].sum(1), ancestors[t].sum(1)
    shared = (ancestors[p] & ancestors[t]).sum(1)
    out["lca"][rows] = predicted - shared + 1
    out["jaccard"][rows] = shared / (predicted + true - shared)
    out["hier_precision"][rows] = shared / predicted
    out["hier_recall"][rows] = shared / true
  return out


def hierarchical_figures(
  tree: ClassTree, predictions: np.ndarray, labels: np.ndarray
) -> dict[str, float]:
  """{tie, lca, jaccard, hier_precision, hier_recall}: per-image means."""
  if len(labels) == 0:
    raise ValueError("no images to average over")
  return {
    name: float(values.mean()) for name, values in per_image(tree, predictions, labels).items()
  }
