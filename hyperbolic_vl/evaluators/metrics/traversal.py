"""Image traversals (MERU Sec. 3.3, App. G): walk from an image embedding to
[ROOT] in `steps` equally spaced points and, at each point, retrieve the
nearest text of a fixed pool (which also contains [ROOT]).

Lorentz models walk the geodesic to the hyperboloid origin (MERU's [ROOT])
and score by the Lorentzian inner product. As in MERU's released traversal
script, a text can be retrieved at a point only when its entailment cone
contains the point (exterior angle at the text <= its half-aperture; [ROOT]
entails everything): `entailment_filter=True` (default; False scores every
text). Euclidean (CLIP) models walk the straight line to `root` and score by
cosine. MERU's CLIP [ROOT] (App. G) is the normalised mean of the training
image and text embeddings: pass it as `root` (`clip_root` builds it); without
one, the mean of the pool's normalised text embeddings stands in.

The result lists each retrieved text once, in order of first retrieval
(`dedupe="all"`, as released); `dedupe="adjacent"` only merges consecutive
repeats.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib

import jax
import jax.numpy as jnp
import numpy as np

from hyperbolic_vl.geometry import lorentz

ROOT = "[ROOT]"
TEXT_POOL_KEYS = ("captions", "nouns", "adjectives")
# The prompts MERU's released traversal script (scripts/image_traversals.py)
# embeds for the pool's tags; captions are embedded as they are.
POOL_PROMPTS = {"captions": "{}", "nouns": "a photo of a {}.", "adjectives": "this photo is {}."}
# MERU's pool of pexels.com captions, nouns and adjectives, shipped with the
# package (licence notice beside it in data/assets/).
PEXELS_POOL = pathlib.Path(__file__).parents[2] / "data" / "assets" / "pexels_text.json"


@dataclasses.dataclass(frozen=True)
class TextPool:
  """A traversal text pool: `texts[i]` is what a walk reports and
  `prompts[i]` what the model embeds for it (a tag inside its prompt)."""

  texts: tuple[str, ...]
  prompts: tuple[str, ...]

  def __len__(self) -> int:
    return len(self.texts)

  @classmethod
  def of_captions(cls, captions) -> TextPool:
    """A pool of captions embedded as they are."""
    captions = tuple(captions)
    return cls(captions, captions)


def load_text_pool(path: str | os.PathLike = PEXELS_POOL) -> TextPool:
  """The traversal text pool from a JSON file in MERU's format (default: MERU's
  pexels pool): an object whose "captions", "nouns" and "adjectives" lists
  are concatenated in that order, each tag put in its prompt as MERU's
  released script does ("a photo of a {}." for nouns, "this photo is {}."
  for adjectives), stripped, with empty entries and repeated (text, prompt)
  pairs dropped (first occurrence kept)."""
  with open(path) as f:
    data = json.load(f)
  if not isinstance(data, dict) or not any(key in data for key in TEXT_POOL_KEYS):
    raise ValueError(f"{path}: expected a JSON object with lists {TEXT_POOL_KEYS}")
  pairs = []
  for key in TEXT_POOL_KEYS:
    entries = data.get(key, [])
    if not isinstance(entries, list) or not all(isinstance(e, str) for e in entries):
      raise ValueError(f"{path}: {key!r} must be a list of strings")
    pairs.extend((e.strip(), POOL_PROMPTS[key].format(e.strip())) for e in entries if e.strip())
  pairs = list(dict.fromkeys(pairs))
  return TextPool(tuple(t for t, _ in pairs), tuple(p for _, p in pairs))


def _l2(x):
  return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


def clip_root(image_emb: np.ndarray, text_emb: np.ndarray) -> np.ndarray:
  """MERU's CLIP [ROOT]: normalised mean of normalised image and text embeddings."""
  both = np.concatenate([_l2(np.asarray(image_emb)), _l2(np.asarray(text_emb))])
  return _l2(both.mean(axis=0))


def traverse(
  image_emb: np.ndarray,
  text_emb: np.ndarray,
  texts: list[str],
  *,
  geometry: str,
  curv: float | None = None,
  steps: int = 50,
  root: np.ndarray | None = None,
  entailment_filter: bool = True,
  dedupe: str = "all",
) -> list[str]:
  """Distinct texts met on the way from one image (D,) to [ROOT], image first.

  text_emb: (T, D) embeddings of `texts` in the model's geometry. root: the
  Euclidean [ROOT] (D,); ignored for Lorentz (the origin).
  """
  if dedupe not in ("all", "adjacent"):
    raise ValueError(f"dedupe={dedupe!r}; valid: 'all', 'adjacent'")
  t = np.linspace(1.0, 0.0, steps)[:, None]  # 1 = the image, 0 = [ROOT]
  if geometry == "lorentz":
    origin = np.zeros((1, text_emb.shape[1]), np.float32)
    pool = jnp.asarray(np.concatenate([text_emb, origin]))
    scores, angle, aperture = map(
      np.asarray, _lorentz_walk(jnp.asarray(image_emb[None]), jnp.asarray(t), pool, curv)
    )
    if entailment_filter:
      entails = angle <= aperture[:, None]
      entails[-1] = True  # [ROOT] entails everything
      scores = np.where(entails.T, scores, -np.inf)
  else:
    root = _l2(text_emb).mean(axis=0) if root is None else np.asarray(root)
    root = _l2(root[None])
    pool = np.concatenate([_l2(text_emb), root])
    path = t * _l2(image_emb[None]) + (1 - t) * root
    scores = _l2(path) @ pool.T
  names = list(texts) + [ROOT]
  found = []
  for index in np.argmax(scores, axis=1):
    name = names[index]
    if dedupe == "all" and name in found:
      continue
    if not found or found[-1] != name:
      found.append(name)
  return found


@jax.jit
def _lorentz_walk(image, t, pool, curv):
  """The walk's points' scores against the pool (steps, T + 1), the exterior
  angle at each pool text towards each point (T + 1, steps) and the texts'
  half-apertures (T + 1,): one compiled computation per shape (a plot or an
  evaluator walks many images of one shape), where op by op each operation
  would compile on its own."""
  path = lorentz.interpolate_to_origin(image, t, curv)
  return (
    lorentz.pairwise_inner(path, pool, curv),
    lorentz.pairwise_oxy_angle(pool, path, curv),
    lorentz.half_aperture(pool, curv),
  )


# Compiled whole for the same reason (the plots call them per figure).
_geodesic_interpolate = jax.jit(lorentz.geodesic_interpolate)
_pairwise_inner = jax.jit(lorentz.pairwise_inner)


def geodesic_between(
  start: np.ndarray, end: np.ndarray, steps: int, *, geometry: str, curv: float | None = None
) -> np.ndarray:
  """`steps` points on the geodesic from `start` (first row) to `end` (last
  row), equally spaced: the hyperboloid's geodesic for Lorentz models, the
  great circle through the normalised embeddings for Euclidean models
  (whose scores are cosines, so only directions matter). (D,), (D,) -> (steps, D)."""
  t = np.linspace(0.0, 1.0, steps)[:, None]
  start, end = np.asarray(start, np.float32), np.asarray(end, np.float32)
  if geometry == "lorentz":
    return np.asarray(
      _geodesic_interpolate(jnp.asarray(start[None]), jnp.asarray(end[None]), jnp.asarray(t), curv)
    )
  a, b = _l2(start), _l2(end)
  angle = float(np.arccos(np.clip(a @ b, -1.0, 1.0)))
  if angle < 1e-6:  # (nearly) the same direction: the arc is a point
    return np.repeat(a[None], steps, axis=0)
  return (np.sin((1.0 - t) * angle) * a + np.sin(t * angle) * b) / np.sin(angle)


def nearest(
  points: np.ndarray, pool: np.ndarray, *, geometry: str, curv: float | None = None
) -> np.ndarray:
  """Index of the nearest `pool` row to each of `points`, (N, D), (M, D) -> (N,):
  the smallest geodesic distance for Lorentz models (found as the largest
  Lorentzian inner product, a decreasing function of the distance), the
  largest cosine for Euclidean ones."""
  if geometry == "lorentz":
    scores = np.asarray(_pairwise_inner(jnp.asarray(points), jnp.asarray(pool), curv))
  else:
    scores = _l2(np.asarray(points)) @ _l2(np.asarray(pool)).T
  return np.argmax(scores, axis=1)
