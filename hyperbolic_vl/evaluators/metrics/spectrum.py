"""Eigenvalue spectrum of embeddings' covariance (ATMG Fig. 7).

Eigenvalues of the sample covariance (1/(N-1)) sum_n (e_n - mean)(e_n - mean)^T,
largest first, in float64; the figures give the first few, the first one's
share of the variance and the effective rank exp(entropy of lambda / sum
lambda) (Roy & Vetterli 2007): D for a perfectly spread spectrum and 1 when
one direction holds everything.
"""

from __future__ import annotations

import numpy as np


def covariance_spectrum(emb) -> np.ndarray:
  """(N, D) embeddings -> (D,) float64 eigenvalues of their sample covariance, descending."""
  emb = np.asarray(emb, np.float64)
  if emb.ndim != 2 or emb.shape[0] < 2:
    raise ValueError(f"need (N >= 2, D) embeddings, got {emb.shape}")
  centred = emb - emb.mean(0)
  covariance = centred.T @ centred / (emb.shape[0] - 1)
  # Symmetric PSD: eigvalsh; rounding can leave tiny negatives, which are 0.
  return np.maximum(np.linalg.eigvalsh(covariance)[::-1], 0.0)


def spectrum_figures(eigenvalues, num_listed: int) -> dict[str, float]:
  """The first `num_listed` eigenvalues, the first one's share of the
  variance, and the effective rank exp(H(lambda / sum lambda))."""
  eigenvalues = np.asarray(eigenvalues, np.float64)
  total = eigenvalues.sum()
  figures = {
    f"lambda_{i + 1:02d}": float(v) for i, v in enumerate(eigenvalues[: max(num_listed, 0)])
  }
  if total > 0:
    p = eigenvalues / total
    p = p[p > 0]  # 0 log 0 = 0
    figures["top1_share"] = float(eigenvalues[0] / total)
    figures["effective_rank"] = float(np.exp(-(p * np.log(p)).sum()))
  return figures
