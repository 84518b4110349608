"""Image/text two-tower model shared by every objective.

The towers may compute in bfloat16; everything from the projections onward
(projection, alpha scaling, exponential map) runs in float32, because bf16
spacing near 1 (2^-7) is far coarser than the hyperboloid's curvature terms.

Learned scalars live in log space under short stable names so regex masks for
weight decay, freezing and sharding can target them:
  log_logit_scale   log(1/tau), init log(1/0.07), projected to <= log(100)
  log_curv          log(c), init log(1.0), projected to [log(c0/10), log(10 c0)]
  log_alpha_img/txt log(alpha), init log(1/sqrt(embed_dim)), projected to <= 0
The projections are applied to the parameters after each optimizer update
(`project_learned_scalars`), outside the differentiated function, so
gradients flow as if unclamped (MERU's in-place clamp semantics).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from hyperbolic_vl import errors
from hyperbolic_vl.geometry import lorentz
from hyperbolic_vl.models import lora as lora_lib
from hyperbolic_vl.models import micro_batches, resnet, transformer
from hyperbolic_vl.models.resnet import ResNet
from hyperbolic_vl.models.text import TextTransformer
from hyperbolic_vl.models.vit import VisionTransformer

GEOMETRIES = ("euclidean", "lorentz")
LEARNED_SCALAR_NAMES = ("log_logit_scale", "log_curv", "log_alpha_img", "log_alpha_txt")

# float64 exists for exact identities in tests (1 vs N devices, chunked vs
# plain): towers, projections, scalars and geometry all run in float64, so
# reduction order cannot move a result by more than ~1e-15.
_DTYPES = {
  "float32": jnp.float32,
  "bfloat16": jnp.bfloat16,
  "float16": jnp.float16,
  "float64": jnp.float64,
}


# Architecture options of the towers, with MERU's layout as the defaults;
# `configs/clip.py:openai_*` set OpenAI CLIP's. Keys of `config.model`.
TOWER_OPTION_DEFAULTS = dict(
  image_position_embedding="sincos2d",  # or "learned" (OpenAI CLIP)
  image_ln_pre=False,  # OpenAI CLIP: True
  image_patch_bias=True,  # OpenAI CLIP: False
  image_num_heads=None,  # None: the size's count; MERU's ViT-S checkpoints: 12
  pixel_stats="imagenet",  # or "openai"
  activation="gelu",  # or "quick_gelu" (OpenAI CLIP), "gelu_tanh"; both towers
  text_init="clip",  # or "normal" (std 0.02)
  # Both towers' jax.nn.dot_product_attention: None takes cuDNN's fused
  # (flash) kernel on GPUs where dtype and head width allow, logging why
  # not otherwise, and XLA's elsewhere; "cudnn" insists on cuDNN, "xla"
  # the XLA path.
  attention_implementation=None,
  # What each tower's encoder blocks keep for the backward pass
  # (transformer.REMAT_POLICIES): "none", "dots_saveable" or "full" trade
  # recomputation for activation memory; the function is the same.
  image_remat="none",
  text_remat="none",
)


def tower_options(model_config: Mapping[str, Any]) -> dict[str, Any]:
  """The TOWER_OPTION_DEFAULTS keys of a model config, defaults filled in."""
  return {key: model_config.get(key, default) for key, default in TOWER_OPTION_DEFAULTS.items()}


def checked_remat(key: str, value: str) -> str:
  """`model.<key>`'s remat policy, or a one-line ConfigError naming the valid ones."""
  if value not in transformer.REMAT_POLICIES:
    raise errors.ConfigError(f"model.{key}={value!r}; valid: {list(transformer.REMAT_POLICIES)}")
  return value


def compute_dtype(name: str):
  if name not in _DTYPES:
    raise errors.ConfigError(f"model.dtype={name!r}; valid: {sorted(_DTYPES)}")
  if name == "float64" and not jax.config.jax_enable_x64:
    raise ValueError("model.dtype='float64' needs jax_enable_x64 (jax.enable_x64(True))")
  return _DTYPES[name]


def feature_dtype(tower_dtype) -> jnp.dtype:
  """Dtype of everything from the tower outputs on: float32, or float64 in a
  float64 model (bf16/fp16 towers still hand float32 to the geometry)."""
  return jnp.promote_types(tower_dtype, jnp.float32)


# The image-tower options that only a ViT has; a ResNet tower refuses other values.
VIT_ONLY_OPTIONS = dict(
  position_embedding=("image_position_embedding", "sincos2d"),
  ln_pre=("image_ln_pre", False),
  patch_bias=("image_patch_bias", True),
  num_heads=("image_num_heads", None),
  remat=("image_remat", "none"),
)


def image_tower(
  variant: str,
  image_size: int,
  *,
  dtype,
  param_dtype,
  pixel_stats: str = "imagenet",
  attention_implementation: str | None = None,
  activation: str = "gelu",
  lora: lora_lib.LoraSettings = lora_lib.NO_LORA,
  rngs: nnx.Rngs,
  **vit_options,
) -> VisionTransformer | ResNet:
  """The image tower `model.image_variant` names: a ResNet for the names of
  `resnet.RESNET_SIZES` ("RN50", "RN-mu"), else a ViT ("S/16", "mu/8"); an
  unknown "RN..." name fails listing the ResNet variants."""
  if "remat" in vit_options:
    checked_remat("image_remat", vit_options["remat"])
  if not (resnet.is_resnet_variant(variant) or variant.startswith("RN")):
    return VisionTransformer(
      variant,
      image_size,
      dtype=dtype,
      param_dtype=param_dtype,
      pixel_stats=pixel_stats,
      attention_implementation=attention_implementation,
      activation=activation,
      lora=lora,
      rngs=rngs,
      **vit_options,
    )
  if lora.enabled:
    raise errors.ConfigError(
      f"model.lora adapts ViT towers; image_variant={variant!r} is a ResNet "
      "(set model.lora.towers=('text',) to adapt the text tower only)"
    )
  for option, value in vit_options.items():
    key, default = VIT_ONLY_OPTIONS[option]
    if value != default:
      raise errors.ConfigError(
        f"model.{key}={value!r} applies to ViT image towers only; "
        f"image_variant={variant!r} is a ResNet"
      )
  return ResNet(
    variant, image_size, dtype=dtype, param_dtype=param_dtype, pixel_stats=pixel_stats, rngs=rngs
  )


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
    rngs: nnx.Rngs,
  ):
    if geometry not in GEOMETRIES:
      raise ValueError(f"model.geometry={geometry!r}; valid: {GEOMETRIES}")
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
      rngs=rngs,
    )
    # CLIP initialises projections with std width**-0.5.
    self.image_proj = nnx.Linear(
      self.image_tower.width,
      embed_dim,
      use_bias=False,
      kernel_init=nnx.initializers.normal(self.image_tower.width**-0.5),
      dtype=self.feature_dtype,
      param_dtype=param_dtype,
      rngs=rngs,
    )
    self.text_proj = nnx.Linear(
      self.text_tower.width,
      embed_dim,
      use_bias=False,
      kernel_init=nnx.initializers.normal(self.text_tower.width**-0.5),
      dtype=self.feature_dtype,
      param_dtype=param_dtype,
      rngs=rngs,
    )
    self.log_logit_scale = nnx.Param(jnp.asarray(math.log(logit_scale_init), param_dtype))
    self.max_log_logit_scale = math.log(max_logit_scale)
    self.curv_init = float(curv_init)
    self.learn_curv = bool(learn_curv)
    # A learned c stays in [c0 / f, f c0]: MERU uses f = 10, ATMG's release 5.
    self.curv_clamp_factor = float(curv_clamp_factor)
    self.learn_alphas = bool(learn_alphas)
    if geometry == "lorentz":
      if alpha_init is None:
        alpha_init = embed_dim**-0.5
      if learn_curv:
        self.log_curv = nnx.Param(jnp.asarray(math.log(curv_init), param_dtype))
      if learn_alphas:
        self.log_alpha_img = nnx.Param(jnp.asarray(math.log(alpha_init), param_dtype))
        self.log_alpha_txt = nnx.Param(jnp.asarray(math.log(alpha_init), param_dtype))
      else:
        self.fixed_alpha = float(alpha_init)

  # -- learned scalars ------------------------------------------------------
  def logit_scale(self) -> jax.Array:
    return jnp.exp(self.log_logit_scale[...])

  def curv(self) -> jax.Array:
    if self.geometry != "lorentz":
      raise ValueError("curvature is defined only for geometry='lorentz'")
    if self.learn_curv:
      return jnp.exp(self.log_curv[...])
    return jnp.asarray(self.curv_init, self.feature_dtype)

  def alpha(self, which: str) -> jax.Array:
    if not self.learn_alphas:
      return jnp.asarray(self.fixed_alpha, self.feature_dtype)
    return jnp.exp(getattr(self, f"log_alpha_{which}")[...])

  # -- features ---------------------------------------------------------------
  def image_tangent(self, images: jax.Array, *, keep_indices: jax.Array | None = None) -> jax.Array:
    """Projected image features in float32 (alpha-scaled for Lorentz), (B, D)."""
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
      feats = feats * self.alpha("img")
    return feats

  def _text_tangent_of_rows(self, tokens: jax.Array) -> jax.Array:
    feats = self.text_tower(tokens).astype(self.feature_dtype)
    feats = self.text_proj(feats)
    if self.geometry == "lorentz":
      feats = feats * self.alpha("txt")
    return feats

  def lift(self, tangent: jax.Array) -> jax.Array:
    """Tangent features -> embeddings of the model's geometry (float32).

    Lorentz: space components of exp_map0. Euclidean: unchanged (objectives
    normalise as they need; keeping raw norms lets evaluators report them).
    """
    if self.geometry == "lorentz":
      return lorentz.exp_map0(tangent, self.curv())
    return tangent

  def encode_image(self, images: jax.Array, *, keep_indices: jax.Array | None = None) -> jax.Array:
    return self.lift(self.image_tangent(images, keep_indices=keep_indices))

  def encode_text(self, tokens: jax.Array) -> jax.Array:
    return self.lift(self.text_tangent(tokens))


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
    alpha_init=cfg.get("alpha_init", None),
    learn_alphas=cfg.get("learn_alphas", True),
    dtype=cfg.get("dtype", "float32"),
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
    "log_logit_scale": (None, model.max_log_logit_scale),
    "log_alpha_img": (None, 0.0),
    "log_alpha_txt": (None, 0.0),
  }
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
