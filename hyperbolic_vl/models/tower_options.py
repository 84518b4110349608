"""What the two-tower models are built from: the towers' compute dtypes, the
tower layout options a model config may set (and their MERU defaults), the
image tower factory (ViT or ResNet) and the embedding projections."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from hyperbolic_vl import errors
from hyperbolic_vl.models import lora as lora_lib
from hyperbolic_vl.models import resnet, transformer
from hyperbolic_vl.models.resnet import ResNet
from hyperbolic_vl.models.vit import VisionTransformer

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
  # FLIP's token dropping while training (models/token_drop.py): the
  # fraction of each image's patches dropped, and the step from which whole
  # images are seen again (0: drop throughout).
  image_token_drop=0.0,
  image_token_drop_until_step=0,
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


def projection(width: int, embed_dim: int, dtype, rngs: nnx.Rngs) -> nnx.Linear:
  """A bias-free tower-to-embedding projection, initialised as CLIP's (std
  width**-0.5); its params are stored in `dtype` (the features' dtype)."""
  return nnx.Linear(
    width,
    embed_dim,
    use_bias=False,
    kernel_init=nnx.initializers.normal(width**-0.5),
    dtype=dtype,
    param_dtype=dtype,
    rngs=rngs,
  )
