"""HyCoCLIP's hierarchical metrics: hand-computed figures on a small tree, a
few ImageNet classes on the shipped WordNet asset, and a set-and-BFS
re-implementation of the released per-image formulas on random pairs."""

import collections

import numpy as np
import pytest

from hyperbolic_vl.evaluators import hierarchical_classification as evaluator
from hyperbolic_vl.evaluators.datasets import benchmarks
from hyperbolic_vl.evaluators.metrics import hierarchical_classification as metrics

# The small tree (classes x, y, a2, b1; every other node is internal):
#
#          R
#        /   \
#       A     B
#      / \     \
#     a1  a2    b1
#    /  \
#   x    y
SMALL_PARENTS = {"A": "R", "B": "R", "a1": "A", "a2": "A", "b1": "B", "x": "a1", "y": "a1"}
SMALL_CLASSES = ["x", "y", "a2", "b1"]
X, Y, A2, B1 = range(4)
# Strict ancestors (root included): x, y: {a1, A, R}; a2: {A, R}; b1: {B, R}.
# (pred, true): tie = edges between them; I = shared ancestors;
# lca = |anc(pred)| - |I| + 1; J = |I| / |union|; P = |I| / |anc(pred)|;
# R = |I| / |anc(true)|.
SMALL_CASES = [
  # (pred, true, tie, lca, jaccard, precision, recall)
  (X, X, 0, 3 - 3 + 1, 1, 1, 1),  # correct: lca is 1, as the released formula gives
  (Y, X, 2, 3 - 3 + 1, 1, 1, 1),  # siblings y-a1-x: same ancestor sets
  (A2, X, 3, 2 - 2 + 1, 2 / 3, 2 / 2, 2 / 3),  # a2-A-a1-x; I = {A, R}, union {a1, A, R}
  (X, A2, 3, 3 - 2 + 1, 2 / 3, 2 / 3, 2 / 2),  # the reverse: x is two edges below A
  (B1, X, 5, 2 - 1 + 1, 1 / 4, 1 / 2, 1 / 3),  # b1-B-R-A-a1-x; I = {R}, union {a1, A, B, R}
]


def small_tree():
  return metrics.ClassTree.from_parents(SMALL_PARENTS, SMALL_CLASSES)


def test_small_tree_per_image_figures_are_the_hand_computed_ones():
  cases = np.array(SMALL_CASES, np.float64)
  got = metrics.per_image(small_tree(), cases[:, 0].astype(int), cases[:, 1].astype(int))
  for column, name in enumerate(metrics.FIGURES, start=2):
    np.testing.assert_allclose(got[name], cases[:, column], rtol=0, atol=1e-15, err_msg=name)


def test_small_tree_means_over_images():
  cases = np.array(SMALL_CASES)
  figures = metrics.hierarchical_figures(small_tree(), cases[:, 0], cases[:, 1])
  # tie (0+2+3+3+5)/5; lca (1+1+1+2+2)/5;
  # jaccard (1+1+2/3+2/3+1/4)/5 = 43/60; precision (1+1+1+2/3+1/2)/5 = 5/6;
  # recall (1+1+2/3+1+1/3)/5 = 4/5.
  assert figures == pytest.approx(
    {
      "tie": 13 / 5,
      "lca": 7 / 5,
      "jaccard": 43 / 60,
      "hier_precision": 5 / 6,
      "hier_recall": 4 / 5,
    },
    abs=1e-15,
  )


def test_malformed_trees_and_labels_are_refused():
  with pytest.raises(ValueError, match="exactly one root"):
    metrics.ClassTree.from_parents({"a": "R", "b": "S"}, ["a"])
  with pytest.raises(ValueError, match="not nodes"):
    metrics.ClassTree.from_parents(SMALL_PARENTS, ["x", "z"])
  with pytest.raises(ValueError, match="is the root"):
    metrics.ClassTree.from_parents(SMALL_PARENTS, ["x", "R"])
  with pytest.raises(ValueError, match="cycle"):
    metrics.ClassTree.from_parents({"a": "b", "b": "a", "c": "R", "x": "a"}, ["x"])
  with pytest.raises(ValueError, match="outside"):
    metrics.per_image(small_tree(), np.array([4]), np.array([0]))


def asset_ancestors(wnid):
  """Strict ancestors of a wnid, walked up the asset's parent map."""
  parents, chain = evaluator.imagenet_hierarchy()["parents"], []
  while wnid in parents:
    wnid = parents[wnid]
    chain.append(wnid)
  return chain


def test_imagenet_asset_is_a_tree_over_the_1000_classes():
  hierarchy = evaluator.imagenet_hierarchy()
  classes, parents = hierarchy["classes"], hierarchy["parents"]
  assert len(classes) == len(set(classes)) == 1000 and classes == sorted(classes)
  # The classes are exactly the leaves; every class reaches the one root.
  assert set(parents) - set(parents.values()) == set(classes)
  assert {asset_ancestors(c)[-1] for c in classes} == {hierarchy["root"]} == {"n00001930"}
  assert len(parents) == 1371
  # Class order is classnames.json's: index 1 goldfish, 281 tabby, 282 tiger cat.
  assert (classes[1], classes[281], classes[282]) == ("n01443537", "n02123045", "n02123159")
  names = benchmarks.zero_shot_dataset("imagenet").classnames
  assert (names[1], names[281], names[282]) == ("goldfish", "tabby cat", "tiger cat")


GOLDFISH, TABBY, TIGER_CAT = 1, 281, 282
DOMESTIC_CAT, VERTEBRATE = "n02121808", "n01471682"  # WordNet: domestic_cat.n.01, vertebrate.n.01


def test_imagenet_cats_and_goldfish_on_the_shipped_tree():
  classes = evaluator.imagenet_wnids()
  goldfish, tabby, tiger = (asset_ancestors(classes[i]) for i in (GOLDFISH, TABBY, TIGER_CAT))
  # Tabby and tiger cat are both domestic cats: same parent, same ancestors.
  assert tabby[0] == tiger[0] == DOMESTIC_CAT and tabby == tiger
  # A goldfish and a tiger cat first meet at "vertebrate".
  shared = [a for a in tiger if a in goldfish]
  assert shared[0] == VERTEBRATE
  up_fish, up_cat = goldfish.index(VERTEBRATE) + 1, tiger.index(VERTEBRATE) + 1  # edges
  assert (up_fish, up_cat, len(goldfish), len(tiger), len(shared)) == (5, 7, 10, 12, 6)
  got = metrics.per_image(
    evaluator.imagenet_tree(), np.array([TABBY, GOLDFISH]), np.array([TIGER_CAT, TIGER_CAT])
  )
  # tabby for tiger cat: two edges via domestic cat; equal ancestor sets.
  # goldfish for tiger cat: 5 + 7 edges; lca 10 - 6 + 1 = 5 (goldfish up to
  # vertebrate); jaccard 6 / (10 + 12 - 6); precision 6/10; recall 6/12.
  expected = {
    "tie": [2, up_fish + up_cat],
    "lca": [1, len(goldfish) - len(shared) + 1],
    "jaccard": [1, 6 / 16],
    "hier_precision": [1, 6 / 10],
    "hier_recall": [1, 6 / 12],
  }
  for name, values in expected.items():
    np.testing.assert_allclose(got[name], values, rtol=0, atol=1e-15, err_msg=name)


def released_style(parents, classes, pred, true):
  """The released per-image formulas: Python sets of strict ancestors and a
  breadth-first shortest path in the undirected is-a graph."""
  neighbours = collections.defaultdict(set)
  for child, parent in parents.items():
    neighbours[child].add(parent)
    neighbours[parent].add(child)

  def ancestors(c):
    out, node = set(), c
    while node in parents:
      node = parents[node]
      out.add(node)
    return out

  def distance(a, b):
    seen, frontier, steps = {a}, [a], 0
    while b not in seen:
      frontier = [n for f in frontier for n in neighbours[f] if n not in seen]
      seen.update(frontier)
      steps += 1
    return steps

  p, t = ancestors(classes[pred]), ancestors(classes[true])
  both = p & t
  return {
    "tie": distance(classes[pred], classes[true]),
    "lca": len(p) - len(both) + 1,
    "jaccard": len(both) / len(p | t),
    "hier_precision": len(both) / len(p),
    "hier_recall": len(both) / len(t),
  }


def test_imagenet_figures_equal_the_released_set_formulas_on_random_pairs():
  hierarchy = evaluator.imagenet_hierarchy()
  rng = np.random.default_rng(0)
  pred, true = rng.integers(0, 1000, 300), rng.integers(0, 1000, 300)
  pred[:20] = true[:20]  # some correct predictions
  got = metrics.per_image(evaluator.imagenet_tree(), pred, true, chunk=64)
  for row, (p, t) in enumerate(zip(pred, true)):
    want = released_style(hierarchy["parents"], hierarchy["classes"], p, t)
    for name, value in want.items():
      assert got[name][row] == pytest.approx(value, abs=1e-15), (name, p, t)
