"""MERU (Desai et al., ICML 2023): contrastive on negative Lorentzian distance
plus the entailment-cone loss "text entails its paired image".

  L = L_cont + lambda * L_entail
  L_cont   = symmetric CE of logits -d_L(x_i, y_j) * s  (MERU App. C.1)
  L_entail = mean_i max(0, ext(x_i, y_i) - aper(x_i))   (eq. 10-12)

x: text embeddings, y: image embeddings, both space components on the
hyperboloid of curvature -c; s = exp(log_logit_scale).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from hyperbolic_vl.geometry import lorentz
from hyperbolic_vl.objectives import base

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


def clamped_fraction(rows: jax.Array, columns: jax.Array, curv: jax.Array) -> jax.Array:
  arg = -curv * lorentz.pairwise_inner(rows, columns, curv)
  return jnp.mean((arg < 1 + _CLAMP_MONITOR_EPS).astype(jnp.float32))


class MeruObjective(base.Objective):
  name = "meru"
  geometry = "lorentz"

  @property
  def entail_weight(self) -> float:
    return float(self.config.get("entail_weight", 0.2))

  def contrastive_and_entailment(self, model, image, text, axis_name):
    """Shared by objectives that extend MERU (HMID-Net)."""
    curv = model.curv()
    scale = model.logit_scale()
    all_image = base.gather_columns(image, axis_name)
    all_text = base.gather_columns(text, axis_name)
    logits_i2t = -scale * lorentz.pairwise_dist(image, all_text, curv)
    logits_t2i = -scale * lorentz.pairwise_dist(text, all_image, curv)
    contrastive = base.symmetric_contrastive(logits_i2t, logits_t2i, axis_name)
    entail = entailment_loss(text, image, curv).mean()
    metrics = {
      "loss/contrastive": contrastive,
      "loss/entailment": entail,
      "clamped_fraction": clamped_fraction(image, all_text, curv),
      "mean_dist_origin/image": lorentz.dist_to_origin(image, curv).mean(),
      "mean_dist_origin/text": lorentz.dist_to_origin(text, curv).mean(),
    }
    return contrastive, entail, metrics

  def loss(self, model, aux, batch, *, rng, axis_name):
    del rng
    image = model.encode_image(batch["image"])
    text = model.encode_text(batch["tokens"])
    contrastive, entail, metrics = self.contrastive_and_entailment(model, image, text, axis_name)
    total = contrastive + self.entail_weight * entail
    return total, ({**metrics, **self.scalar_metrics(model)}, aux)

  def score(self, model, image_emb, text_emb):
    # MERU ranks by the Lorentzian inner product (monotone in -distance).
    return lorentz.pairwise_inner(image_emb, text_emb, model.curv())
