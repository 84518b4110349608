"""EuCLIP (Chou & Alam 2024, arXiv 2409.13079): CLIP without the L2
normalisation, the logit a negative Euclidean distance of the raw
projections. The Euclidean control for the hyperbolic objectives: the same
towers and contrastive loss as MERU, flat space instead of the hyperboloid.

  L = (CE(-s * D(I, T)) + CE(-s * D(T, I))) / 2,   s = exp(log_logit_scale)
  D(x, y) = |x - y|^2   (objective.logit="squared_distance", the default)
          = |x - y|     (objective.logit="distance")

I, T: the model's unnormalised image and text embeddings (a Euclidean
model's `lift` is the identity), computed for local rows against the
all-gathered global batch of the other modality, as CLIP and MERU.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp

from hyperbolic_vl.geometry import safe
from hyperbolic_vl.objectives import base, chunked, registry
from hyperbolic_vl.objectives import settings as settings_lib

LOGITS = ("squared_distance", "distance")


def pairwise_squared_distance(rows: jax.Array, columns: jax.Array) -> jax.Array:
  """(b, D) x (B, D) -> (b, B) |r_i - c_j|^2, never below 0 (the expanded
  form |r|^2 + |c|^2 - 2 r.c can round to a tiny negative for equal points)."""
  cross = jnp.matmul(rows, columns.T, precision=jax.lax.Precision.HIGHEST)
  squared = jnp.sum(rows * rows, -1)[:, None] + jnp.sum(columns * columns, -1)[None, :]
  return jnp.maximum(squared - 2 * cross, 0.0)


def pairwise_distance(rows: jax.Array, columns: jax.Array) -> jax.Array:
  """(b, B) |r_i - c_j|, with a finite gradient where two points coincide."""
  return safe.safe_sqrt(pairwise_squared_distance(rows, columns))


_DISTANCES = {"squared_distance": pairwise_squared_distance, "distance": pairwise_distance}


def squared_distance_logits(rows: jax.Array, columns: jax.Array, scale: jax.Array) -> jax.Array:
  return -scale * pairwise_squared_distance(rows, columns)


def distance_logits(rows: jax.Array, columns: jax.Array, scale: jax.Array) -> jax.Array:
  return -scale * pairwise_distance(rows, columns)


_LOGITS_FNS = {"squared_distance": squared_distance_logits, "distance": distance_logits}


@dataclasses.dataclass(frozen=True)
class EuclipSettings(settings_lib.ObjectiveSettings):
  """EuCLIP: symmetric InfoNCE on negative Euclidean (squared) distances."""

  name: ClassVar[str] = "euclip"
  # "squared_distance" (-s |x - y|^2, the variant the paper calls EuCLIP)
  # or "distance" (-s |x - y|).
  logit: str = "squared_distance"
  logit_chunk_size: int = 0  # as ClipSettings.logit_chunk_size

  def __post_init__(self):
    settings_lib.check_choice(self, "logit", LOGITS)


@registry.register
class EuclipObjective(base.Objective):
  name = "euclip"
  geometry = "euclidean"
  Settings = EuclipSettings

  def loss(self, model, aux, batch, *, rng, axis_name, context=base.EMPTY_CONTEXT):
    del rng, context
    image = model.encode_image(batch["image"])
    text = model.encode_text(batch["tokens"])
    all_image = base.gather_columns(image, axis_name)
    all_text = base.gather_columns(text, axis_name)
    contrastive = chunked.symmetric_contrastive(
      _LOGITS_FNS[self.settings.logit],
      model.logit_scale(),
      image,
      text,
      all_image,
      all_text,
      axis_name,
      chunk_size=self.settings.logit_chunk_size,
    )
    # Distances to the origin (the raw norms) per modality: the collapse
    # warning and the reference curves read them as for the hyperbolic
    # objectives.
    metrics = {
      "loss/contrastive": contrastive,
      "mean_dist_origin/image": jnp.linalg.norm(image, axis=-1).mean(),
      "mean_dist_origin/text": jnp.linalg.norm(text, axis=-1).mean(),
      **self.scalar_metrics(model),
    }
    return contrastive, (metrics, aux)

  def score(self, model, image_emb, text_emb):
    del model
    # Ranking by -D is ranking by the logit (s > 0 scales every entry alike).
    return -_DISTANCES[self.settings.logit](image_emb, text_emb)

  def class_embedding(self, model, prompt_tangents):
    del model
    # The prompts' centroid: the point whose summed squared distance to
    # them is least, EuCLIP's analogue of CLIP's normalised mean.
    return prompt_tangents.mean(axis=1)
