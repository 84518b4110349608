"""Figures of scores against binary labels: average precision (the VOC /
COCO multi-label mAP, entailment detection), the VOC 2007 devkit's 11-point
average precision, the area under the ROC curve, and the paired accuracy of
SugarCrepe and VL-Checklist.

Ties. Average precision and AUC-ROC count scores that tie as one threshold:
precision is taken once per distinct score (so the order of tied items never
matters) and a tied positive/negative pair counts one half for the AUC (the
Mann-Whitney statistic). The paired accuracy counts a tie as wrong: the
released SugarCrepe and VL-Checklist scripts test `positive > negative`.
"""

from __future__ import annotations

import numpy as np


def _checked(scores, labels) -> tuple[np.ndarray, np.ndarray]:
  scores = np.asarray(scores, np.float64).ravel()
  labels = np.asarray(labels).ravel()
  if scores.shape != labels.shape:
    raise ValueError(f"{scores.shape} scores for {labels.shape} labels")
  if not np.isfinite(scores).all():
    raise ValueError("scores hold NaN or infinite values")
  return scores, labels.astype(bool)


def _threshold_counts(scores: np.ndarray, labels: np.ndarray):
  """True and false positives at each distinct score, highest first."""
  order = np.argsort(-scores, kind="stable")
  scores, labels = scores[order], labels[order]
  # The last item of each run of equal scores closes that threshold.
  last_of_tie = np.r_[np.flatnonzero(np.diff(scores) != 0), len(scores) - 1]
  true_positives = np.cumsum(labels)[last_of_tie]
  false_positives = (last_of_tie + 1) - true_positives
  return true_positives, false_positives


def average_precision(scores, labels) -> float:
  """Sum over thresholds of (recall gain) x precision: the non-interpolated
  average precision (each positive's precision at its score, ties grouped).
  NaN when no item is positive."""
  scores, labels = _checked(scores, labels)
  positives = int(labels.sum())
  if positives == 0:
    return float("nan")
  true_positives, false_positives = _threshold_counts(scores, labels)
  precision = true_positives / (true_positives + false_positives)
  recall_gain = np.diff(np.r_[0, true_positives]) / positives
  return float(np.sum(recall_gain * precision))


def eleven_point_average_precision(scores, labels) -> float:
  """The VOC 2007 devkit's AP: the mean over recall r in {0, 0.1, ..., 1} of
  the highest precision at recall >= r (0 where recall r is never reached)."""
  scores, labels = _checked(scores, labels)
  positives = int(labels.sum())
  if positives == 0:
    return float("nan")
  true_positives, false_positives = _threshold_counts(scores, labels)
  precision = true_positives / (true_positives + false_positives)
  recall = true_positives / positives
  levels = np.linspace(0.0, 1.0, 11)
  # 1e-12: recall is k/positives, so a level equal to it in exact arithmetic
  # may sit one rounding step above it (0.3 vs 3/10 computed).
  best = [precision[recall >= level - 1e-12].max(initial=0.0) for level in levels]
  return float(np.mean(best))


def mean_average_precision(scores, labels, eleven_point: bool = False, ignore=None) -> dict:
  """(N, C) scores and (N, C) binary labels -> {"map": mean over the classes
  with at least one positive, "per_class": (C,) AP, NaN for a class without
  positives}. ignore: (N, C) bool, items left out of a class's ranking (VOC's
  "difficult" images)."""
  scores = np.asarray(scores, np.float64)
  labels = np.asarray(labels).astype(bool)
  if scores.ndim != 2 or scores.shape != labels.shape:
    raise ValueError(f"scores {scores.shape} and labels {labels.shape} must be equal (N, C)")
  ignore = np.zeros_like(labels) if ignore is None else np.asarray(ignore, bool)
  metric = eleven_point_average_precision if eleven_point else average_precision
  per_class = np.array(
    [metric(scores[~ignore[:, c], c], labels[~ignore[:, c], c]) for c in range(scores.shape[1])]
  )
  present = ~np.isnan(per_class)
  if not present.any():
    raise ValueError("no class has a positive item")
  return {"map": float(per_class[present].mean()), "per_class": per_class}


def roc_auc(scores, labels) -> float:
  """Probability that a positive scores above a negative, ties one half."""
  scores, labels = _checked(scores, labels)
  positives, negatives = int(labels.sum()), int((~labels).sum())
  if positives == 0 or negatives == 0:
    raise ValueError("AUC-ROC needs at least one positive and one negative")
  # Mid-ranks: tied scores share the mean of their ranks.
  order = np.argsort(scores, kind="stable")
  ranks = np.empty(len(scores))
  sorted_scores = scores[order]
  starts = np.r_[0, np.flatnonzero(np.diff(sorted_scores) != 0) + 1]
  ends = np.r_[starts[1:], len(scores)]
  for start, end in zip(starts, ends):
    ranks[order[start:end]] = 0.5 * (start + end - 1) + 1
  rank_sum = ranks[labels].sum()
  return float((rank_sum - positives * (positives + 1) / 2) / (positives * negatives))


def paired_accuracy(positive_scores, negative_scores) -> float:
  """Fraction of items whose positive scores strictly above its negative."""
  positive_scores = np.asarray(positive_scores, np.float64)
  negative_scores = np.asarray(negative_scores, np.float64)
  if positive_scores.shape != negative_scores.shape or positive_scores.size == 0:
    raise ValueError(
      f"paired scores must be equal non-empty shapes, got {positive_scores.shape} "
      f"and {negative_scores.shape}"
    )
  return float(np.mean(positive_scores > negative_scores))
