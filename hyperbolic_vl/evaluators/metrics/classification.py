"""Classification figures of zero-shot classifiers: top-1 accuracy and top-1
mean per-class accuracy (the average of the per-class recalls, what MERU's
table reports). Class embeddings come from the predictor
(`Predictor.class_embeddings`, the objective's prompt ensembling).
"""

from __future__ import annotations

import numpy as np


def classification_figures(scores: np.ndarray, labels: np.ndarray, num_classes: int) -> dict:
  """(N, C) scores (higher = better), (N,) labels -> top1, top1_mean_per_class.

  Classes absent from `labels` are left out of the per-class mean.
  """
  scores, labels = np.asarray(scores), np.asarray(labels)
  if scores.shape != (len(labels), num_classes):
    raise ValueError(f"scores {scores.shape} do not match {len(labels)} labels x {num_classes}")
  return prediction_figures(scores.argmax(axis=1), labels, num_classes)


def prediction_figures(predictions: np.ndarray, labels: np.ndarray, num_classes: int) -> dict:
  """(N,) predicted and true classes -> top1, top1_mean_per_class (classes
  absent from `labels` are left out of the per-class mean)."""
  predictions, labels = np.asarray(predictions), np.asarray(labels)
  if predictions.shape != labels.shape:
    raise ValueError(f"{predictions.shape} predictions for {labels.shape} labels")
  if labels.size and (labels.min() < 0 or labels.max() >= num_classes):
    raise ValueError(f"labels outside [0, {num_classes})")
  correct = predictions == labels
  per_class = [correct[labels == c].mean() for c in range(num_classes) if np.any(labels == c)]
  return {"top1": float(correct.mean()), "top1_mean_per_class": float(np.mean(per_class))}
