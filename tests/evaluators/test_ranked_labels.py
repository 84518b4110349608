"""Average precision, 11-point AP, AUC-ROC and paired accuracy: hand-computed
cases, and NumPy re-implementations of the definitions on random scores
with many ties (scores rounded to one decimal)."""

import numpy as np
import pytest
from sklearn.metrics import average_precision_score, roc_auc_score

from hyperbolic_vl.evaluators.metrics import ranked_labels


def test_average_precision_hand_computed():
  # Ranked: + - + -  -> precision at the positives 1/1 and 2/3 -> AP (1 + 2/3) / 2.
  scores = [0.9, 0.8, 0.7, 0.1]
  labels = [1, 0, 1, 0]
  assert ranked_labels.average_precision(scores, labels) == pytest.approx(5 / 6, abs=1e-15)
  # A tie of a positive with a negative is one threshold: precision 1/2 there, for both orders.
  assert ranked_labels.average_precision([0.5, 0.5], [1, 0]) == 0.5
  assert ranked_labels.average_precision([0.5, 0.5], [0, 1]) == 0.5


def test_eleven_point_hand_computed():
  # + - + - : recall 0.5 at precision 1, recall 1 at precision 2/3.
  # Levels 0..0.5 (6 of them) take max precision 1; 0.6..1 (5) take 2/3.
  scores, labels = [0.9, 0.8, 0.7, 0.1], [1, 0, 1, 0]
  want = (6 * 1 + 5 * 2 / 3) / 11
  assert ranked_labels.eleven_point_average_precision(scores, labels) == pytest.approx(
    want, abs=1e-15
  )


def test_auc_hand_computed():
  # Positives 0.9, 0.5; negatives 0.5, 0.1: pairs (0.9>0.5) 1, (0.9>0.1) 1,
  # (0.5=0.5) 1/2, (0.5>0.1) 1 -> 3.5 / 4.
  assert ranked_labels.roc_auc([0.9, 0.5, 0.5, 0.1], [1, 1, 0, 0]) == 3.5 / 4


def test_paired_accuracy_counts_ties_wrong():
  assert ranked_labels.paired_accuracy([0.3, 0.5, 0.2], [0.1, 0.5, 0.4]) == 1 / 3


def reference_ap(scores, labels):
  """Sum over distinct thresholds t (highest first) of (recall(t) - recall(prev)) * precision(t)."""
  total, previous_recall = 0.0, 0.0
  for threshold in sorted(set(scores), reverse=True):
    chosen = scores >= threshold
    recall = (chosen & labels).sum() / labels.sum()
    total += (recall - previous_recall) * (chosen & labels).sum() / chosen.sum()
    previous_recall = recall
  return total


def reference_eleven_point(scores, labels):
  points = []
  for threshold in sorted(set(scores), reverse=True):
    chosen = scores >= threshold
    points.append(((chosen & labels).sum() / labels.sum(), (chosen & labels).sum() / chosen.sum()))
  return np.mean(
    [max([p for r, p in points if r >= level - 1e-12], default=0.0) for level in np.arange(11) / 10]
  )


def reference_auc(scores, labels):
  pos, neg = scores[labels], scores[~labels]
  return np.mean([(p > n) + 0.5 * (p == n) for p in pos for n in neg])


@pytest.mark.parametrize("seed", range(5))
def test_definitions_match_numpy_and_sklearn_on_tied_random_scores(seed):
  rng = np.random.default_rng(seed)
  scores = np.round(rng.uniform(size=60), 1)  # ~10 distinct values: many ties
  labels = rng.uniform(size=60) < 0.3
  labels[:2] = [True, False]
  ap = ranked_labels.average_precision(scores, labels)
  assert ap == pytest.approx(reference_ap(scores, labels), abs=1e-12)
  assert ap == pytest.approx(average_precision_score(labels, scores), abs=1e-12)
  assert ranked_labels.eleven_point_average_precision(scores, labels) == pytest.approx(
    reference_eleven_point(scores, labels), abs=1e-12
  )
  auc = ranked_labels.roc_auc(scores, labels)
  assert auc == pytest.approx(reference_auc(scores, labels), abs=1e-12)
  assert auc == pytest.approx(roc_auc_score(labels, scores), abs=1e-12)


def test_mean_average_precision_skips_classes_without_positives_and_ignored_items():
  scores = np.array([[0.9, 0.1, 0.5], [0.8, 0.7, 0.4], [0.2, 0.6, 0.3]])
  labels = np.array([[1, 0, 0], [0, 1, 0], [1, 1, 0]], bool)
  ignore = np.zeros_like(labels)
  ignore[1, 0] = True  # the negative 0.8 left out of class 0: its AP becomes 1
  result = ranked_labels.mean_average_precision(scores, labels, ignore=ignore)
  # Class 0 ranking (0.9 +, 0.2 +): AP 1. Class 1 (0.7 +, 0.6 +, 0.1 -): AP 1. Class 2: no positive.
  assert result["map"] == 1.0
  assert np.isnan(result["per_class"][2])
  without_ignore = ranked_labels.mean_average_precision(scores, labels)
  # Class 0 without ignoring: + - +  -> (1 + 2/3) / 2.
  assert without_ignore["map"] == pytest.approx(((1 + 2 / 3) / 2 + 1) / 2, abs=1e-15)
