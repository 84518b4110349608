"""Image/text two-tower model shared by every objective.

The towers may compute in bfloat16; everything from the projections onward
(projection, alpha scaling, exponential map) runs in float32, because bf16
spacing near 1 (2^-7) is far coarser than the hyperboloid's curvature terms.

Learned scalars live in log space under short stable names so regex masks for
weight decay, freezing and sharding can target them:
  log_logit_scale   log(1/tau), init log(1/0.07), projected to <= log(100)
                    (and >= log(model.min_logit_scale) when that is set: HySAC)
  log_curv          log(c), init log(1.0), projected to [log(c0/10), log(10 c0)]
  log_alpha_img/txt log(alpha), init log(1/sqrt(embed_dim)), projected to <= 0
  log_logit_scale_<name>  further logit scales a model config asks for
                    (`model.extra_logit_scales = {name: init}`, UNCHA's
                    "local" and "global_local"), projected as log_logit_scale;
                    absent from every other model
  logit_bias        the sigmoid loss's learned bias b (SigLIP init -10); only
                    when `model.logit_bias_init` is set, so other models and
                    their checkpoints have no such param
  log_entail_weight s of the entailment term's learned weight lambda * exp(s)
                    (objectives/entailment_weight.py), init 0, projected to
                    [-log 100, log 100]; only when `model.learned_entail_weight`
The projections are applied to the parameters after each optimizer update
(`project_learned_scalars`), outside the differentiated function, so
gradients flow as if unclamped (MERU's in-place clamp semantics).

`factor_dim` > 0 (Lorentz only; PHyCLIP) makes the embedding a product of
K = embed_dim / factor_dim Lorentz spaces (geometry/product.py): factor k
holds components [k d, (k+1) d), has its own curvature and alphas, so
`log_curv`, `log_alpha_img` and `log_alpha_txt` have shape (K,) (alphas init
factor_dim^-0.5, as the release), and `curv()` returns the (K,) curvatures.
The clamps apply per factor. 0 (the default) is one space, as before.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from hyperbolic_vl import errors
from hyperbolic_vl.geometry import lorentz, product
from hyperbolic_vl.models import lora as lora_lib
from hyperbolic_vl.models import micro_batches, token_drop
from hyperbolic_vl.models.text import TextTransformer
from hyperbolic_vl.models.tower_options import (
  checked_remat,
  compute_dtype,
  feature_dtype,
  image_tower,
  projection,
  tower_options,
)
from hyperbolic_vl.models.vit import VisionTransformer

GEOMETRIES = ("euclidean", "lorentz")
LEARNED_SCALAR_NAMES = ("log_logit_scale", "log_curv", "log_alpha_img", "log_alpha_txt")


class TwoTowers(micro_batches.MicroBatched, nnx.Module):
  """Image tower (ViT or ResNet) + causal text tower + bias-free projections.

  Euclidean geometry gives CLIP features (L2-normalised by the objective);
  Lorentz geometry lifts the alpha-scaled projections onto the hyperboloid of
  curvature -c with the exponential map at the origin (MERU), returning the
  space components.

  `image_tangent` and `text_tangent` run in micro-batches when the trainer
  sets them (`optim.accumulation_steps`, models/micro_batches.py).
  """

  has_text_tower = True

  def __init__(
    self,
    *,
    image_variant: str,
    image_size: int,
    text_variant: str,
    vocab_size: int,
    context_length: int,
    embed_dim: int,
    geometry: str = "lorentz",
    curv_init: float = 1.0,
    learn_curv: bool = True,
    curv_clamp_factor: float = 10.0,
    logit_scale_init: float = 1 / 0.07,
    max_logit_scale: float = 100.0,
    min_logit_scale: float | None = None,
    logit_bias_init: float | None = None,
    alpha_init: float | None = None,
    learn_alphas: bool = True,
    dtype: str = "float32",
    image_position_embedding: str = "sincos2d",
    image_ln_pre: bool = False,
    image_patch_bias: bool = True,
    image_num_heads: int | None = None,
    pixel_stats: str = "imagenet",
    activation: str = "gelu",
    text_init: str = "clip",
    attention_implementation: str | None = None,
    lora: lora_lib.LoraSettings = lora_lib.NO_LORA,
    image_remat: str = "none",
    text_remat: str = "none",
    factor_dim: int = 0,
    extra_logit_scales: Mapping[str, float] | None = None,
    learned_entail_weight: bool = False,
    image_token_drop: float = 0.0,
    image_token_drop_until_step: int = 0,
    text_embedding_noise: float = 0.0,
    rngs: nnx.Rngs,
  ):
    if geometry not in GEOMETRIES:
      raise ValueError(f"model.geometry={geometry!r}; valid: {GEOMETRIES}")
    self.factor_dim = checked_factor_dim(factor_dim, embed_dim, geometry)
    # K, the number of Lorentz factors; 0 for a single space (or Euclidean).
    self.num_factors = embed_dim // factor_dim if factor_dim else 0
    tower_dtype = compute_dtype(dtype)
    self.feature_dtype = feature_dtype(tower_dtype)
    # Parameters are stored in float32 (float64 in a float64 model).
    param_dtype = self.feature_dtype
    self.geometry = geometry
    self.embed_dim = embed_dim
    self.image_tower = image_tower(
      image_variant,
      image_size,
      dtype=tower_dtype,
      param_dtype=param_dtype,
      position_embedding=image_position_embedding,
      ln_pre=image_ln_pre,
      patch_bias=image_patch_bias,
      pixel_stats=pixel_stats,
      activation=activation,
      num_heads=image_num_heads,
      attention_implementation=attention_implementation,
      lora=lora.for_tower("image"),
      remat=image_remat,
      rngs=rngs,
    )
    self.image_token_drop = token_drop.check_fraction(image_token_drop)
    self.image_token_drop_until_step = int(image_token_drop_until_step)
    if self.image_token_drop and not isinstance(self.image_tower, VisionTransformer):
      raise errors.ConfigError(
        f"model.image_token_drop drops ViT patch tokens; image_variant={image_variant!r} "
        "is a ResNet"
      )
    # Set on the module merged for one training step (token_drop.training_mode).
    self.token_drop_key = None
    self.token_drop_index = None
    self.token_drop_step = None
    self.token_drop_calls = 0
    self.text_tower = TextTransformer(
      text_variant,
      vocab_size,
      context_length,
      dtype=tower_dtype,
      param_dtype=param_dtype,
      activation=activation,
      init=text_init,
      attention_implementation=attention_implementation,
      lora=lora.for_tower("text"),
      remat=checked_remat("text_remat", text_remat),
      embedding_noise=text_embedding_noise,
      rngs=rngs,
    )
    self.image_proj = projection(self.image_tower.width, embed_dim, self.feature_dtype, rngs)
    self.text_proj = projection(self.text_tower.width, embed_dim, self.feature_dtype, rngs)
    self._init_learned_scalars(
      param_dtype,
      geometry=geometry,
      embed_dim=embed_dim,
      factor_dim=factor_dim,
      curv_init=curv_init,
      learn_curv=learn_curv,
      curv_clamp_factor=curv_clamp_factor,
      logit_scale_init=logit_scale_init,
      max_logit_scale=max_logit_scale,
      min_logit_scale=min_logit_scale,
      extra_logit_scales=extra_logit_scales,
      logit_bias_init=logit_bias_init,
      alpha_init=alpha_init,
      learn_alphas=learn_alphas,
    )
    if learned_entail_weight:
      # s of the entailment term's learned weight lambda * exp(s), init 0
      # (objectives/entailment_weight.py); absent from every other model.
      self.log_entail_weight = nnx.Param(jnp.zeros((), param_dtype))

  def _init_learned_scalars(
    self,
    param_dtype,
    *,
    geometry: str,
    embed_dim: int,
    factor_dim: int,
    curv_init: float,
    learn_curv: bool,
    curv_clamp_factor: float,
    logit_scale_init: float,
    max_logit_scale: float,
    min_logit_scale: float | None,
    extra_logit_scales: Mapping[str, float] | None,
    logit_bias_init: float | None,
    alpha_init: float | None,
    learn_alphas: bool,
  ) -> None:
    """The logit scale(s) and bias, curvature and alphas (see the class
    docstring's table), each in log space with its projection bounds."""
    self.log_logit_scale = nnx.Param(
      jnp.asarray(log_of_positive(logit_scale_init, "model.logit_scale_init"), param_dtype)
    )
    self.max_log_logit_scale = log_of_positive(max_logit_scale, "model.max_logit_scale")
    # Sorted, so that the param tree does not depend on the config's key order.
    self.extra_logit_scale_names = tuple(sorted(extra_logit_scales or {}))
    for name in self.extra_logit_scale_names:
      if not name.isidentifier() or not name.islower():
        raise errors.ConfigError(
          f"model.extra_logit_scales: {name!r} is not a lower-case identifier"
        )
      init = log_of_positive(extra_logit_scales[name], f"model.extra_logit_scales.{name}")
      setattr(self, f"log_logit_scale_{name}", nnx.Param(jnp.asarray(init, param_dtype)))
    # A floor on the scale (HySAC's release keeps it >= 1/0.07, so it can only
    # grow); None: no floor, as MERU.
    self.min_log_logit_scale = (
      None if min_logit_scale is None else log_of_positive(min_logit_scale, "model.min_logit_scale")
    )
    if logit_bias_init is not None:
      self.logit_bias = nnx.Param(jnp.asarray(float(logit_bias_init), param_dtype))
    self.curv_init = float(curv_init)
    self.learn_curv = bool(learn_curv)
    # A learned c stays in [c0 / f, f c0]: MERU uses f = 10, ATMG's release 5.
    self.curv_clamp_factor = float(curv_clamp_factor)
    self.learn_alphas = bool(learn_alphas)
    if geometry == "lorentz":
      # The space's curvature is -c with c > 0; a learned c stays in [c0 / f, f c0].
      log_of_positive(curv_init, "model.curv_init")
      if not self.curv_clamp_factor >= 1:
        raise errors.ConfigError(f"model.curv_clamp_factor must be >= 1, got {curv_clamp_factor!r}")
      if alpha_init is None:
        # MERU: 1/sqrt(embed_dim); PHyCLIP: 1/sqrt(factor_dim) per factor.
        alpha_init = (factor_dim or embed_dim) ** -0.5
      # One scalar per factor in a product model, else a scalar.
      scalar_shape = (self.num_factors,) if self.num_factors else ()
      if learn_curv:
        self.log_curv = nnx.Param(jnp.full(scalar_shape, math.log(curv_init), param_dtype))
      log_of_positive(alpha_init, "model.alpha_init")
      if learn_alphas:
        self.log_alpha_img = nnx.Param(jnp.full(scalar_shape, math.log(alpha_init), param_dtype))
        self.log_alpha_txt = nnx.Param(jnp.full(scalar_shape, math.log(alpha_init), param_dtype))
      else:
        self.fixed_alpha = float(alpha_init)

  # -- learned scalars ------------------------------------------------------
  def logit_scale(self) -> jax.Array:
    return jnp.exp(self.log_logit_scale[...])

  def extra_logit_scale(self, name: str) -> jax.Array:
    """exp of `log_logit_scale_<name>` (one of `model.extra_logit_scales`)."""
    if name not in self.extra_logit_scale_names:
      raise ValueError(
        f"the model has no logit scale {name!r}; model.extra_logit_scales holds "
        f"{list(self.extra_logit_scale_names)}"
      )
    return jnp.exp(getattr(self, f"log_logit_scale_{name}")[...])

  def log_entail_weight_factor(self) -> jax.Array:
    """s of the learned entailment weight (`model.learned_entail_weight`)."""
    if not hasattr(self, "log_entail_weight"):
      raise errors.ConfigError(
        "the model has no log_entail_weight: set model.learned_entail_weight=True"
      )
    return self.log_entail_weight[...]

  def has_logit_bias(self) -> bool:
    return hasattr(self, "logit_bias")

  def learned_logit_bias(self) -> jax.Array:
    """The sigmoid loss's b (a model built with `logit_bias_init`)."""
    if not self.has_logit_bias():
      raise errors.ConfigError("this model has no logit bias: set model.logit_bias_init")
    return self.logit_bias[...]

  def curv(self) -> jax.Array:
    if self.geometry != "lorentz":
      raise ValueError("curvature is defined only for geometry='lorentz'")
    if self.learn_curv:
      return jnp.exp(self.log_curv[...])
    if self.num_factors:
      return jnp.full((self.num_factors,), self.curv_init, self.feature_dtype)
    return jnp.asarray(self.curv_init, self.feature_dtype)

  def alpha(self, which: str) -> jax.Array:
    if not self.learn_alphas:
      return jnp.asarray(self.fixed_alpha, self.feature_dtype)
    return jnp.exp(getattr(self, f"log_alpha_{which}")[...])

  # -- token dropping ----------------------------------------------------------
  def begin_token_drop(self, key: jax.Array, example_index: jax.Array, step) -> None:
    """Dropping mode for one training step (token_drop.training_mode)."""
    self.token_drop_key = nnx.data(key)
    self.token_drop_index = nnx.data(jnp.asarray(example_index))
    self.token_drop_step = nnx.data(None if step is None else jnp.asarray(step))
    self.token_drop_calls = 0

  def _token_dropped_image_tangent(self, images: jax.Array) -> jax.Array:
    call_key = jax.random.fold_in(self.token_drop_key, self.token_drop_calls)
    self.token_drop_calls += 1
    keep = token_drop.example_keep_indices(
      call_key,
      self.token_drop_index,
      images.shape[0],
      self.image_tower.num_patches,
      self.image_token_drop,
    )
    dropped = lambda: micro_batches.map_rows(self, TwoTowers._image_tangent_of_rows, images, keep)
    if self.token_drop_step is None or self.image_token_drop_until_step <= 0:
      return dropped()
    whole = lambda: micro_batches.map_rows(self, TwoTowers._image_tangent_of_rows, images)
    return jax.lax.cond(self.token_drop_step < self.image_token_drop_until_step, dropped, whole)

  # -- features ---------------------------------------------------------------
  def image_tangent(self, images: jax.Array, *, keep_indices: jax.Array | None = None) -> jax.Array:
    """Projected image features in float32 (alpha-scaled for Lorentz), (B, D).

    In a training step with `model.image_token_drop` each image loses that
    fraction of its patches (models/token_drop.py), unless `keep_indices`
    says which to keep."""
    if keep_indices is None and self.token_drop_key is not None:
      return self._token_dropped_image_tangent(images)
    rows = (images,) if keep_indices is None else (images, keep_indices)
    return micro_batches.map_rows(self, TwoTowers._image_tangent_of_rows, *rows)

  def text_tangent(self, tokens: jax.Array) -> jax.Array:
    """Projected text features in float32 (alpha-scaled for Lorentz), (B, D)."""
    return micro_batches.map_rows(self, TwoTowers._text_tangent_of_rows, tokens)

  def _image_tangent_of_rows(
    self, images: jax.Array, keep_indices: jax.Array | None = None
  ) -> jax.Array:
    feats = self.image_tower(images, keep_indices=keep_indices).astype(self.feature_dtype)
    feats = self.image_proj(feats)
    if self.geometry == "lorentz":
      feats = feats * self._per_component(self.alpha("img"))
    return feats

  def _text_tangent_of_rows(self, tokens: jax.Array) -> jax.Array:
    feats = self.text_tower(tokens).astype(self.feature_dtype)
    feats = self.text_proj(feats)
    if self.geometry == "lorentz":
      feats = feats * self._per_component(self.alpha("txt"))
    return feats

  def _per_component(self, scalars: jax.Array) -> jax.Array:
    """A per-factor (K,) vector repeated over each factor's components,
    (K d,); a scalar (one space, or fixed alphas) unchanged."""
    if jnp.ndim(scalars) == 0:
      return scalars
    return jnp.repeat(scalars, self.factor_dim)

  def lift(self, tangent: jax.Array) -> jax.Array:
    """Tangent features -> embeddings of the model's geometry (float32).

    Lorentz: space components of exp_map0. Euclidean: unchanged (objectives
    normalise as they need; keeping raw norms lets evaluators report them).
    """
    if self.geometry == "lorentz":
      if self.num_factors:
        return product.exp_map0(tangent, self.curv())
      return lorentz.exp_map0(tangent, self.curv())
    return tangent

  def encode_image(self, images: jax.Array, *, keep_indices: jax.Array | None = None) -> jax.Array:
    return self.lift(self.image_tangent(images, keep_indices=keep_indices))

  def encode_text(self, tokens: jax.Array) -> jax.Array:
    return self.lift(self.text_tangent(tokens))


def log_of_positive(value, key: str) -> float:
  """log(`value`) of a scalar the model keeps in log space, or a one-line
  ConfigError naming `key` when it is not a finite number > 0."""
  try:
    number = float(value)
  except (TypeError, ValueError):
    number = math.nan
  if not (math.isfinite(number) and number > 0):
    raise errors.ConfigError(f"{key} must be a finite number > 0, got {value!r}")
  return math.log(number)


def checked_factor_dim(factor_dim: int, embed_dim: int, geometry: str) -> int:
  """`model.factor_dim`, or a one-line ConfigError when it cannot split the embedding."""
  factor_dim = int(factor_dim or 0)
  if not factor_dim:
    return 0
  if geometry != "lorentz":
    raise errors.ConfigError(
      f"model.factor_dim={factor_dim} makes a product of Lorentz spaces; "
      f"model.geometry={geometry!r} has none (set factor_dim=0)"
    )
  if factor_dim < 1 or embed_dim % factor_dim:
    raise errors.ConfigError(
      f"model.factor_dim={factor_dim} must divide model.embed_dim={embed_dim} "
      "(K = embed_dim / factor_dim factors)"
    )
  return factor_dim


class TwoTowersWithRoot(TwoTowers):
  """TwoTowers plus a free root vector `radial_root` (Radial Embeddings'
  root='learned': the hierarchy root is learned with the text tower)."""

  def __init__(self, *, embed_dim: int, rngs: nnx.Rngs, **kwargs):
    super().__init__(embed_dim=embed_dim, rngs=rngs, **kwargs)
    self.radial_root = nnx.Param(jnp.zeros((embed_dim,), self.feature_dtype))


def build_two_towers(
  model_config: Mapping[str, Any],
  *,
  vocab_size: int,
  context_length: int,
  image_size: int,
  rngs: nnx.Rngs,
  learned_root: bool = False,
) -> TwoTowers:
  cfg = dict(model_config)
  cls = TwoTowersWithRoot if learned_root else TwoTowers
  return cls(
    image_variant=cfg["image_variant"],
    image_size=image_size,
    text_variant=cfg["text_variant"],
    vocab_size=vocab_size,
    context_length=context_length,
    embed_dim=cfg["embed_dim"],
    geometry=cfg.get("geometry", "lorentz"),
    curv_init=cfg.get("curv_init", 1.0),
    learn_curv=cfg.get("learn_curv", True),
    curv_clamp_factor=cfg.get("curv_clamp_factor", 10.0),
    logit_scale_init=cfg.get("logit_scale_init", 1 / 0.07),
    max_logit_scale=cfg.get("max_logit_scale", 100.0),
    min_logit_scale=cfg.get("min_logit_scale", None),
    logit_bias_init=cfg.get("logit_bias_init", None),
    alpha_init=cfg.get("alpha_init", None),
    learn_alphas=cfg.get("learn_alphas", True),
    dtype=cfg.get("dtype", "float32"),
    factor_dim=cfg.get("factor_dim", 0),
    extra_logit_scales=dict(cfg.get("extra_logit_scales") or {}),
    learned_entail_weight=bool(cfg.get("learned_entail_weight", False)),
    # NEFTune's alpha on the text tower's embeddings (models/text.py); a key
    # of HAC's configs only, so every other run's saved config is unchanged.
    text_embedding_noise=float(cfg.get("text_embedding_noise", 0.0)),
    **tower_options(cfg),
    lora=lora_lib.LoraSettings.from_model_config(cfg),
    rngs=rngs,
  )


def project_learned_scalars(params: dict, model: TwoTowers) -> dict:
  """Clamps the log-space scalars of a pure param dict (MERU's clamps).

  Applied after the optimizer update, outside the differentiated function.
  Works on any nesting: the scalars are found by name at any depth, so an
  objective that wraps TwoTowers (a student beside a teacher) is covered.
  """
  bounds = {
    "log_logit_scale": (getattr(model, "min_log_logit_scale", None), model.max_log_logit_scale),
    "log_alpha_img": (None, 0.0),
    "log_alpha_txt": (None, 0.0),
  }
  for name in getattr(model, "extra_logit_scale_names", ()):
    bounds[f"log_logit_scale_{name}"] = (None, model.max_log_logit_scale)
  if hasattr(model, "log_entail_weight"):
    bounds["log_entail_weight"] = (-math.log(100.0), math.log(100.0))  # entailment_weight.py
  if model.geometry == "lorentz":
    factor = model.curv_clamp_factor
    bounds["log_curv"] = (math.log(model.curv_init / factor), math.log(model.curv_init * factor))

  def visit(tree):
    out = {}
    for key, value in tree.items():
      if isinstance(value, dict):
        out[key] = visit(value)
      elif key in bounds:
        lo, hi = bounds[key]
        out[key] = jnp.clip(value, lo, hi)
      else:
        out[key] = value
    return out

  return visit(params)
