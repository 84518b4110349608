"""HierarCaps hierarchy metrics (Alper & Averbuch-Elor, supplementary 2.5).

Hierarchical image->text retrieval. For image x with nearest text e* (by the
model's score), take T = 50 equally spaced points between the root r and e*,

  Euclidean (unit-normalised embeddings):  p_k = r + t_k (e* - r)
  Lorentz (root = hyperboloid origin O):   p_k = exp_0(t_k log_0(e*))   (geodesic)

t_k = k / (T - 1). At each p_k the prediction is the candidate text closest
to p_k (cosine similarity / Lorentz distance) among the texts within the
radius of p_k, d_r(text) <= d_r(p_k); the point nearest the root (k = 0) is
omitted. The predicted hierarchy is the de-duplicated sequence of those texts.

  P = |pred & gt| / |pred|,  R = |pred & gt| / |gt|   (mean over images)
  tau_d = Kendall tau between tier order (1..4) and d_r(tier embedding),
          mean over ground-truth hierarchies (1: distance grows with tier).

d_r is |e - r| (Euclidean) or the geodesic distance to the origin (Lorentz).
All functions are NumPy on embeddings already computed, so they can be
checked against hand-built embeddings.
"""

from __future__ import annotations

import numpy as np

NUM_STEPS = 50


def normalize(x: np.ndarray) -> np.ndarray:
  x = np.asarray(x, np.float64)
  return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


def kendall_tau(x: np.ndarray, y: np.ndarray) -> float:
  """Kendall tau-a over all pairs: sum sign(dx) sign(dy) / (n (n-1) / 2)."""
  x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
  n = len(x)
  i, j = np.triu_indices(n, k=1)
  return float(np.sum(np.sign(x[j] - x[i]) * np.sign(y[j] - y[i])) / max(len(i), 1))


def tau_d(tier_dist: np.ndarray) -> float:
  """(N, 4) distances from the root of each hierarchy's tiers -> mean Kendall tau."""
  tier_dist = np.asarray(tier_dist)
  order = np.arange(tier_dist.shape[1])
  return float(np.mean([kendall_tau(order, d) for d in tier_dist]))


def root_distance(
  emb: np.ndarray, root: np.ndarray | None, geometry: str, curv: float | None = None
) -> np.ndarray:
  """d_r(e): |e - r| for Euclidean, distance to the origin for Lorentz."""
  if geometry == "lorentz":
    return _lorentz_origin_dist(np.asarray(emb, np.float64), float(curv))
  return np.linalg.norm(np.asarray(emb, np.float64) - root, axis=-1)


def _lorentz_pairwise_dist(x, y, curv):
  # float64 NumPy: the eval sizes are small and this avoids f32 acosh noise
  # for near-identical points, which would perturb the radius test.
  tx = np.sqrt(1.0 / curv + np.sum(x * x, -1))
  ty = np.sqrt(1.0 / curv + np.sum(y * y, -1))
  inner = x @ y.T - tx[:, None] * ty[None, :]
  return np.arccosh(np.maximum(-curv * inner, 1.0)) / np.sqrt(curv)


def _lorentz_origin_dist(x, curv):
  return np.arcsinh(np.sqrt(curv) * np.linalg.norm(x, axis=-1)) / np.sqrt(curv)


def hierarchical_retrieval(
  image_emb: np.ndarray,
  text_emb: np.ndarray,
  *,
  geometry: str,
  root: np.ndarray | None = None,
  curv: float | None = None,
  num_steps: int = NUM_STEPS,
  nearest: np.ndarray | None = None,
) -> list[list[int]]:
  """Predicted hierarchy (indices into text_emb, root side first) per image.

  image_emb (N, D), text_emb (M, D): model outputs (Euclidean ones are
  normalised here). root: (D,) for Euclidean (normalised by the caller if
  wanted); ignored for Lorentz. nearest: optional (N,) index of each image's
  nearest text (default: max cosine / min Lorentz distance).
  """
  t = np.linspace(0.0, 1.0, num_steps)[1:]  # drop the point at the root
  if geometry == "lorentz":
    curv = float(curv)
    image = np.asarray(image_emb, np.float64)
    text = np.asarray(text_emb, np.float64)
    if nearest is None:
      nearest = np.argmin(_lorentz_pairwise_dist(image, text, curv), axis=1)
    text_radius = _lorentz_origin_dist(text, curv)
    # Geodesic from O to e*: exp_0(t log_0(e*)) in float64.
    target = text[nearest]  # (N, D)
    norm = np.maximum(np.linalg.norm(target, axis=-1, keepdims=True), 1e-300)
    sqrt_c = np.sqrt(curv)
    target_radius = np.arcsinh(sqrt_c * norm)  # sqrt(c) d(O, e*)
    radius = t[None, :, None] * target_radius[:, None, :]  # (N, T, 1)
    points = np.sinh(radius) / sqrt_c * (target / norm)[:, None, :]  # (N, T, D)
    point_radius = radius[..., 0] / sqrt_c  # (N, T)
    flat = points.reshape(-1, points.shape[-1])
    score = -_lorentz_pairwise_dist(flat, text, curv).reshape(len(image), len(t), -1)
  else:
    image = normalize(image_emb)
    text = normalize(text_emb)
    root = np.zeros(text.shape[-1]) if root is None else np.asarray(root, np.float64)
    if nearest is None:
      nearest = np.argmax(image @ text.T, axis=1)
    text_radius = np.linalg.norm(text - root, axis=-1)
    target = text[nearest]
    points = root + t[None, :, None] * (target - root)[:, None, :]  # (N, T, D)
    point_radius = np.linalg.norm(points - root, axis=-1)
    score = normalize(points) @ text.T  # cosine similarity
  # Within the radius; a relative tolerance keeps e* itself (t = 1) eligible
  # despite rounding in the recomputed radius.
  inside = text_radius[None, None, :] <= point_radius[..., None] * (1 + 1e-9) + 1e-12
  score = np.where(inside, score, -np.inf)
  best = np.argmax(score, axis=-1)  # (N, T)
  any_inside = inside.any(axis=-1)
  predictions = []
  for row, ok in zip(best, any_inside):
    predictions.append(list(dict.fromkeys(int(i) for i, k in zip(row, ok) if k)))
  return predictions


def precision_recall(
  predictions: list[list[int]], ground_truth: list[list[int]]
) -> tuple[float, float]:
  """Mean over images of |pred & gt| / |pred| and |pred & gt| / |gt|."""
  precision, recall = [], []
  for pred, gt in zip(predictions, ground_truth):
    hits = len(set(pred) & set(gt))
    precision.append(hits / len(pred) if pred else 0.0)
    recall.append(hits / len(set(gt)))
  return float(np.mean(precision)), float(np.mean(recall))


def unique_texts(tier_tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """(N, 4, L) tier tokens -> (gallery rows (M, L), (N, 4) gallery index of each tier)."""
  flat = np.asarray(tier_tokens).reshape(-1, tier_tokens.shape[-1])
  gallery, inverse = np.unique(flat, axis=0, return_inverse=True)
  return gallery, inverse.reshape(tier_tokens.shape[:2])


def hierarchy_metrics(
  image_emb: np.ndarray,
  gallery_emb: np.ndarray,
  tier_index: np.ndarray,
  *,
  geometry: str,
  root: np.ndarray | None = None,
  curv: float | None = None,
  num_steps: int = NUM_STEPS,
  prefix: str = "",
) -> dict[str, float]:
  """P, R (hierarchical retrieval) and tau_d for images with known tier texts.

  gallery_emb (M, D) embeddings of the unique candidate texts; tier_index
  (N, 4) gallery index of each image's ground-truth tiers.
  """
  if geometry != "lorentz":
    gallery_emb = normalize(gallery_emb)
  predictions = hierarchical_retrieval(
    image_emb, gallery_emb, geometry=geometry, root=root, curv=curv, num_steps=num_steps
  )
  precision, recall = precision_recall(predictions, [list(r) for r in tier_index])
  dist = root_distance(gallery_emb, root, geometry, curv)
  return {
    f"{prefix}precision": precision,
    f"{prefix}recall": recall,
    f"{prefix}tau_d": tau_d(dist[tier_index]),
    f"{prefix}mean_pred_length": float(np.mean([len(p) for p in predictions])),
  }
