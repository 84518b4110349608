"""HyCoCLIP (Pal et al., ICLR 2025): MERU with grounded boxes and
compositional entailment.

Each example is a whole image I with its caption T and one grounded box:
its image crop I_b and noun phrase T_b. All four go through the model in the
same step (the box crops through the image tower, the phrases through the
text tower) onto one hyperboloid of curvature -c. With d_L the Lorentz
distance, s the logit scale and CE(rows -> columns) the mean cross-entropy
of logits -s d_L against the gathered columns of the WHOLE global batch
(each row's positive: its own example's column),

  L_cont = 1/4 [CE(I -> T) + CE(T -> I) + CE(I_b -> T) + CE(T_b -> I)]

(as released: box rows are contrasted with whole captions and whole images;
no box is ever a column). With ext(x, y) the exterior angle at x towards y
and aper(x) MERU's half aperture (K = 0.1),

  E(x, y; f) = mean_i max(0, ext(x_i, y_i) - f aper(x_i))
  L_entail   = 1/2 [E(T, I; f_inter) + E(T_b, I_b; f_inter)
                    + E(I_b, I; f_intra) + E(T_b, T; f_intra)]

the inter-modal terms (a text entails its image) with f_inter = 0.7, the
intra-modal ones (a box entails its whole image, a phrase its caption) with
f_intra = 1.2; the 1/2 (not 1/4) is the released code's. Then
L = L_cont + lambda L_entail, lambda = 0.2. Curvature, alphas and the logit
scale's clamp are MERU's (`project_params`).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp

from hyperbolic_vl import errors
from hyperbolic_vl.geometry import lorentz
from hyperbolic_vl.objectives import base, chunked, entailment_weight, meru, registry
from hyperbolic_vl.objectives import settings as settings_lib

# (metric name, rows, columns): the four contrastive directions; box rows
# meet the whole images' or captions' columns.
CONTRASTIVE_TERMS = (
  ("image", "image", "text"),
  ("text", "text", "image"),
  ("box_image", "box_image", "text"),
  ("box_text", "box_text", "image"),
)
# (metric name, the entailing side, the entailed side, aperture factor).
ENTAILMENT_TERMS = (
  ("text_image", "text", "image", "inter"),
  ("box_text_box_image", "box_text", "box_image", "inter"),
  ("box_image_image", "box_image", "image", "intra"),
  ("box_text_text", "box_text", "text", "intra"),
)
LEVELS = ("box_text", "text", "box_image", "image")


def scaled_entailment(
  general: jax.Array, specific: jax.Array, curv: jax.Array, aperture_factor: float
) -> jax.Array:
  """max(0, ext(general, specific) - factor * aper(general)) per pair, shape (b,)."""
  angle = lorentz.oxy_angle(general, specific, curv)
  return jax.nn.relu(angle - aperture_factor * lorentz.half_aperture(general, curv))


def directional_cross_entropy(
  rows: jax.Array,
  columns: jax.Array,
  positives: jax.Array,
  params,
  axis_name: str | None,
  chunk_size: int,
) -> jax.Array:
  """Mean CE of -s d_L(rows, gathered columns), row i's positive its own
  example's column (`positives[i]`, the local partner); chunked when
  chunk_size > 0, as MERU's loss."""
  if chunk_size < 0:
    raise ValueError(f"logit_chunk_size must be >= 0, got {chunk_size}")
  if not chunk_size:
    logits = meru.neg_distance_logits(rows, columns, params)
    return base.cross_entropy(logits, base.local_targets(rows.shape[0], axis_name))
  return chunked.cross_entropy(
    meru.neg_distance_logits, rows, columns, positives, params, chunk_size
  )


@dataclasses.dataclass(frozen=True)
class HycoclipSettings(entailment_weight.EntailmentWeightSettings, settings_lib.ObjectiveSettings):
  """HyCoCLIP: four contrastive terms plus lambda x four entailment terms."""

  name: ClassVar[str] = "hycoclip"
  entail_weight: float = 0.2  # lambda (released configs)
  inter_modal_aperture: float = 0.7  # text -> image, phrase -> box (released code)
  intra_modal_aperture: float = 1.2  # box -> image, phrase -> caption (released code)
  logit_chunk_size: int = 0  # as MeruSettings.logit_chunk_size
  # Tower calls per tower and step: 1 runs whole images and box crops (and
  # captions and phrases) through one call on the concatenated rows, 2 calls
  # each tower twice as the released code does. The embeddings are the same;
  # only the speed differs (docs/methods/hycoclip.md).
  box_tower_calls: int = 1

  def __post_init__(self):
    settings_lib.check_choice(self, "box_tower_calls", (1, 2))
    self.check_entailment_weight()


@registry.register
class HycoclipObjective(entailment_weight.EntailmentWeightHooks, base.Objective):
  name = "hycoclip"
  geometry = "lorentz"
  Settings = HycoclipSettings
  tower_inputs = (
    ("image", "image"),
    ("tokens", "text"),
    ("box_image", "image"),
    ("box_tokens", "text"),
  )

  def check_model_config(self, model_config):
    super().check_model_config(model_config)
    entailment_weight.check_model_config(self.settings, model_config)

  def embed(self, model, batch) -> dict[str, jax.Array]:
    """The four local embeddings; with box_tower_calls=1 whole images and box
    crops share one call of the image tower, captions and phrases one of the
    text tower; with 2 each set has its own call."""
    if batch["box_image"].ndim != batch["image"].ndim:
      # Traced shapes are static: this is raised once, at the step's trace.
      raise errors.ConfigError(
        f"objective {self.name!r} takes one box per row; the data source gives "
        f"{batch['box_image'].shape[1]} (set input.data.max_boxes=0, or use objective 'uncha')"
      )
    if self.settings.box_tower_calls == 2:
      return {
        "image": model.encode_image(batch["image"]),
        "box_image": model.encode_image(batch["box_image"]),
        "text": model.encode_text(batch["tokens"]),
        "box_text": model.encode_text(batch["box_tokens"]),
      }
    num_rows = batch["image"].shape[0]
    images = model.encode_image(jnp.concatenate([batch["image"], batch["box_image"]]))
    texts = model.encode_text(jnp.concatenate([batch["tokens"], batch["box_tokens"]]))
    return {
      "image": images[:num_rows],
      "box_image": images[num_rows:],
      "text": texts[:num_rows],
      "box_text": texts[num_rows:],
    }

  def loss(self, model, aux, batch, *, rng, axis_name, context=base.EMPTY_CONTEXT):
    del rng, context
    settings = self.settings
    curv = model.curv()
    params = (model.logit_scale(), curv)
    emb = self.embed(model, batch)
    gathered = {key: base.gather_columns(emb[key], axis_name) for key in ("image", "text")}
    metrics = {}
    for label, rows, columns in CONTRASTIVE_TERMS:
      metrics[f"loss/contrastive/{label}"] = directional_cross_entropy(
        emb[rows], gathered[columns], emb[columns], params, axis_name, settings.logit_chunk_size
      )
    factors = {"inter": settings.inter_modal_aperture, "intra": settings.intra_modal_aperture}
    for label, general, specific, kind in ENTAILMENT_TERMS:
      metrics[f"loss/entailment/{label}"] = scaled_entailment(
        emb[general], emb[specific], curv, factors[kind]
      ).mean()
    contrastive = sum(metrics[f"loss/contrastive/{label}"] for label, *_ in CONTRASTIVE_TERMS) / 4
    entail = 0.5 * sum(metrics[f"loss/entailment/{label}"] for label, *_ in ENTAILMENT_TERMS)
    weighted, weight_metrics, aux = entailment_weight.weighted_entailment(
      settings, model, aux, entail
    )
    total = contrastive + weighted
    metrics.update(weight_metrics)
    metrics["loss/contrastive"] = contrastive
    metrics["loss/entailment"] = entail
    metrics["clamped_fraction"] = meru.clamped_fraction(
      emb["image"], gathered["text"], curv, settings.logit_chunk_size
    )
    metrics["exp_map_capped_fraction"] = meru.capped_fraction(
      jnp.concatenate([emb["image"], emb["box_image"]]),
      jnp.concatenate([emb["text"], emb["box_text"]]),
      curv,
    )
    for level in LEVELS:
      metrics[f"mean_dist_origin/{level}"] = lorentz.dist_to_origin(emb[level], curv).mean()
    # The caption -> image cone, as MERU logs it (the collapse warning reads it).
    metrics.update(
      meru.cone_health(
        emb["text"], emb["image"], curv, aperture_factor=settings.inter_modal_aperture
      )
    )
    return total, ({**metrics, **self.scalar_metrics(model)}, aux)

  def score(self, model, image_emb, text_emb):
    # As MERU: the Lorentzian inner product (monotone in -distance).
    return lorentz.pairwise_inner(image_emb, text_emb, model.curv())
