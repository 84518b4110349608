"""CLIP baseline: cosine similarity of L2-normalised features (Radford et al.).

L = (CE(s * I T^T) + CE(s * T I^T)) / 2 with s = exp(log_logit_scale), computed
for local rows against the all-gathered global batch of the other modality.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp

from hyperbolic_vl.objectives import base, chunked, registry
from hyperbolic_vl.objectives import settings as settings_lib


def l2_normalize(x: jax.Array, eps: float = 1e-12) -> jax.Array:
  # eps keeps the gradient finite for an all-zero feature vector.
  return x * jax.lax.rsqrt(jnp.maximum(jnp.sum(x * x, axis=-1, keepdims=True), eps))


def cosine_logits(rows: jax.Array, columns: jax.Array) -> jax.Array:
  return jnp.matmul(
    l2_normalize(rows), l2_normalize(columns).T, precision=jax.lax.Precision.HIGHEST
  )


def scaled_dot_logits(unit_rows: jax.Array, unit_columns: jax.Array, scale: jax.Array):
  """scale * cosine for already L2-normalised features (the chunked loss's
  logits function: normalising once outside beats once per column block)."""
  return scale * jnp.matmul(unit_rows, unit_columns.T, precision=jax.lax.Precision.HIGHEST)


@dataclasses.dataclass(frozen=True)
class ClipSettings(settings_lib.ObjectiveSettings):
  """CLIP: symmetric InfoNCE on cosine logits."""

  name: ClassVar[str] = "clip"
  # Column block size of the streamed contrastive loss; 0 materialises the
  # full (b, B) logits, -1 picks a block from the global batch.
  logit_chunk_size: int = 0


@registry.register
class ClipObjective(base.Objective):
  name = "clip"
  geometry = "euclidean"
  Settings = ClipSettings

  def loss(self, model, aux, batch, *, rng, axis_name, context=base.EMPTY_CONTEXT):
    del rng, context
    image = l2_normalize(model.encode_image(batch["image"]))
    text = l2_normalize(model.encode_text(batch["tokens"]))
    all_image = base.gather_columns(image, axis_name)
    all_text = base.gather_columns(text, axis_name)
    contrastive = chunked.symmetric_contrastive(
      scaled_dot_logits,
      model.logit_scale(),
      image,
      text,
      all_image,
      all_text,
      axis_name,
      chunk_size=self.settings.logit_chunk_size,
    )
    metrics = {"loss/contrastive": contrastive, **self.scalar_metrics(model)}
    return contrastive, (metrics, aux)

  def score(self, model, image_emb, text_emb):
    del model
    return cosine_logits(image_emb, text_emb)

  def class_embedding(self, model, prompt_tangents):
    del model
    # CLIP prompt ensembling: normalise each prompt, average, renormalise.
    return l2_normalize(l2_normalize(prompt_tangents).mean(axis=1))
