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

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from hyperbolic_vl.evaluators import hierarchy
from hyperbolic_vl.geometry import lorentz, safe
from hyperbolic_vl.models import two_towers
from hyperbolic_vl.objectives import base
from hyperbolic_vl.objectives import clip as clip_lib
from hyperbolic_vl.objectives import settings as settings_lib

ROOTS = settings_lib.RADIAL_ROOTS
TRAINABLE_PREFIXES = ("text_tower", "text_proj", "log_alpha_txt", "radial_root")


def euclidean_exterior_angle(e: jax.Array, e_next: jax.Array, root: jax.Array) -> jax.Array:
  """Xi_r(e, e') elementwise over (..., D) (unit-normalised inputs expected)."""
  outward = e - root
  step = e_next - e
  cosine = jnp.sum(outward * step, axis=-1) / (safe.safe_norm(outward) * safe.safe_norm(step))
  # e' == e (duplicate captions) gives 0/0 -> safe_norm's floor turns it into
  # 0/tiny = 0 -> angle pi/2 with a finite gradient; safe.acos clips rounding.
  return safe.acos(cosine)


class RadialObjective(base.Objective):
  name = "radial"
  geometry = "euclidean"
  Settings = settings_lib.RadialSettings

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

  def build_model(self, config, *, vocab_size, context_length, rngs):
    # Either geometry: the root is checked against the model's (origin for
    # Lorentz, a Euclidean root otherwise) before anything is built.
    model_config = dict(config.model)
    root = self.root_kind(model_config.get("geometry", "euclidean"))
    return two_towers.build_two_towers(
      model_config,
      vocab_size=vocab_size,
      context_length=context_length,
      image_size=config.input.image_size,
      rngs=rngs,
      learned_root=root == "learned",
    )

  def trainable(self, path):
    return path[0] in TRAINABLE_PREFIXES

  def fresh_params(self):
    # The learned root offset is new on top of the run being fine-tuned.
    return ("radial_root",)

  # -- root text tokens ---------------------------------------------------------
  def set_tokenizer(self, tokenizer, input_config=None) -> None:
    self.tokenizer = tokenizer
    self.input_config = input_config
    self.root_tokens = np.asarray(tokenizer.encode([""]), np.int32)  # (1, L)

  def _root_tokens(self) -> jax.Array:
    tokens = getattr(self, "root_tokens", None)
    if tokens is None:
      raise ValueError(
        "RadialObjective needs set_tokenizer() (train.py calls "
        "make_train_iterator first, which sets it)"
      )
    return jnp.asarray(tokens)

  def make_train_iterator(self, config, tokenizer):
    # Text only: the RE loss never looks at images, so none are rendered.
    self.set_tokenizer(tokenizer, config.input)
    from hyperbolic_vl.data import registry  # transitional (issue 17)

    return registry.make_train_iterator(config.input, tokenizer, seed=config.seed)

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

  def init_aux(self, model, params, rng):
    del rng
    reference = {k: v for k, v in params.items() if k in TRAINABLE_PREFIXES and k != "radial_root"}
    # Copies: the train step donates the state, and shared buffers cannot be donated twice.
    aux = {"reference": jax.tree.map(lambda x: jnp.array(x, copy=True), reference)}
    root = self.root_kind(model.geometry)
    if root in ("empty_init", "mean", "zero", "learned"):
      aux["root"] = self._initial_root(model, params, root)
    return aux

  def _initial_root(self, model, params, root: str) -> jax.Array:
    if root == "zero":
      return jnp.zeros((model.embed_dim,), model.feature_dtype)
    live = self._reference_model(model, params)
    if root in ("empty_init", "learned"):
      return self.embed(live, self._root_tokens())[0]
    # mean: normalised mean of the embeddings of training tier texts (positive
    # and negative, every tier separately), as the paper's e-bar.
    from hyperbolic_vl.data import registry  # transitional (issue 17)

    iterator = registry.make_train_iterator(
      self.input_config, self.tokenizer, seed=12345, process_index=0, process_count=1
    )
    batch = next(iterator)
    tokens = np.concatenate([batch["tier_tokens"], batch["neg_tier_tokens"]], 1)
    tokens = tokens.reshape(-1, tokens.shape[-1])[:4096]
    emb = np.concatenate(
      [
        np.asarray(jax.jit(lambda t: self.embed(live, t))(tokens[i : i + 256]))
        for i in range(0, len(tokens), 256)
      ]
    )
    return jnp.asarray(hierarchy.normalize(emb.mean(0)), model.feature_dtype)

  def inference_aux_template(self, model):
    if model.geometry == "lorentz" or self.root_kind("euclidean") == "empty":
      return None
    return {"root": jax.ShapeDtypeStruct((model.embed_dim,), model.feature_dtype)}

  def root_embedding(self, model, aux) -> jax.Array | None:
    """(D,) root r for Euclidean models; None for Lorentz (the origin)."""
    if model.geometry == "lorentz":
      return None
    root = self.root_kind("euclidean")
    if root == "empty":
      return self.embed(model, self._root_tokens())[0]
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

  def loss(self, model, aux, batch, *, rng, axis_name):
    del rng
    pos_tokens, neg_tokens = batch["tier_tokens"], batch["neg_tier_tokens"]
    b, tiers, length = pos_tokens.shape
    tokens = jnp.concatenate([pos_tokens, neg_tokens], axis=1).reshape(-1, length)
    if model.geometry != "lorentz" and self.root_kind("euclidean") == "empty":
      # The root text rides along (one extra row) so the regulariser covers it.
      tokens = jnp.concatenate([tokens, self._root_tokens()[:, :length]], axis=0)
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
