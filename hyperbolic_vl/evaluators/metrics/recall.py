"""Retrieval figures (recall@k, chance level) and accuracy from score matrices (NumPy)."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np


def recall_at_k(scores: np.ndarray, relevant: np.ndarray, ks: Iterable[int]) -> dict[int, float]:
  """Fraction of queries with at least one relevant item among the top k.

  scores: (Q, G) higher = better; relevant: (Q, G) bool.
  """
  scores = np.asarray(scores)
  relevant = np.asarray(relevant, bool)
  if scores.shape != relevant.shape:
    raise ValueError(f"scores {scores.shape} and relevant {relevant.shape} differ")
  # Stable descending order so ties resolve by gallery index, deterministically.
  order = np.argsort(-scores, axis=1, kind="stable")
  ranked_relevant = np.take_along_axis(relevant, order, axis=1)
  first_hit = np.where(ranked_relevant.any(axis=1), ranked_relevant.argmax(axis=1), np.inf)
  return {k: float(np.mean(first_hit < k)) for k in ks}


def chance_recall_at_k(relevant: np.ndarray, k: int) -> float:
  """Expected recall@k of a random ranking (hypergeometric: P(>=1 relevant in k))."""
  relevant = np.asarray(relevant, bool)
  gallery = relevant.shape[1]
  out = []
  for n_rel in relevant.sum(axis=1):
    # P(no relevant item among k draws without replacement).
    p_miss = 1.0
    for i in range(min(k, gallery)):
      p_miss *= max(gallery - n_rel - i, 0) / (gallery - i)
    out.append(1.0 - p_miss)
  return float(np.mean(out))


def caption_relevance(caption_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """Image->unique-caption relevance for galleries with duplicate captions.

  Returns (unique_index (N,) into the deduplicated caption gallery,
  relevant (N, U) bool). Identical captions of different images are one
  gallery item, so retrieving "a red circle" for any image captioned so
  counts as a hit (standard for template-generated captions).
  """
  _, first, inverse = np.unique(caption_ids, axis=0, return_index=True, return_inverse=True)
  inverse = inverse.reshape(-1)
  relevant = inverse[:, None] == np.arange(len(first))[None, :]
  return first, relevant


def accuracy(scores: np.ndarray, labels: np.ndarray) -> float:
  return float(np.mean(np.argmax(scores, axis=1) == np.asarray(labels)))


def image_caption_figures(
  scores: np.ndarray, caption_image: np.ndarray, ks: Iterable[int] = (1, 5, 10)
) -> dict[str, float]:
  """COCO/Flickr-style retrieval with several captions per image.

  scores: (N_images, N_captions), higher = better; caption_image: (N_captions,)
  index of each caption's image. image->text counts a hit when any of the
  image's captions is in the top k; text->image when the caption's image is.
  Returns {"i2t_recall@k", "t2i_recall@k"}.
  """
  scores = np.asarray(scores)
  caption_image = np.asarray(caption_image)
  relevant = caption_image[None, :] == np.arange(scores.shape[0])[:, None]
  ks = tuple(ks)
  figures = {f"i2t_recall@{k}": v for k, v in recall_at_k(scores, relevant, ks).items()}
  figures.update({f"t2i_recall@{k}": v for k, v in recall_at_k(scores.T, relevant.T, ks).items()})
  return figures


def two_way_image_caption_figures(
  i2t_scores, t2i_scores, caption_image, ks: Iterable[int] = (1, 5, 10)
) -> dict[str, float]:
  """recall@k both ways when the two directions rank by different scores
  (ATMG's released evaluation), each (N_images, N_captions); keys sorted."""
  ks = tuple(ks)
  i2t = image_caption_figures(i2t_scores, caption_image, ks)
  t2i = image_caption_figures(t2i_scores, caption_image, ks)
  return {k: (i2t if k.startswith("i2t") else t2i)[k] for k in sorted(i2t)}
