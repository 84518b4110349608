"""Zero-shot classification: prompt ensembling and the paper's accuracies.

Class embeddings are built once per evaluation from P prompt embeddings per
class, by one rule per model kind (`ensemble_rule`):
  "tangent_mean"     Lorentz models (MERU, HMID): map each prompt embedding
                     to the tangent space at the origin, average, map back.
  "normalised_mean"  Euclidean models (CLIP): average the unit vectors and
                     normalise again (cosine scoring ignores the length).
  "per_prompt"       ATMG: keep all P prompts; its score averages the
                     per-prompt angles, so averaging embeddings would change
                     the rule.
Figures: top-1 accuracy and top-1 mean per-class accuracy (the average of
the per-class recalls, what MERU's table reports).
"""

from __future__ import annotations

import numpy as np

from hyperbolic_vl.geometry import lorentz

ENSEMBLE_RULES = ("tangent_mean", "normalised_mean", "per_prompt")


def ensemble_rule(objective_name: str, geometry: str) -> str:
  if objective_name == "atmg":
    return "per_prompt"
  return "tangent_mean" if geometry == "lorentz" else "normalised_mean"


def class_embeddings(prompt_emb: np.ndarray, rule: str, curv: float | None = None) -> np.ndarray:
  """(C, P, D) prompt embeddings -> (C, D), or (C, P, D) for "per_prompt"."""
  prompt_emb = np.asarray(prompt_emb)
  if prompt_emb.ndim != 3:
    raise ValueError(f"prompt embeddings must be (classes, prompts, dim); got {prompt_emb.shape}")
  if rule == "tangent_mean":
    tangents = np.asarray(lorentz.log_map0(prompt_emb, curv))
    return np.asarray(lorentz.exp_map0(tangents.mean(axis=1), curv))
  if rule == "normalised_mean":
    unit = prompt_emb / np.linalg.norm(prompt_emb, axis=-1, keepdims=True)
    mean = unit.mean(axis=1)
    return mean / np.linalg.norm(mean, axis=-1, keepdims=True)
  if rule == "per_prompt":
    return prompt_emb
  raise ValueError(f"unknown ensemble rule {rule!r}; valid: {list(ENSEMBLE_RULES)}")


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
