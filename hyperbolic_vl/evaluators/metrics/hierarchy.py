"""HierarCaps hierarchy metrics (Alper & Averbuch-Elor, supplementary 2.5).

Hierarchical image->text retrieval, two readings:

method="thresholds" (default; the authors' released evaluation, which
produced the published numbers). Let d_r(t) be each candidate text's
distance from the root. Take T = 50 radius thresholds
rho_k = linspace(min_t d_r(t), max_t d_r(t), T) spanning the root distances
of all candidate texts; at each rho_k predict the candidate with the highest
similarity *to the image* among the texts with d_r(t) <= rho_k. The
prediction is the sequence of distinct texts met as rho grows (a text, once
replaced by a more similar one, never returns, so this is also the set).

  Euclidean: d_r(t) = |t - r| for unit t and unit root r; similarity cos(x, t).
  Lorentz (our analogue; the released code is Euclidean only): d_r(t) is the
    geodesic distance from the hyperboloid origin, similarity the Lorentzian
    inner product <x, t>_L (larger = geodesically closer).

The first threshold admits only the text nearest the root, the same for every
image. The paper's text says this degenerate prediction is omitted; the
released code keeps it. omit_first_prediction=False (default) keeps it as
released; True drops it (the paper's wording).

method="interpolation" (our earlier reading of the paper's text). For image x
with nearest text e*, take T points between the root r and e*,

  Euclidean (unit-normalised embeddings):  p_k = r + t_k (e* - r)
  Lorentz (root = hyperboloid origin O):   p_k = exp_0(t_k log_0(e*))   (geodesic)

t_k = k / (T - 1); at each p_k predict the candidate closest to p_k (cosine /
Lorentz distance) among the texts with d_r(text) <= d_r(p_k); the point at
the root (k = 0) is always omitted.

  P = |pred & gt| / |pred|,  R = fraction of the 4 tiers retrieved (mean over
  images). When one image has several reference hierarchies (image_keys), as
  in the full HierarCaps test set, gt is the union of its chains and a tier
  counts as retrieved when any chain's text at that tier is predicted (the
  released multi-reference protocol).
  tau_d = Kendall tau between tier order (1..4) and d_r(tier embedding),
          mean over ground-truth hierarchies (1: distance grows with tier).

All functions are NumPy (float64) on embeddings already computed, so they can
score embeddings of any model and be checked against hand-built ones.
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
  emb = np.asarray(emb, np.float64)
  root = np.zeros(emb.shape[-1]) if root is None else np.asarray(root, np.float64)
  return np.linalg.norm(emb - root, axis=-1)


def _lorentz_pairwise_dist(x, y, curv):
  # float64 NumPy: the eval sizes are small and this avoids f32 acosh noise
  # for near-identical points, which would perturb the radius test.
  tx = np.sqrt(1.0 / curv + np.sum(x * x, -1))
  ty = np.sqrt(1.0 / curv + np.sum(y * y, -1))
  inner = x @ y.T - tx[:, None] * ty[None, :]
  return np.arccosh(np.maximum(-curv * inner, 1.0)) / np.sqrt(curv)


def _lorentz_origin_dist(x, curv):
  return np.arcsinh(np.sqrt(curv) * np.linalg.norm(x, axis=-1)) / np.sqrt(curv)


METHODS = ("thresholds", "interpolation")


def _lorentz_time(x, curv):
  return np.sqrt(1.0 / curv + np.sum(x * x, -1))


def _check_method(method: str) -> None:
  if method not in METHODS:
    raise ValueError(f"unknown hierarchical retrieval method {method!r}; choose from {METHODS}")


def hierarchical_retrieval(
  image_emb: np.ndarray,
  text_emb: np.ndarray,
  *,
  geometry: str,
  root: np.ndarray | None = None,
  curv: float | None = None,
  num_steps: int = NUM_STEPS,
  method: str = "thresholds",
  omit_first_prediction: bool = False,
  nearest: np.ndarray | None = None,
) -> list[list[int]]:
  """Predicted hierarchy (indices into text_emb, root side first) per image.

  image_emb (N, D), text_emb (M, D): model outputs (Euclidean ones are
  normalised here). root: (D,) for Euclidean (normalised by the caller if
  wanted; default the origin); ignored for Lorentz. method and
  omit_first_prediction: see the module docstring. nearest (interpolation
  only): optional (N,) index of each image's nearest text (default: max
  cosine / min Lorentz distance).
  """
  _check_method(method)
  if method == "thresholds":
    return _threshold_retrieval(
      image_emb, text_emb, geometry, root, curv, num_steps, omit_first_prediction
    )
  return _interpolation_retrieval(image_emb, text_emb, geometry, root, curv, num_steps, nearest)


def _threshold_retrieval(image_emb, text_emb, geometry, root, curv, num_steps, omit_first):
  if geometry == "lorentz":
    curv = float(curv)
    image = np.asarray(image_emb, np.float64)
    text = np.asarray(text_emb, np.float64)
    text_radius = _lorentz_origin_dist(text, curv)
    similarity = image @ text.T - np.outer(_lorentz_time(image, curv), _lorentz_time(text, curv))
  else:
    image, text = normalize(image_emb), normalize(text_emb)
    root = np.zeros(text.shape[-1]) if root is None else np.asarray(root, np.float64)
    text_radius = np.linalg.norm(text - root, axis=-1)
    similarity = image @ text.T
  levels = np.linspace(text_radius.min(), text_radius.max(), num_steps)
  # Texts admitted by threshold k are a prefix of the texts sorted by radius,
  # so the prediction at k is the running argmax of the similarity over that
  # prefix (the first maximum on ties).
  order = np.argsort(text_radius, kind="stable")
  admitted = np.searchsorted(text_radius[order], levels, side="right")  # >= 1
  sim = similarity[:, order]
  running_max = np.maximum.accumulate(sim, axis=1)
  record = np.ones_like(sim, dtype=bool)
  record[:, 1:] = sim[:, 1:] > running_max[:, :-1]
  positions = np.where(record, np.arange(sim.shape[1])[None, :], 0)
  running_argmax = order[np.maximum.accumulate(positions, axis=1)]
  best = running_argmax[:, admitted - 1]  # (N, T)
  predictions = []
  for row in best:
    sequence = [int(i) for k, i in enumerate(row) if k == 0 or i != row[k - 1]]
    predictions.append(sequence[1:] if omit_first else sequence)
  return predictions


def _interpolation_retrieval(image_emb, text_emb, geometry, root, curv, num_steps, nearest):
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
  predictions: list[list[int]], ground_truth: list[list[int]] | list[list[list[int]]]
) -> tuple[float, float]:
  """Mean over images of |pred & gt| / |pred| and the fraction of tiers retrieved.

  ground_truth[i] is one chain (tier indices, root side first) or a list of
  reference chains of image i; tier j counts as retrieved when any chain's
  text at tier j is predicted.
  """
  precision, recall = [], []
  for pred, gt in zip(predictions, ground_truth):
    chains = [list(c) for c in gt] if np.ndim(gt) == 2 else [list(gt)]
    predicted = set(pred)
    hits = len(predicted & {t for chain in chains for t in chain})
    precision.append(hits / len(predicted) if predicted else 0.0)
    num_tiers = len(chains[0])
    recall.append(
      sum(any(chain[j] in predicted for chain in chains) for j in range(num_tiers)) / num_tiers
    )
  return float(np.mean(precision)), float(np.mean(recall))


def unique_texts(tier_tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """(N, 4, L) tier tokens -> (gallery rows (M, L), (N, 4) gallery index of each tier)."""
  flat = np.asarray(tier_tokens).reshape(-1, tier_tokens.shape[-1])
  gallery, inverse = np.unique(flat, axis=0, return_inverse=True)
  return gallery, inverse.reshape(tier_tokens.shape[:2])


def hierarchy_metrics(
  image_embeddings: np.ndarray,
  text_gallery: np.ndarray,
  tier_index: np.ndarray,
  *,
  geometry: str,
  root: np.ndarray | None = None,
  curv: float | None = None,
  num_steps: int = NUM_STEPS,
  method: str = "thresholds",
  omit_first_prediction: bool = False,
  image_keys=None,
  prefix: str = "",
) -> dict[str, float]:
  """P, R (hierarchical retrieval) and tau_d for images with known tier texts.

  image_embeddings (N, D); text_gallery (M, D) embeddings of the unique
  candidate texts; tier_index (N, 4) gallery index of each image's
  ground-truth tiers. geometry "euclidean" (root: (D,), default the origin)
  or "lorentz" (space components; curv required; root is the origin).
  method / omit_first_prediction: see the module docstring (defaults: the
  released evaluation). image_keys: optional (N,) keys; rows with equal keys
  are one image with several reference hierarchies (P and R are then
  averaged over distinct images; tau_d stays over rows).
  """
  if geometry == "lorentz" and curv is None:
    raise ValueError("geometry='lorentz' needs curv")
  if geometry != "lorentz":
    text_gallery = normalize(text_gallery)
  tier_index = np.asarray(tier_index)
  if image_keys is None:
    rows = [[i] for i in range(len(tier_index))]
  else:
    groups: dict = {}
    for i, key in enumerate(image_keys):
      groups.setdefault(key, []).append(i)
    rows = list(groups.values())
  first = np.array([r[0] for r in rows])
  predictions = hierarchical_retrieval(
    np.asarray(image_embeddings)[first],
    text_gallery,
    geometry=geometry,
    root=root,
    curv=curv,
    num_steps=num_steps,
    method=method,
    omit_first_prediction=omit_first_prediction,
  )
  references = [[list(tier_index[i]) for i in r] for r in rows]
  precision, recall = precision_recall(predictions, references)
  dist = root_distance(text_gallery, root, geometry, curv)
  return {
    f"{prefix}precision": precision,
    f"{prefix}recall": recall,
    f"{prefix}tau_d": tau_d(dist[tier_index]),
    f"{prefix}mean_pred_length": float(np.mean([len(p) for p in predictions])),
  }
