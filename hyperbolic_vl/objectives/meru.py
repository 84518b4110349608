"""MERU (Desai et al., ICML 2023): contrastive on negative Lorentzian distance
plus the entailment-cone loss "text entails its paired image".

  L = L_cont + lambda * L_entail
  L_cont   = symmetric CE of logits -d_L(x_i, y_j) * s  (MERU App. C.1)
  L_entail = mean_i max(0, ext(x_i, y_i) - aper(x_i))   (eq. 10-12)

x: text embeddings, y: image embeddings, both space components on the
hyperboloid of curvature -c; s = exp(log_logit_scale).

`pairwise_loss="sigmoid"` replaces L_cont by SigLIP's pairwise sigmoid loss
on the logits -s * d_L(x_i, y_j) + b with a learned bias b
(`model.logit_bias_init`; objectives/pairwise_sigmoid.py), the entailment
term unchanged beside it.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp

from hyperbolic_vl.geometry import lorentz
from hyperbolic_vl.objectives import base, chunked, entailment_weight, pairwise_sigmoid, registry
from hyperbolic_vl.objectives import settings as settings_lib

# Below 1 + this, -c<x,y>_L sits on acosh's singular point: such entries are
# counted as "clamped" so a run's logs show how often the guard is active.
_CLAMP_MONITOR_EPS = 1e-6


def entailment_loss(
  text: jax.Array, image: jax.Array, curv: jax.Array, min_radius: float = 0.1
) -> jax.Array:
  """max(0, ext(text, image) - aper(text)) per pair, shape (b,)."""
  angle = lorentz.oxy_angle(text, image, curv)
  aperture = lorentz.half_aperture(text, curv, min_radius=min_radius)
  return jax.nn.relu(angle - aperture)


def cone_health(
  text: jax.Array,
  image: jax.Array,
  curv: jax.Array,
  min_radius: float = 0.1,
  aperture_factor: float = 1.0,
):
  """Logged beside the entailment loss (the collapse warning and the
  reference curves read them): the share of pairs whose image lies inside
  its text's cone (half-aperture `aperture_factor` x MERU's: HyCoCLIP's
  0.7), and the share of texts so near the origin that the aperture's asin
  saturates (sqrt(c)|x| <= 2K: the cone at its widest, MERU's a half-space)."""
  text, image = jax.lax.stop_gradient((text, image))
  angle = lorentz.oxy_angle(text, image, curv)
  aperture = aperture_factor * lorentz.half_aperture(text, curv, min_radius=min_radius)
  saturated = jnp.sqrt(curv) * jnp.linalg.norm(text, axis=-1) <= 2 * min_radius
  return {
    "inside_cone_fraction": (angle <= aperture).astype(jnp.float32).mean(),
    "aperture_saturated_fraction": saturated.astype(jnp.float32).mean(),
  }


def clamped_fraction(
  rows: jax.Array, columns: jax.Array, curv: jax.Array, chunk_size: int = 0
) -> jax.Array:
  """Share of (row, column) pairs whose distance a numerical guard decides:
  the acosh argument at its floor, or either point at the exponential map's
  cap (where every point of a direction coincides and the loss is flat)."""

  def clamped(r, c):
    arg = -curv * lorentz.pairwise_inner(r, c, curv)
    capped = lorentz.exp_map_capped(r, curv)[:, None] | lorentz.exp_map_capped(c, curv)[None, :]
    return ((arg < 1 + _CLAMP_MONITOR_EPS) | capped).astype(jnp.float32)

  return chunked.blockwise_mean(clamped, rows, columns, chunk_size)


def capped_fraction(image: jax.Array, text: jax.Array, curv: jax.Array) -> jax.Array:
  """Share of this batch's embeddings at the exponential map's cap."""
  capped = jnp.concatenate(
    [lorentz.exp_map_capped(image, curv), lorentz.exp_map_capped(text, curv)]
  )
  return capped.astype(jnp.float32).mean()


def neg_distance_logits(rows: jax.Array, columns: jax.Array, scale_and_curv) -> jax.Array:
  """MERU's logits -s * d_L(rows_i, columns_j)."""
  scale, curv = scale_and_curv
  return -scale * lorentz.pairwise_dist(rows, columns, curv)


def biased_neg_distance_logits(rows: jax.Array, columns: jax.Array, scale_curv_bias) -> jax.Array:
  """The sigmoid loss's logits -s * d_L(rows_i, columns_j) + b."""
  scale, curv, bias = scale_curv_bias
  return neg_distance_logits(rows, columns, (scale, curv)) + bias


def ring_clamped_fraction(rows, columns, curv, axis_name, chunk_size=0) -> jax.Array:
  """`clamped_fraction` of rows against every device's columns, the columns
  passed around the ring as the ring sigmoid loss does (no gather)."""
  rows, columns = jax.lax.stop_gradient((rows, columns))
  count = lambda block: clamped_fraction(rows, block, curv, chunk_size) * block.shape[0]
  total = pairwise_sigmoid.ring_sum(count, columns, axis_name)
  return total / (columns.shape[0] * pairwise_sigmoid.ring_size(axis_name))


@dataclasses.dataclass(frozen=True)
class MeruSettings(entailment_weight.EntailmentWeightSettings, settings_lib.ObjectiveSettings):
  """MERU: contrastive on -d_L plus lambda x entailment (MERU Sec. 3)."""

  name: ClassVar[str] = "meru"
  entail_weight: float = 0.2  # lambda, MERU Sec. 3.2
  logit_chunk_size: int = 0  # as ClipSettings.logit_chunk_size
  pairwise_loss: str = "softmax"  # or "sigmoid", as ClipSettings.pairwise_loss
  sigmoid_columns: str = "gathered"  # or "ring", as ClipSettings.sigmoid_columns

  def __post_init__(self):
    pairwise_sigmoid.check_settings(self)
    self.check_entailment_weight()


@registry.register
class MeruObjective(entailment_weight.EntailmentWeightHooks, base.Objective):
  name = "meru"
  geometry = "lorentz"
  Settings = MeruSettings

  def check_model_config(self, model_config):
    super().check_model_config(model_config)
    pairwise_sigmoid.check_model_config(self.settings, model_config)
    entailment_weight.check_model_config(self.settings, model_config)

  def contrastive_and_entailment(self, model, image, text, axis_name):
    """Shared by objectives that extend MERU (HMID-Net)."""
    if self.settings.pairwise_loss == "sigmoid":
      return self._sigmoid_and_entailment(model, image, text, axis_name)
    curv = model.curv()
    scale = model.logit_scale()
    chunk_size = self.settings.logit_chunk_size
    all_image = base.gather_columns(image, axis_name)
    all_text = base.gather_columns(text, axis_name)
    contrastive = chunked.symmetric_contrastive(
      neg_distance_logits,
      (scale, curv),
      image,
      text,
      all_image,
      all_text,
      axis_name,
      chunk_size=chunk_size,
    )
    entail = entailment_loss(text, image, curv).mean()
    metrics = {
      "loss/contrastive": contrastive,
      "loss/entailment": entail,
      "clamped_fraction": clamped_fraction(image, all_text, curv, chunk_size),
      "exp_map_capped_fraction": capped_fraction(image, text, curv),
      "mean_dist_origin/image": lorentz.dist_to_origin(image, curv).mean(),
      "mean_dist_origin/text": lorentz.dist_to_origin(text, curv).mean(),
      **cone_health(text, image, curv),
    }
    return contrastive, entail, metrics

  def _sigmoid_and_entailment(self, model, image, text, axis_name):
    curv = model.curv()
    chunk_size = self.settings.logit_chunk_size
    all_text = None
    if self.settings.sigmoid_columns == "ring":
      clamped = ring_clamped_fraction(image, text, curv, axis_name, chunk_size)
    else:
      all_text = base.gather_columns(text, axis_name)
      clamped = clamped_fraction(image, all_text, curv, chunk_size)
    contrastive = pairwise_sigmoid.sigmoid_contrastive(
      biased_neg_distance_logits,
      (model.logit_scale(), curv, model.learned_logit_bias()),
      image,
      text,
      axis_name,
      columns=self.settings.sigmoid_columns,
      chunk_size=chunk_size,
      all_text=all_text,
    )
    entail = entailment_loss(text, image, curv).mean()
    metrics = {
      "loss/contrastive": contrastive,
      "loss/entailment": entail,
      "clamped_fraction": clamped,
      "exp_map_capped_fraction": capped_fraction(image, text, curv),
      "mean_dist_origin/image": lorentz.dist_to_origin(image, curv).mean(),
      "mean_dist_origin/text": lorentz.dist_to_origin(text, curv).mean(),
      **cone_health(text, image, curv),
    }
    return contrastive, entail, metrics

  def loss(self, model, aux, batch, *, rng, axis_name, context=base.EMPTY_CONTEXT):
    del rng, context
    image = model.encode_image(batch["image"])
    text = model.encode_text(batch["tokens"])
    contrastive, entail, metrics = self.contrastive_and_entailment(model, image, text, axis_name)
    weighted, weight_metrics, aux = entailment_weight.weighted_entailment(
      self.settings, model, aux, entail
    )
    total = contrastive + weighted
    return total, ({**metrics, **weight_metrics, **self.scalar_metrics(model)}, aux)

  def score(self, model, image_emb, text_emb):
    # MERU ranks by the Lorentzian inner product (monotone in -distance).
    return lorentz.pairwise_inner(image_emb, text_emb, model.curv())
