"""Ranking figures: NDCG against graded gains, and the entropy of class
distributions (HCL's Table 3 baseline ranks scenes by it)."""

from __future__ import annotations

import numpy as np


def ndcg(scores: np.ndarray, gains: np.ndarray) -> float:
  """NDCG of ranking items by descending score against non-negative gains."""
  order = np.argsort(-np.asarray(scores), kind="stable")
  discount = 1.0 / np.log2(np.arange(2, len(gains) + 2))
  dcg = np.sum(np.asarray(gains, np.float64)[order] * discount)
  ideal = np.sum(np.sort(np.asarray(gains, np.float64))[::-1] * discount)
  return float(dcg / ideal)


def entropy(probabilities: np.ndarray) -> np.ndarray:
  """Shannon entropy (nats) of each row of a probability matrix."""
  p = np.asarray(probabilities, np.float64)
  return -np.sum(np.where(p > 0, p * np.log(np.where(p > 0, p, 1.0)), 0.0), axis=-1)
