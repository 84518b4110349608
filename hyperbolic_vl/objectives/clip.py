"""CLIP baseline: cosine similarity of L2-normalised features (Radford et al.).

L = (CE(s * I T^T) + CE(s * T I^T)) / 2 with s = exp(log_logit_scale), computed
for local rows against the all-gathered global batch of the other modality.

`pairwise_loss="sigmoid"` is SigLIP's loss instead (Zhai et al. 2023,
objectives/pairwise_sigmoid.py): logits s * I T^T + b with a learned bias b
(`model.logit_bias_init`; SigLIP initialises s = 10, b = -10), the text
columns gathered or passed around a ring of devices (`sigmoid_columns`).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp

from hyperbolic_vl.objectives import base, chunked, pairwise_sigmoid, registry
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


def biased_dot_logits(unit_rows: jax.Array, unit_columns: jax.Array, scale_and_bias):
  """SigLIP's logits t * cosine + b for L2-normalised features."""
  scale, bias = scale_and_bias
  return scaled_dot_logits(unit_rows, unit_columns, scale) + bias


@dataclasses.dataclass(frozen=True)
class ClipSettings(settings_lib.ObjectiveSettings):
  """CLIP: symmetric InfoNCE on cosine logits."""

  name: ClassVar[str] = "clip"
  # Column block size of the streamed contrastive loss (softmax or sigmoid);
  # 0 materialises the full (b, B) logits (the ring's (b, b) blocks).
  logit_chunk_size: int = 0
  # "softmax" (CLIP's InfoNCE) or "sigmoid" (SigLIP's pairwise sigmoid with
  # a learned bias: needs model.logit_bias_init).
  pairwise_loss: str = "softmax"
  # The sigmoid loss's text columns: "gathered" (all-gather, one (b, B)
  # block) or "ring" (ppermute around the devices, (b, b) blocks).
  sigmoid_columns: str = "gathered"

  def __post_init__(self):
    pairwise_sigmoid.check_settings(self)


@registry.register
class ClipObjective(base.Objective):
  name = "clip"
  geometry = "euclidean"
  Settings = ClipSettings

  def check_model_config(self, model_config):
    super().check_model_config(model_config)
    pairwise_sigmoid.check_model_config(self.settings, model_config)

  def loss(self, model, aux, batch, *, rng, axis_name, context=base.EMPTY_CONTEXT):
    del rng, context
    image = l2_normalize(model.encode_image(batch["image"]))
    text = l2_normalize(model.encode_text(batch["tokens"]))
    if self.settings.pairwise_loss == "sigmoid":
      contrastive = pairwise_sigmoid.sigmoid_contrastive(
        biased_dot_logits,
        (model.logit_scale(), model.learned_logit_bias()),
        image,
        text,
        axis_name,
        columns=self.settings.sigmoid_columns,
        chunk_size=self.settings.logit_chunk_size,
      )
      metrics = {"loss/contrastive": contrastive, **self.scalar_metrics(model)}
      return contrastive, (metrics, aux)
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
