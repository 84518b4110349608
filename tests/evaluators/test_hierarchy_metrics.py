"""HierarCaps P/R: the released threshold algorithm against a float64 NumPy reference.

The reference below is written from the protocol's description, one image
and one threshold at a time: thresholds linspace(min, max, 50) over the
root distances of all candidate texts; at each, the admitted text most
similar to the image; consecutive repeats collapse.
"""

import numpy as np
import pytest

from hyperbolic_vl.evaluators.metrics import hierarchy


def _reference_predictions(image, text, radius, similarity_fn, steps=50, omit_first=False):
  predictions = []
  for x in image:
    sequence = []
    for level in np.linspace(radius.min(), radius.max(), steps):
      admitted = [j for j in range(len(text)) if radius[j] <= level]
      best = max(admitted, key=lambda j: (similarity_fn(x, text[j]), -j))
      if not sequence or sequence[-1] != best:
        sequence.append(best)
    predictions.append(sequence[1:] if omit_first else sequence)
  return predictions


def _reference_pr(predictions, chains_per_image):
  precision, recall = [], []
  for pred, chains in zip(predictions, chains_per_image):
    gt = {t for c in chains for t in c}
    pred = set(pred)
    precision.append(len(pred & gt) / max(1, len(pred)))
    recall.append(np.mean([any(c[k] in pred for c in chains) for k in range(4)]))
  return np.mean(precision), np.mean(recall)


def _euclidean_case(rng, n=12, m=30, d=6):
  unit = lambda v: v / np.linalg.norm(v, axis=-1, keepdims=True)
  return unit(rng.normal(size=(n, d))), unit(rng.normal(size=(m, d))), unit(rng.normal(size=d))


@pytest.mark.parametrize("omit_first", [False, True])
def test_euclidean_thresholds_match_reference(omit_first):
  rng = np.random.default_rng(0)
  image, text, root = _euclidean_case(rng)
  radius = np.linalg.norm(text - root, axis=-1)
  expected = _reference_predictions(image, text, radius, np.dot, omit_first=omit_first)
  got = hierarchy.hierarchical_retrieval(
    image, text, geometry="euclidean", root=root, omit_first_prediction=omit_first
  )
  assert got == expected
  # Every image's first prediction (unless omitted) is the text nearest the root.
  if not omit_first:
    assert all(p[0] == int(np.argmin(radius)) for p in got)
  tiers = rng.integers(0, len(text), size=(len(image), 4))
  metrics = hierarchy.hierarchy_metrics(
    image, text, tiers, geometry="euclidean", root=root, omit_first_prediction=omit_first
  )
  precision, recall = _reference_pr(expected, [[list(t)] for t in tiers])
  assert metrics["precision"] == pytest.approx(precision, abs=1e-12)
  assert metrics["recall"] == pytest.approx(recall, abs=1e-12)


def test_lorentz_thresholds_use_origin_distance_and_lorentz_inner_product():
  rng = np.random.default_rng(1)
  curv = 0.7
  image, text = rng.normal(size=(10, 5)), rng.normal(size=(25, 5))
  time = lambda v: np.sqrt(1 / curv + v @ v)
  inner = lambda x, y: x @ y - time(x) * time(y)
  radius = np.array([np.arccosh(np.sqrt(curv) * time(t)) / np.sqrt(curv) for t in text])
  expected = _reference_predictions(image, text, radius, inner)
  got = hierarchy.hierarchical_retrieval(image, text, geometry="lorentz", curv=curv)
  assert got == expected


def test_multi_reference_images_pool_their_chains():
  rng = np.random.default_rng(2)
  image, text, root = _euclidean_case(rng, n=4)
  # Rows 0 and 1 are the same image with two reference chains.
  image[1] = image[0]
  tiers = rng.integers(0, len(text), size=(4, 4))
  keys = ["a", "a", "b", "c"]
  metrics = hierarchy.hierarchy_metrics(
    image, text, tiers, geometry="euclidean", root=root, image_keys=keys
  )
  radius = np.linalg.norm(text - root, axis=-1)
  expected = _reference_predictions(image[[0, 2, 3]], text, radius, np.dot)
  chains = [[list(tiers[0]), list(tiers[1])], [list(tiers[2])], [list(tiers[3])]]
  precision, recall = _reference_pr(expected, chains)
  assert metrics["precision"] == pytest.approx(precision, abs=1e-12)
  assert metrics["recall"] == pytest.approx(recall, abs=1e-12)


def test_interpolation_reading_stays_available_and_unknown_method_fails():
  rng = np.random.default_rng(3)
  image, text, root = _euclidean_case(rng)
  tiers = rng.integers(0, len(text), size=(len(image), 4))
  kw = dict(geometry="euclidean", root=root)
  interp = hierarchy.hierarchy_metrics(image, text, tiers, method="interpolation", **kw)
  direct = hierarchy.hierarchical_retrieval(image, text, method="interpolation", **kw)
  assert interp["mean_pred_length"] == pytest.approx(np.mean([len(p) for p in direct]))
  with pytest.raises(ValueError, match="unknown hierarchical retrieval method"):
    hierarchy.hierarchy_metrics(image, text, tiers, method="nearest", **kw)
