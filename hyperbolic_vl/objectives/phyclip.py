"""PHyCLIP (Yoshikawa and Matsubara, ICLR 2026): HyCoCLIP's terms in a product of
K small Lorentz spaces.

The model (`model.factor_dim` = d > 0) splits each embedding of width
D = K d into K factors; factor k lies on its own hyperboloid of curvature
-c_k, with its own alphas (geometry/product.py, models/two_towers.py). With
d_k the factor's Lorentz distance, the product distance is

  D(x, y) = (1/K) sum_k d_k(x_k, y_k)          ("l1", the release's default)
  D(x, y) = sqrt((1/K) sum_k d_k(x_k, y_k)^2)  ("l2")

and the loss is HyCoCLIP's (objectives/hycoclip.py) with D in place of d_L
and per-factor cones in place of the single cone:

  L_cont = 1/4 [CE(I -> T) + CE(T -> I) + CE(I_b -> T) + CE(T_b -> I)]
  E(x, y; f) = mean over (i, k) of max(0, ext_k(x_ik, y_ik) - f aper_k(x_ik))
  L_entail = 1/2 [E(T, I; 0.7) + E(T_b, I_b; 0.7) + E(I_b, I; 1.2) + E(T_b, T; 1.2)]
  L = L_cont + lambda L_entail, lambda = 0.2

CE of logits -s D against the gathered columns of the whole global batch,
box rows against whole captions and images, as HyCoCLIP. Every distance,
angle and aperture applies the release's clamps at `eps` (its
`lorentz_eps`, 1e-6), which bind in float32. Retrieval and zero-shot rank by
the release's evaluation score, the sum of per-factor Lorentz inner products.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp

from hyperbolic_vl.geometry import product
from hyperbolic_vl.objectives import base, chunked, entailment_weight, hycoclip, registry
from hyperbolic_vl.objectives import settings as settings_lib


@dataclasses.dataclass(frozen=True)
class ProductLogits:
  """logits -s D(rows_i, columns_j) for params (s, curvs); hashable, so the
  chunked cross-entropy's custom VJP can take it as a static function."""

  aggregation: str
  eps: float

  def __call__(self, rows: jax.Array, columns: jax.Array, scale_and_curvs) -> jax.Array:
    scale, curvs = scale_and_curvs
    return -scale * product.pairwise_dist(rows, columns, curvs, self.aggregation, self.eps)


def directional_cross_entropy(rows, columns, positives, params, axis_name, logits, chunk_size):
  """Mean CE of -s D(rows, gathered columns), row i's positive its own
  example's column; chunked over columns when chunk_size > 0."""
  if chunk_size < 0:
    raise ValueError(f"logit_chunk_size must be >= 0, got {chunk_size}")
  if not chunk_size:
    return base.cross_entropy(
      logits(rows, columns, params), base.local_targets(rows.shape[0], axis_name)
    )
  return chunked.cross_entropy(logits, rows, columns, positives, params, chunk_size)


def scaled_entailment(general, specific, curvs, aperture_factor: float, eps: float) -> jax.Array:
  """max(0, ext_k(general, specific) - factor aper_k(general)) per pair and factor, (b, K)."""
  angle = product.oxy_angle(general, specific, curvs, eps)
  return jax.nn.relu(angle - aperture_factor * product.half_aperture(general, curvs, eps=eps))


@dataclasses.dataclass(frozen=True)
class PhyclipSettings(entailment_weight.EntailmentWeightSettings, settings_lib.ObjectiveSettings):
  """PHyCLIP: HyCoCLIP's terms with product distances and per-factor cones."""

  name: ClassVar[str] = "phyclip"
  entail_weight: float = 0.2  # lambda (released configs)
  inter_modal_aperture: float = 0.7  # text -> image, phrase -> box (released code)
  intra_modal_aperture: float = 1.2  # box -> image, phrase -> caption (released code)
  # How per-factor distances combine: "l1" their mean (released default),
  # "l2" the root of the mean of their squares.
  product_metric: str = "l1"
  # The release's clamps in every distance, angle and aperture (its
  # lorentz_eps); 0 uses the plain Lorentz guards of geometry/lorentz.py.
  eps: float = 1e-6
  logit_chunk_size: int = 0  # as MeruSettings.logit_chunk_size
  box_tower_calls: int = 1  # as HycoclipSettings.box_tower_calls

  def __post_init__(self):
    settings_lib.check_choice(self, "product_metric", product.AGGREGATIONS)
    settings_lib.check_choice(self, "box_tower_calls", (1, 2))
    if self.eps < 0:
      raise ValueError(f"objective.eps={self.eps} must be >= 0")
    self.check_entailment_weight()


@registry.register
class PhyclipObjective(entailment_weight.EntailmentWeightHooks, base.Objective):
  name = "phyclip"
  geometry = "lorentz"
  product_geometry = True
  Settings = PhyclipSettings
  tower_inputs = hycoclip.HycoclipObjective.tower_inputs
  # The four embeddings per step, as HyCoCLIP computes them.
  embed = hycoclip.HycoclipObjective.embed

  def check_model_config(self, model_config):
    super().check_model_config(model_config)
    if not (dict(model_config).get("factor_dim", 0) or 0):
      raise ValueError(
        "objective 'phyclip' needs a product of Lorentz spaces: set model.factor_dim > 0 "
        "(the release: 8, with embed_dim 512)"
      )
    entailment_weight.check_model_config(self.settings, model_config)

  def loss(self, model, aux, batch, *, rng, axis_name, context=base.EMPTY_CONTEXT):
    del rng, context
    settings = self.settings
    curvs = model.curv()
    params = (model.logit_scale(), curvs)
    logits = ProductLogits(settings.product_metric, float(settings.eps))
    emb = self.embed(model, batch)
    gathered = {key: base.gather_columns(emb[key], axis_name) for key in ("image", "text")}
    metrics = {}
    for label, rows, columns in hycoclip.CONTRASTIVE_TERMS:
      metrics[f"loss/contrastive/{label}"] = directional_cross_entropy(
        emb[rows],
        gathered[columns],
        emb[columns],
        params,
        axis_name,
        logits,
        settings.logit_chunk_size,
      )
    factors = {"inter": settings.inter_modal_aperture, "intra": settings.intra_modal_aperture}
    for label, general, specific, kind in hycoclip.ENTAILMENT_TERMS:
      metrics[f"loss/entailment/{label}"] = scaled_entailment(
        emb[general], emb[specific], curvs, factors[kind], settings.eps
      ).mean()
    # The release's 1/2 (whole pairs + box pairs) of two 1/2-weighted
    # directions: each contrastive term weighs 1/4, as HyCoCLIP.
    contrastive = (
      sum(metrics[f"loss/contrastive/{label}"] for label, *_ in hycoclip.CONTRASTIVE_TERMS) / 4
    )
    entail = 0.5 * sum(
      metrics[f"loss/entailment/{label}"] for label, *_ in hycoclip.ENTAILMENT_TERMS
    )
    weighted, weight_metrics, aux = entailment_weight.weighted_entailment(
      settings, model, aux, entail
    )
    total = contrastive + weighted
    metrics.update(weight_metrics)
    metrics["loss/contrastive"] = contrastive
    metrics["loss/entailment"] = entail
    # Share of (embedding, factor) pairs at the exponential map's cap.
    everything = jnp.concatenate([emb["image"], emb["box_image"], emb["text"], emb["box_text"]])
    metrics["exp_map_capped_fraction"] = (
      product.exp_map_capped(everything, curvs).astype(jnp.float32).mean()
    )
    for level in hycoclip.LEVELS:
      metrics[f"mean_dist_origin/{level}"] = product.dist_to_origin(
        emb[level], curvs, settings.product_metric
      ).mean()
    return total, ({**metrics, **self.scalar_metrics(model)}, aux)

  def scalar_metrics(self, model):
    """The logit scale and the K curvatures and alphas as mean / min / max."""
    metrics = {"logit_scale": model.logit_scale()}
    for name, values in (
      ("curv", model.curv()),
      ("alpha_img", model.alpha("img")),
      ("alpha_txt", model.alpha("txt")),
    ):
      metrics[f"{name}/mean"] = jnp.mean(values)
      metrics[f"{name}/min"] = jnp.min(values)
      metrics[f"{name}/max"] = jnp.max(values)
    return metrics

  def score(self, model, image_emb, text_emb):
    # The release's evaluation: sum_k <x_k, y_k>_{L, c_k}.
    return product.pairwise_score(image_emb, text_emb, model.curv())
