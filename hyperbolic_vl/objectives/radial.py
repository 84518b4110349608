"""Radial Embeddings (Alper & Averbuch-Elor, ECCV 2024; supplementary 2.2, 2.4).

Text-only fine-tuning of a pretrained two-tower model so that text
hierarchies become radial around a root r.

Root-relative exterior angle (Euclidean, e = unit-normalised text embedding):

  Xi_r(e, e') = arccos( <e - r, e' - e> / (|e - r| |e' - e|) )

the angle at e between the ray r->e extended and the segment e->e'. It is 0
when e' lies on the ray from r through e, beyond e. For Lorentz (MERU)
models the root is the hyperboloid origin and Xi is MERU's exterior angle
(`lorentz.oxy_angle`, eq. 11).

RE loss for a caption hierarchy (P_1..P_4) with negatives (N_1..N_4), for the
triplets (P_i, P_{i+1}, N_i), i = 1..3, item j:

  L_RE^(i,j) = Xi_r(P_i, P_{i+1}) - Xi_r(P_i, N_i)
  L_RE~      = mean_{i,j} L_RE^(i,j) + L_RE^(i',j') + L_RE^(i'',j'')
  (i',j')  = argmax Xi_r(P_i, P_{i+1}),  (i'',j'') = argmin Xi_r(P_i, N_i)

over the GLOBAL batch (the hardest terms are picked after an all_gather).
Pull-back regulariser against the frozen starting model (params in aux):

  objective.pullback = "released" (default; the authors' released code):
  L_reg = (1 - mean over the batch's texts of cos(e, e_0)) / 2
        = mean |e - e_0|^2 / 4 for unit e, e_0; texts only (positives and
          negatives), the root gets no term of its own.
  objective.pullback = "squared" (our earlier reading):
  L_reg = mean over the batch's texts of |e - e_0|^2  (+ |r - r_0|^2 for the
          empty-string root, which moves with the tower); 4x the released
          term, so lambda_reg 10 here is lambda_reg 40 in released units.

with e, e_0 unit-normalised (Euclidean) or the tangent vectors log_0(e)
(Lorentz, where "released" uses mean |v - v_0|^2 / 4, the same formula
without the unit-norm identity: smooth at e = e_0 where the geodesic
distance is not).

  L = lambda_RE L_RE~ + lambda_reg L_reg      (1, 10)

Root options (objective.root):
  empty        embedding of the empty string, recomputed each step with the
               trained tower (the paper's default; the root moves)
  empty_init   the empty-string embedding of the starting model, fixed
  mean         normalised mean embedding of training tier texts, fixed
  zero         the origin, fixed
  learned      the starting empty-string embedding (aux) plus a learned
               offset `radial_root` (a param, init 0, kept at its init
               when the other params come from config.init_from).
  origin       Lorentz models (the only option there; "auto" picks it)
Only the text tower, its projection (and the Lorentz text alpha, a part of
the projection) and a learned root train.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from hyperbolic_vl.geometry import lorentz, safe
from hyperbolic_vl.objectives import base, registry
from hyperbolic_vl.objectives import clip as clip_lib
from hyperbolic_vl.objectives import settings as settings_lib

TRAINABLE_PREFIXES = ("text_tower", "text_proj", "log_alpha_txt", "radial_root")


def euclidean_exterior_angle(e: jax.Array, e_next: jax.Array, root: jax.Array) -> jax.Array:
  """Xi_r(e, e') elementwise over (..., D) (unit-normalised inputs expected)."""
  outward = e - root
  step = e_next - e
  cosine = jnp.sum(outward * step, axis=-1) / (safe.safe_norm(outward) * safe.safe_norm(step))
  # e' == e (duplicate captions) gives 0/0 -> safe_norm's floor turns it into
  # 0/tiny = 0 -> angle pi/2 with a finite gradient; safe.acos clips rounding.
  return safe.acos(cosine)


ROOTS = ("auto", "empty", "empty_init", "mean", "zero", "learned", "origin")


@dataclasses.dataclass(frozen=True)
class RadialSettings(settings_lib.ObjectiveSettings):
  """Radial Embeddings: RE loss + pull-back to the initial embeddings."""

  name: ClassVar[str] = "radial"
  root: str = "auto"  # euclidean: "empty" (paper); lorentz: "origin"
  re_weight: float = 1.0  # lambda_RE
  reg_weight: float = 10.0  # lambda_reg
  # "released": (1 - mean cos(e, e0)) / 2 over the texts (authors' code);
  # "squared": mean |e - e0|^2 plus a root term (our earlier reading, 4x).
  pullback: str = "released"
  hard_mining: bool = True  # + hardest positive / negative terms

  def __post_init__(self):
    settings_lib.check_choice(self, "root", ROOTS)
    settings_lib.check_choice(self, "pullback", ("released", "squared"))


@registry.register
class RadialObjective(base.Objective):
  name = "radial"
  geometry = "euclidean"
  Settings = RadialSettings
  # Text only: every caption tier and its negative through the trained text
  # tower and, forward only, the frozen reference copy (the pull-back).
  tower_inputs = (("tier_tokens", "text"), ("neg_tier_tokens", "text"))
  frozen_tower_inputs = tower_inputs
  # HierarCaps' four tiers (T1 => T4) per row.
  inputs_per_row = {"tier_tokens": 4, "neg_tier_tokens": 4}

  # -- configuration ----------------------------------------------------------
  def root_kind(self, geometry: str) -> str:
    root = self.settings.root
    if geometry == "lorentz":
      if root not in ("auto", "origin"):
        raise ValueError(
          "Lorentz models use the hyperboloid origin as root (objective.root="
          f"'origin' or 'auto'), got {root!r}"
        )
      return "origin"
    if root == "origin":
      raise ValueError("root='origin' is for Lorentz models; Euclidean ones use 'zero'")
    return "empty" if root == "auto" else root

  def check_model_config(self, model_config):
    self.refuse_product_geometry(model_config)
    # Either geometry: the root must suit the model's (origin for Lorentz, a
    # Euclidean root otherwise), and a learned root needs its parameter.
    model_config = dict(model_config)
    root = self.root_kind(model_config.get("geometry", "euclidean"))
    name = model_config.get("name", "two_towers")
    wanted = "two_towers_with_root" if root == "learned" else "two_towers"
    if name != wanted:
      raise ValueError(
        f"objective.root={self.settings.root!r} needs model.name={wanted!r}, got {name!r} "
        "(configs/radial.py:root=learned sets both)"
      )

  def trainable(self, path):
    return path[0] in TRAINABLE_PREFIXES

  def fresh_params(self):
    # The learned root offset is new on top of the run being fine-tuned.
    return ("radial_root",)

  # -- embeddings -----------------------------------------------------------
  def embed(self, model, tokens: jax.Array) -> jax.Array:
    """Text embeddings the angles are measured on: unit vectors / hyperboloid."""
    emb = model.encode_text(tokens)
    if model.geometry == "lorentz":
      return emb
    return clip_lib.l2_normalize(emb)

  def _reference_model(self, model, reference: dict):
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    pure = nnx.to_pure_dict(params)
    pure.update(jax.tree.map(jax.lax.stop_gradient, reference))
    nnx.replace_by_pure_dict(params, pure)
    return nnx.merge(graphdef, params, rest)

  def init_aux(self, model, params, rng, context=base.EMPTY_CONTEXT):
    del rng
    reference = {k: v for k, v in params.items() if k in TRAINABLE_PREFIXES and k != "radial_root"}
    # Copies: the train step donates the state, and shared buffers cannot be donated twice.
    aux = {"reference": jax.tree.map(lambda x: jnp.array(x, copy=True), reference)}
    root = self.root_kind(model.geometry)
    if root in ("empty", "empty_init", "learned"):
      if context.tokenizer is None:
        raise ValueError(f"objective.root={root!r} needs the run's tokenizer in its RunContext")
      # The root text's tokens (the empty caption) travel in aux, so the loss
      # and inference embed it with the same tower and nothing is set later.
      root_tokens = jnp.asarray(np.asarray(context.tokenizer.encode([""]), np.int32))
      if root == "empty":
        aux["root_tokens"] = root_tokens
    if root in ("empty_init", "learned"):
      aux["root"] = self.embed(self._reference_model(model, params), root_tokens)[0]
    elif root == "zero":
      aux["root"] = jnp.zeros((model.embed_dim,), model.feature_dtype)
    elif root == "mean":
      aux["root"] = self._mean_root(self._reference_model(model, params), context)
    return aux

  def _mean_root(self, live_model, context) -> jax.Array:
    """Normalised mean embedding of training tier texts (positive and
    negative, every tier separately): the paper's e-bar."""
    if context.sample_batch is None:
      raise ValueError("objective.root='mean' needs a sample training batch in its RunContext")
    batch = context.sample_batch()
    tokens = np.concatenate([batch["tier_tokens"], batch["neg_tier_tokens"]], 1)
    tokens = tokens.reshape(-1, tokens.shape[-1])[:4096]
    embed = jax.jit(lambda t: self.embed(live_model, t))
    emb = np.concatenate(
      [np.asarray(embed(tokens[i : i + 256])) for i in range(0, len(tokens), 256)]
    )
    mean = np.asarray(emb.mean(0), np.float64)
    return jnp.asarray(mean / max(np.linalg.norm(mean), 1e-12), live_model.feature_dtype)

  def inference_aux_template(self, model):
    if model.geometry == "lorentz":
      return None
    if self.root_kind("euclidean") == "empty":
      length = model.text_tower.context_length
      return {"root_tokens": jax.ShapeDtypeStruct((1, length), jnp.int32)}
    return {"root": jax.ShapeDtypeStruct((model.embed_dim,), model.feature_dtype)}

  def root_embedding(self, model, aux) -> jax.Array | None:
    """(D,) root r for Euclidean models; None for Lorentz (the origin)."""
    if model.geometry == "lorentz":
      return None
    root = self.root_kind("euclidean")
    if root == "empty":
      return self.embed(model, aux["root_tokens"])[0]
    if root == "learned":
      # Starting empty-string embedding + a learned offset (init 0).
      return aux["root"] + model.radial_root[...]
    return aux["root"]

  # -- loss -------------------------------------------------------------------
  def angles(
    self, model, positives: jax.Array, negatives: jax.Array, root: jax.Array | None
  ) -> tuple[jax.Array, jax.Array]:
    """(b, 4, D) positive / negative tier embeddings -> Xi(P_i, P_i+1), Xi(P_i, N_i), (b, 3)."""
    e, e_next, e_neg = positives[:, :-1], positives[:, 1:], negatives[:, :-1]
    if model.geometry == "lorentz":
      curv = model.curv()
      return lorentz.oxy_angle(e, e_next, curv), lorentz.oxy_angle(e, e_neg, curv)
    return euclidean_exterior_angle(e, e_next, root), euclidean_exterior_angle(e, e_neg, root)

  def regulariser(self, model, emb: jax.Array, ref: jax.Array) -> jax.Array:
    if model.geometry == "lorentz":
      curv = model.curv()
      emb, ref = lorentz.log_map0(emb, curv), lorentz.log_map0(ref, curv)
      squared = jnp.mean(jnp.sum((emb - ref) ** 2, axis=-1))
      return squared / 4 if self.settings.pullback == "released" else squared
    if self.settings.pullback == "released":
      return (1.0 - jnp.mean(jnp.sum(emb * ref, axis=-1))) / 2
    return jnp.mean(jnp.sum((emb - ref) ** 2, axis=-1))

  def loss(self, model, aux, batch, *, rng, axis_name, context=base.EMPTY_CONTEXT):
    del rng, context
    pos_tokens, neg_tokens = batch["tier_tokens"], batch["neg_tier_tokens"]
    b, tiers, length = pos_tokens.shape
    tokens = jnp.concatenate([pos_tokens, neg_tokens], axis=1).reshape(-1, length)
    if model.geometry != "lorentz" and self.root_kind("euclidean") == "empty":
      # The root text rides along (one extra row) so the regulariser covers it.
      tokens = jnp.concatenate([tokens, aux["root_tokens"][:, :length]], axis=0)
    emb = self.embed(model, tokens)
    ref = self.embed(self._reference_model(model, aux["reference"]), tokens)
    texts = emb[: b * 2 * tiers].reshape(b, 2 * tiers, -1)
    positives, negatives = texts[:, :tiers], texts[:, tiers:]
    if model.geometry == "lorentz":
      root = None
    elif self.root_kind("euclidean") == "empty":
      root = emb[-1]
    else:
      root = self.root_embedding(model, aux)

    angle_pos, angle_neg = self.angles(model, positives, negatives, root)
    per_triplet = angle_pos - angle_neg  # (b, 3)
    re_mean = per_triplet.mean()
    total_re = re_mean
    metrics = {}
    if self.settings.hard_mining:
      all_pos = base.gather_columns(angle_pos, axis_name).reshape(-1)
      all_neg = base.gather_columns(angle_neg, axis_name).reshape(-1)
      hardest_pos = jnp.argmax(all_pos)  # (i', j')
      hardest_neg = jnp.argmin(all_neg)  # (i'', j'')
      re_mm = (
        all_pos[hardest_pos] - all_neg[hardest_pos] + all_pos[hardest_neg] - all_neg[hardest_neg]
      )
      # Identical on every device; pmean in the step keeps it once.
      total_re = total_re + re_mm
      metrics["loss/re_minimax"] = re_mm
    num_texts = b * 2 * tiers
    reg = self.regulariser(model, emb[:num_texts], ref[:num_texts])
    if emb.shape[0] > num_texts and self.settings.pullback == "squared":
      # The root's term is added whole, not averaged with the local rows: its
      # weight must not depend on how many rows each device holds.
      reg = reg + self.regulariser(model, emb[num_texts:], ref[num_texts:])
    total = self.settings.re_weight * total_re + self.settings.reg_weight * reg
    metrics.update(
      {
        "loss/re_mean": re_mean,
        "loss/reg": reg,
        "angle/positive": angle_pos.mean(),
        "angle/negative": angle_neg.mean(),
        **self.scalar_metrics(model),
      }
    )
    return total, (metrics, aux)

  # -- evaluation ---------------------------------------------------------------
  def score(self, model, image_emb, text_emb):
    if model.geometry == "lorentz":
      return lorentz.pairwise_inner(image_emb, text_emb, model.curv())
    del model
    return clip_lib.cosine_logits(image_emb, text_emb)

  def class_embedding(self, model, prompt_tangents):
    if model.geometry == "lorentz":
      return model.lift(prompt_tangents.mean(axis=1))
    return clip_lib.l2_normalize(clip_lib.l2_normalize(prompt_tangents).mean(axis=1))
