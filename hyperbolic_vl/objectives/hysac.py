"""HySAC (Poppi et al., CVPR 2025): safety-aware hyperbolic CLIP.

Each example is a quadruplet: a safe image I_s with its safe caption T_s and
an unsafe image I_u with its unsafe caption T_u, all four lifted onto one
hyperboloid of curvature -c. With C(T, I) MERU's symmetric contrastive loss
of logits -s d_L (each row's positive its own example's column),

  C_1 = C(T_s, I_s)   C_2 = C(T_u, I_u)
  C_3 = C(T_s, I_u)   (the unsafe image with its SAFE caption is a positive)
  C_4 = C(T_u, I_s)

and with E(x, y) = mean_i max(0, ext(x_i, y_i) - a aper(x_i)) the entailment
"x entails y" (a = aperture_scale),

  E_1 = E(T_s, I_s)   E_2 = E(T_u, I_u)   (each caption entails its image)
  E_3 = E(I_s, T_u)   (the safe image entails the unsafe caption)

so unsafe content is pushed beyond safe content, farther from the origin.

Normalisation. The release weighs the terms with lambda = [1,1,1,1,le,le,le]
divided by its sum and then divides lambda @ losses by 7 again:

  release:  L = (sum C + le sum E) / ((4 + 3 le) 7)     (le = 1: sum / 49)
  mean:     L = (sum C + le sum E) / 7

Contrastive scope. The release contrasts each GPU's rows with that GPU's
rows only (its gathered embeddings are never used) and never all-reduces
gradients. `global` (the default) contrasts every row with the whole global
batch, so 1 device equals N; `local` contrasts each device's rows among
themselves, which on one device at the release's batch 32 is the release.

Angles. The release's exterior angle and half aperture clamp with eps 1e-5
(`angle_eps`): the acos/asin inputs at 1 - eps (a floor of 4.5e-3 rad on
every angle and a cap of pi/2 - 4.5e-3 on every aperture), sqrt(max(a^2 - 1,
eps)) and "+ eps" in both denominators. These are formulas of the release,
not guards: angle_eps = 0 gives MERU's exact angles (geometry/lorentz.py).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp

from hyperbolic_vl.geometry import lorentz, safe
from hyperbolic_vl.objectives import base, meru, registry
from hyperbolic_vl.objectives import settings as settings_lib

# (metric name, text key, image key) of the four contrastive terms.
CONTRASTIVE_TERMS = (
  ("safe", "text", "image"),
  ("unsafe", "unsafe_text", "unsafe_image"),
  ("safe_text_unsafe_image", "text", "unsafe_image"),
  ("unsafe_text_safe_image", "unsafe_text", "image"),
)
# (metric name, the entailing side, the entailed side).
ENTAILMENT_TERMS = (
  ("safe", "text", "image"),
  ("unsafe", "unsafe_text", "unsafe_image"),
  ("safe_image_unsafe_text", "image", "unsafe_text"),
)
EMBEDDINGS = ("image", "text", "unsafe_image", "unsafe_text")
SCOPES = ("global", "local")
NORMALIZATIONS = ("release", "mean")
MIN_RADIUS = 0.1  # K of the half aperture, as MERU and the release


def release_half_aperture(x, curv, eps: float, min_radius: float = MIN_RADIUS) -> jax.Array:
  """The release's half aperture asin(clip(2K / (sqrt(c)|x| + eps), 1 - eps)).

  eps = 0 is MERU's aperture (lorentz.half_aperture)."""
  if not eps:
    return lorentz.half_aperture(x, curv, min_radius=min_radius)
  curv, x = safe.prepare(curv, x)
  argument = 2.0 * min_radius / (safe.safe_norm(x) * jnp.sqrt(curv) + eps)
  # With eps >= 1e-6 the clipped input keeps acos/asin derivatives finite
  # (1/sqrt(2 eps) <= 710), so the plain functions are safe here.
  return jnp.arcsin(jnp.clip(argument, -1.0 + eps, 1.0 - eps))


def release_oxy_angle(x, y, curv, eps: float) -> jax.Array:
  """The release's exterior angle at x towards y (MERU eq. 11 with its eps
  clamps): acos(clip(num / (|x| sqrt(max(a^2 - 1, eps)) + eps), 1 - eps)).

  eps = 0 is MERU's exact angle (lorentz.oxy_angle)."""
  if not eps:
    return lorentz.oxy_angle(x, y, curv)
  curv, x, y = safe.prepare(curv, x, y)
  x_time = lorentz.time_component(x, curv)
  y_time = lorentz.time_component(y, curv)
  scaled_inner = curv * lorentz.elementwise_inner(x, y, curv)
  numerator = y_time + scaled_inner * x_time
  # (a - 1)(a + 1) is a^2 - 1 with less cancellation; the floor is the release's.
  sinh_dist = jnp.sqrt(jnp.maximum((scaled_inner - 1.0) * (scaled_inner + 1.0), eps))
  argument = numerator / (safe.safe_norm(x) * sinh_dist + eps)
  return jnp.arccos(jnp.clip(argument, -1.0 + eps, 1.0 - eps))


def entailment(general, specific, curv, aperture_scale: float, eps: float) -> jax.Array:
  """mean_i max(0, ext(general_i, specific_i) - a aper(general_i))."""
  angle = release_oxy_angle(general, specific, curv, eps)
  aperture = release_half_aperture(general, curv, eps)
  return jax.nn.relu(angle - aperture_scale * aperture).mean()


def contrastive(text, image, scale_and_curv, axis_name: str | None) -> jax.Array:
  """1/2 [CE(image rows -> text columns) + CE(text rows -> image columns)]
  of logits -s d_L; axis_name None contrasts the given rows only."""
  all_text = base.gather_columns(text, axis_name)
  all_image = base.gather_columns(image, axis_name)
  targets = base.local_targets(text.shape[0], axis_name)
  image_rows = meru.neg_distance_logits(image, all_text, scale_and_curv)
  text_rows = meru.neg_distance_logits(text, all_image, scale_and_curv)
  return 0.5 * (base.cross_entropy(image_rows, targets) + base.cross_entropy(text_rows, targets))


def total_loss(terms: dict[str, jax.Array], entail_weight: float, normalization: str):
  """The seven terms -> the loss (release or mean normalisation)."""
  contrastive_sum = sum(terms[f"loss/contrastive/{label}"] for label, *_ in CONTRASTIVE_TERMS)
  entail_sum = sum(terms[f"loss/entailment/{label}"] for label, *_ in ENTAILMENT_TERMS)
  weighted = contrastive_sum + entail_weight * entail_sum
  num_terms = len(CONTRASTIVE_TERMS) + len(ENTAILMENT_TERMS)
  if normalization == "release":
    # lambda / sum(lambda), then / lambda.numel() (hysac_train.py, training.py).
    weight_sum = len(CONTRASTIVE_TERMS) + len(ENTAILMENT_TERMS) * entail_weight
    return weighted / (weight_sum * num_terms)
  return weighted / num_terms


@dataclasses.dataclass(frozen=True)
class HysacSettings(settings_lib.ObjectiveSettings):
  """HySAC: four contrastive and three entailment terms on quadruplets."""

  name: ClassVar[str] = "hysac"
  entail_weight: float = 1.0  # lambda_e, the release's CLI default
  aperture_scale: float = 1.0  # a, the release's --aperture-scale
  angle_eps: float = 1e-5  # the release's clamps in oxy_angle and half_aperture
  contrastive_scope: str = "global"  # or "local": each device's rows only (release)
  normalization: str = "release"  # or "mean"

  def __post_init__(self):
    settings_lib.check_choice(self, "contrastive_scope", SCOPES)
    settings_lib.check_choice(self, "normalization", NORMALIZATIONS)


@registry.register
class HysacObjective(base.Objective):
  name = "hysac"
  geometry = "lorentz"
  Settings = HysacSettings
  tower_inputs = (
    ("image", "image"),
    ("tokens", "text"),
    ("unsafe_image", "image"),
    ("unsafe_tokens", "text"),
  )

  def embed(self, model, batch) -> dict[str, jax.Array]:
    """Safe and unsafe rows of each modality through one tower call."""
    num_rows = batch["image"].shape[0]
    images = model.encode_image(jnp.concatenate([batch["image"], batch["unsafe_image"]]))
    texts = model.encode_text(jnp.concatenate([batch["tokens"], batch["unsafe_tokens"]]))
    return {
      "image": images[:num_rows],
      "unsafe_image": images[num_rows:],
      "text": texts[:num_rows],
      "unsafe_text": texts[num_rows:],
    }

  def terms(self, emb, curv, scale, axis_name) -> dict[str, jax.Array]:
    """The seven terms {metric name: value} from the four local embeddings."""
    settings = self.settings
    scope_axis = axis_name if settings.contrastive_scope == "global" else None
    terms = {}
    for label, text, image in CONTRASTIVE_TERMS:
      terms[f"loss/contrastive/{label}"] = contrastive(
        emb[text], emb[image], (scale, curv), scope_axis
      )
    for label, general, specific in ENTAILMENT_TERMS:
      terms[f"loss/entailment/{label}"] = entailment(
        emb[general], emb[specific], curv, settings.aperture_scale, settings.angle_eps
      )
    return terms

  def loss(self, model, aux, batch, *, rng, axis_name, context=base.EMPTY_CONTEXT):
    del rng, context
    settings = self.settings
    curv = model.curv()
    emb = self.embed(model, batch)
    metrics = self.terms(emb, curv, model.logit_scale(), axis_name)
    total = total_loss(metrics, settings.entail_weight, settings.normalization)
    metrics["clamped_fraction"] = meru.clamped_fraction(
      emb["image"], base.gather_columns(emb["text"], axis_name), curv
    )
    metrics["exp_map_capped_fraction"] = meru.capped_fraction(
      jnp.concatenate([emb["image"], emb["unsafe_image"]]),
      jnp.concatenate([emb["text"], emb["unsafe_text"]]),
      curv,
    )
    for key in EMBEDDINGS:
      metrics[f"mean_dist_origin/{key}"] = lorentz.dist_to_origin(emb[key], curv).mean()
    return total, ({**metrics, **self.scalar_metrics(model)}, aux)

  def score(self, model, image_emb, text_emb):
    # The release ranks by the Lorentzian inner product (recalls.py `recall`).
    return lorentz.pairwise_inner(image_emb, text_emb, model.curv())
