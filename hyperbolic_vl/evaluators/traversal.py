"""Image traversals (MERU Sec. 3.3, App. G): walk from an image embedding to
[ROOT] in `steps` equally spaced points and, at each point, retrieve the
nearest text of a fixed pool (which also contains [ROOT]).

Lorentz models walk the geodesic to the hyperboloid origin (MERU's [ROOT]);
Euclidean (CLIP) models walk the straight line to the mean of the text pool's
normalised embeddings (MERU's CLIP [ROOT]) and score by cosine.
"""

from __future__ import annotations

import json
import os

import jax.numpy as jnp
import numpy as np

from hyperbolic_vl.geometry import lorentz

ROOT = "[ROOT]"
TEXT_POOL_KEYS = ("captions", "nouns", "adjectives")


def load_text_pool(path: str | os.PathLike) -> list[str]:
  """The traversal text pool from a JSON file in MERU's format: an object whose
  "captions", "nouns" and "adjectives" lists are concatenated in that order,
  stripped, with empty and repeated entries dropped (first occurrence kept)."""
  with open(path) as f:
    data = json.load(f)
  if not isinstance(data, dict) or not any(key in data for key in TEXT_POOL_KEYS):
    raise ValueError(f"{path}: expected a JSON object with lists {TEXT_POOL_KEYS}")
  pool = []
  for key in TEXT_POOL_KEYS:
    entries = data.get(key, [])
    if not isinstance(entries, list) or not all(isinstance(e, str) for e in entries):
      raise ValueError(f"{path}: {key!r} must be a list of strings")
    pool.extend(e.strip() for e in entries)
  return [text for text in dict.fromkeys(pool) if text]


def _l2(x):
  return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


def traverse(
  image_emb: np.ndarray,
  text_emb: np.ndarray,
  texts: list[str],
  *,
  geometry: str,
  curv: float | None = None,
  steps: int = 50,
) -> list[str]:
  """Distinct texts met on the way from one image (D,) to [ROOT], image first.

  text_emb: (T, D) embeddings of `texts` in the model's geometry.
  """
  t = np.linspace(1.0, 0.0, steps)[:, None]  # 1 = the image, 0 = [ROOT]
  if geometry == "lorentz":
    root = np.zeros((1, text_emb.shape[1]), np.float32)
    pool = np.concatenate([text_emb, root])
    path = np.asarray(
      lorentz.interpolate_to_origin(jnp.asarray(image_emb[None]), jnp.asarray(t), curv)
    )
    scores = np.asarray(lorentz.pairwise_inner(jnp.asarray(path), jnp.asarray(pool), curv))
  else:
    root = _l2(text_emb).mean(axis=0, keepdims=True)
    pool = np.concatenate([_l2(text_emb), _l2(root)])
    path = t * _l2(image_emb[None]) + (1 - t) * root
    scores = _l2(path) @ pool.T
  names = list(texts) + [ROOT]
  found = []
  for index in np.argmax(scores, axis=1):
    if not found or found[-1] != names[index]:
      found.append(names[index])
  return found
