"""Vision Transformer image tower (MERU's timm ViT with frozen 2D sin-cos).

Sizes follow big_vision's ``decode_variant``: ``"B/16"`` is the B width/depth
with 16 px patches. ``"mu"`` is a tiny size for CPU tests.

Token dropping (FLIP, HMID-Net) gathers the kept patches and their
position embeddings *before* the patch embedding, so the patch embedding and
the encoder really run on fewer tokens and kept patches keep their positions.

The patch embedding is a conv's parameters (`patch_embed`, kernel = stride =
patch, as timm and open_clip store it) applied as one matrix product on the
flattened patches (`embed_patches`): the same function, which lets dropped
patches skip the embedding and avoids XLA:CPU's strided-conv backward
(benchmarks/image_tower_ab.py times the two).
"""

from __future__ import annotations

import functools
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from hyperbolic_vl.models import lora as lora_lib
from hyperbolic_vl.models import transformer

Dtype = Any

VIT_SIZES = {
  "mu": dict(width=64, depth=2, heads=2, mlp_dim=128),
  "Ti": dict(width=192, depth=12, heads=3, mlp_dim=768),
  "S": dict(width=384, depth=12, heads=6, mlp_dim=1536),
  "B": dict(width=768, depth=12, heads=12, mlp_dim=3072),
  "L": dict(width=1024, depth=24, heads=16, mlp_dim=4096),
}

# torchvision/timm ImageNet statistics, used by MERU on [0, 1] pixels.
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
# OpenAI CLIP's statistics (its training set), used by open_clip's OpenAI models.
OPENAI_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_STD = (0.26862954, 0.26130258, 0.27577711)
PIXEL_STATS = {"imagenet": (IMAGENET_MEAN, IMAGENET_STD), "openai": (OPENAI_MEAN, OPENAI_STD)}
POSITION_EMBEDDINGS = ("sincos2d", "learned")


def decode_variant(variant: str) -> dict[str, int]:
  """``"B/16"`` -> dict(width, depth, heads, mlp_dim, patch_size)."""
  size, slash, patch = variant.partition("/")
  if size not in VIT_SIZES:
    raise ValueError(f"Unknown ViT size {size!r} in {variant!r}; valid sizes: {sorted(VIT_SIZES)}")
  if not slash or not patch.isdigit() or int(patch) < 1:
    raise ValueError(f"ViT variant {variant!r} must look like 'SIZE/PATCH', e.g. 'B/16'")
  return dict(VIT_SIZES[size], patch_size=int(patch))


@functools.cache
def sincos_2d_position_embedding(width: int, grid_size: int) -> np.ndarray:
  """Fixed 2D sin-cos position embedding, CLS row first.

  Reproduces MERU's ``build_timm_vit`` (adapted from MoCo-v3) exactly, so that
  converted MERU checkpoints see the positions they were trained with. Patch
  tokens are numbered row-major, ``t = row * grid_size + col`` (timm's
  ``flatten(2)`` of the conv output). Channels are

    [sin(a * w), cos(a * w), sin(b * w), cos(b * w)],  w_i = 1 / 10000^(i/(D/4))

  with ``a, b`` the two outputs of ``torch.meshgrid(grid_w, grid_h)``. That
  call uses "ij" indexing, so ``a = row`` and ``b = col``: despite the names
  in MERU's code, the first half of the channels encodes the row. (MAE's
  numpy ``np.meshgrid`` version uses "xy" indexing and puts the column first;
  the two tables are transposes of each other on a square grid.)

  Args:
    width: embedding width D, divisible by 4.
    grid_size: patches per side (square images).

  Returns:
    float32 (1 + grid_size**2, width); row 0 (CLS) is zero.
  """
  if width % 4:
    raise ValueError(f"2D sin-cos embedding needs width % 4 == 0, got {width}")
  grid_a, grid_b = np.meshgrid(
    np.arange(grid_size, dtype=np.float64),
    np.arange(grid_size, dtype=np.float64),
    indexing="ij",  # torch.meshgrid's default, as in MERU
  )
  quarter = width // 4
  omega = 1.0 / 10000.0 ** (np.arange(quarter, dtype=np.float64) / quarter)
  angles_a = np.einsum("m,d->md", grid_a.reshape(-1), omega)
  angles_b = np.einsum("m,d->md", grid_b.reshape(-1), omega)
  patches = np.concatenate(
    [np.sin(angles_a), np.cos(angles_a), np.sin(angles_b), np.cos(angles_b)], axis=1
  )
  cls = np.zeros((1, width))
  table = np.concatenate([cls, patches], axis=0).astype(np.float32)
  table.setflags(write=False)  # shared through the cache
  return table


def normalized_pixels(images: jax.Array, mean, std, dtype: Dtype) -> jax.Array:
  """uint8 or [0, 1] float (B, H, W, 3) -> (x - mean) / std in `dtype`,
  computed in at least float32 (every image tower starts here)."""
  if images.dtype == jnp.uint8:
    # The input pipelines send uint8 (a quarter of float32's bytes from host
    # to device); [0, 1] scaling happens here, on the device, exactly as
    # the host did it before (x * float32(1 / 255)).
    images = images.astype(jnp.float32) * jnp.float32(1.0 / 255.0)
  pixel_dtype = jnp.promote_types(dtype, jnp.float32)
  mean = jnp.asarray(mean, pixel_dtype)
  std = jnp.asarray(std, pixel_dtype)
  return ((images.astype(pixel_dtype) - mean) / std).astype(dtype)


def random_keep_indices(
  key: jax.Array, batch_size: int, num_patches: int, mask_ratio: float
) -> jax.Array:
  """Indices of patches to keep, an independent random subset per example.

  Args:
    key: PRNG key.
    batch_size: B.
    num_patches: N, patches per image.
    mask_ratio: fraction of patches to drop, in [0, 1).

  Returns:
    int32 (B, K), K = round(N * (1 - mask_ratio)), sorted ascending per row.
  """
  if not 0.0 <= mask_ratio < 1.0:
    raise ValueError(f"mask_ratio must be in [0, 1), got {mask_ratio}")
  num_keep = int(round(num_patches * (1.0 - mask_ratio)))
  noise = jax.random.uniform(key, (batch_size, num_patches))
  # The first K of a random permutation is a uniform K-subset (MAE/FLIP);
  # sorting keeps the tokens in raster order, which is cheaper to reason about.
  keep = jnp.argsort(noise, axis=1)[:, :num_keep]
  return jnp.sort(keep, axis=1).astype(jnp.int32)


class VisionTransformer(nnx.Module):
  """ViT with a CLS token; returns the final-LayerNorm CLS feature.

  Parameters: ``patch_embed`` (conv, kernel = stride = patch, with bias),
  ``cls_token`` (1, 1, D), ``encoder`` (pre-LN blocks), ``norm`` (final LN).
  The position embedding is a numpy constant, not a parameter: it is absent
  from ``nnx.state(model)`` and therefore never trained or checkpointed.
  """

  def __init__(
    self,
    variant: str,
    image_size: int,
    *,
    dtype: Dtype = jnp.float32,
    param_dtype: Dtype = jnp.float32,
    attention_implementation: Literal["xla", "cudnn"] | None = None,
    position_embedding: str = "sincos2d",
    ln_pre: bool = False,
    patch_bias: bool = True,
    pixel_stats: str = "imagenet",
    activation: str = "gelu",
    num_heads: int | None = None,
    lora: lora_lib.LoraSettings = lora_lib.NO_LORA,
    remat: str = "none",
    rngs: nnx.Rngs,
  ):
    """Builds the tower; the keyword options default to MERU's layout.

    Args:
      position_embedding: "sincos2d" (frozen, MERU) or "learned" (OpenAI CLIP,
        a (1 + N, D) parameter that also covers the CLS token).
      ln_pre: LayerNorm on the token sequence before the encoder (OpenAI CLIP).
      patch_bias: bias on the patch embedding (MERU/timm yes, OpenAI CLIP no).
      pixel_stats: "imagenet" or "openai" per-channel mean/std.
      activation: MLP activation, "gelu" or "quick_gelu" (OpenAI CLIP).
      num_heads: overrides the size's head count (MERU's MoCo-v3 ViT-S has 12
        heads of width 32; the standard ViT-S, our "S" default, has 6).
      lora: LoRA adapters of this tower (models/lora.py), none by default.
      remat: what each encoder block keeps for the backward pass
        (`transformer.REMAT_POLICIES`).
    """
    if position_embedding not in POSITION_EMBEDDINGS:
      raise ValueError(f"position_embedding={position_embedding!r}; valid: {POSITION_EMBEDDINGS}")
    if pixel_stats not in PIXEL_STATS:
      raise ValueError(f"pixel_stats={pixel_stats!r}; valid: {sorted(PIXEL_STATS)}")
    self.position_embedding_kind = position_embedding
    self.pixel_mean, self.pixel_std = PIXEL_STATS[pixel_stats]
    config = decode_variant(variant)
    if num_heads is not None:
      config["heads"] = int(num_heads)
    self.variant = variant
    self.width = config["width"]
    self.patch_size = config["patch_size"]
    if image_size % self.patch_size:
      raise ValueError(
        f"image_size {image_size} is not a multiple of the patch size {self.patch_size}"
      )
    self.image_size = image_size
    self.grid_size = image_size // self.patch_size
    self.num_patches = self.grid_size**2
    self.dtype = dtype

    self.patch_embed = nnx.Conv(
      3,
      self.width,
      kernel_size=(self.patch_size, self.patch_size),
      strides=(self.patch_size, self.patch_size),
      padding="VALID",
      use_bias=patch_bias,
      dtype=dtype,
      param_dtype=param_dtype,
      # Xavier on the flattened (p*p*3, D) kernel, as MAE / MoCo-v3.
      kernel_init=nnx.initializers.variance_scaling(
        1.0, "fan_avg", "uniform", in_axis=(0, 1, 2), out_axis=3
      ),
      bias_init=transformer.default_bias_init,
      rngs=rngs,
    )
    self.cls_token = nnx.Param(
      nnx.initializers.normal(stddev=0.02)(rngs.params(), (1, 1, self.width), param_dtype)
    )
    self.encoder = transformer.Encoder(
      self.width,
      config["depth"],
      config["heads"],
      config["mlp_dim"],
      causal=False,
      attention_implementation=attention_implementation,
      activation=activation,
      lora=lora,
      remat=remat,
      dtype=dtype,
      param_dtype=param_dtype,
      rngs=rngs,
    )
    self.lora_patch = lora_lib.adapter(
      lora,
      "patch",
      self.patch_size * self.patch_size * 3,
      self.width,
      dtype=dtype,
      param_dtype=param_dtype,
      rngs=rngs,
    )
    if position_embedding == "learned":
      # OpenAI CLIP's init: std width**-0.5.
      self.learned_position = nnx.Param(
        nnx.initializers.normal(stddev=self.width**-0.5)(
          rngs.params(), (1 + self.num_patches, self.width), param_dtype
        )
      )
    if ln_pre:
      self.ln_pre = transformer.layer_norm(
        self.width, dtype=dtype, param_dtype=param_dtype, rngs=rngs
      )
    else:
      self.ln_pre = None
    # float32 computation so the tower hands float32 features to the
    # projection even under bf16 (geometry downstream must be float32).
    self.norm = transformer.layer_norm(
      self.width, dtype=jnp.promote_types(dtype, jnp.float32), param_dtype=param_dtype, rngs=rngs
    )

  def embed_patches(self, patch_pixels: jax.Array) -> jax.Array:
    """(B, K, p*p*3) flattened patches -> (B, K, width) tokens.

    The conv `patch_embed` (kernel = stride = patch) written as one matrix
    product: its (p, p, 3, D) kernel reshaped to (p*p*3, D) against the
    patches flattened in the same (row, column, channel) order. Same params
    (converters and exports see the conv's), same function (float64-equal,
    tests/models/test_towers.py).
    """
    kernel = self.patch_embed.kernel[...]
    kernel = kernel.reshape(-1, kernel.shape[-1]).astype(self.dtype)
    if self.patch_embed.bias is None:
      return jnp.matmul(patch_pixels.astype(self.dtype), kernel)
    # `affine`: on a CPU its weight gradient reads the token gradient (the
    # end of the whole tower's backward chain) without a transposed copy.
    bias = self.patch_embed.bias[...].astype(self.dtype)
    return transformer.affine(patch_pixels.astype(self.dtype), kernel, bias)

  def position_embedding(self) -> np.ndarray | jax.Array:
    """(1 + num_patches, width); row 0 belongs to CLS."""
    if self.position_embedding_kind == "learned":
      return self.learned_position[...]
    return sincos_2d_position_embedding(self.width, self.grid_size)

  def __call__(self, images: jax.Array, *, keep_indices: jax.Array | None = None) -> jax.Array:
    """Encodes images.

    Args:
      images: uint8 (B, H, W, 3), or float in [0, 1]; H = W = image_size.
      keep_indices: optional int (B, K) indices in [0, num_patches) of the
        patch tokens to keep (row-major patch order); None keeps all.

    Returns:
      float32 (B, width): the final-LayerNorm CLS token.
    """
    tokens = self.encoder_input(images, keep_indices=keep_indices)
    cls_position = jnp.zeros((images.shape[0],), jnp.int32)
    return self.norm(self.encoder(tokens, output_position=cls_position))

  def encoder_input(self, images: jax.Array, *, keep_indices: jax.Array | None = None) -> jax.Array:
    """(B, 1 + K, width): CLS and the (kept) patch tokens, with their
    positions, that the encoder reads (arguments as for ``__call__``)."""
    batch, height, width_px, channels = images.shape
    if (height, width_px, channels) != (self.image_size, self.image_size, 3):
      raise ValueError(
        f"expected images (B, {self.image_size}, {self.image_size}, 3), got {images.shape}"
      )
    pixels = normalized_pixels(images, self.pixel_mean, self.pixel_std, self.dtype)

    position = self.position_embedding()
    patch_pixels = lora_lib.patches(pixels, self.patch_size)  # (B, N, p*p*3)
    patch_position = jnp.asarray(position[1:], self.dtype)  # (N, D)
    if keep_indices is not None:
      if keep_indices.ndim != 2 or keep_indices.shape[0] != batch:
        raise ValueError(f"keep_indices must be (B={batch}, K), got {keep_indices.shape}")
      # Dropped patches are never embedded: the patch embedding, like the
      # encoder, runs on the kept ones only.
      keep = keep_indices.astype(jnp.int32)
      patch_pixels = jnp.take_along_axis(patch_pixels, keep[:, :, None], axis=1)
      patch_position = jnp.take(patch_position, keep, axis=0)
    tokens = self.embed_patches(patch_pixels)
    if self.lora_patch is not None:
      tokens = tokens + self.lora_patch(patch_pixels)
    tokens = tokens + patch_position

    # The sin-cos CLS row is zero; a learned one is not.
    cls = self.cls_token[...][0] + jnp.asarray(position[:1], self.cls_token[...].dtype)
    cls = jnp.broadcast_to(cls.astype(self.dtype), (batch, 1, self.width))
    tokens = jnp.concatenate([cls, tokens], axis=1)
    if self.ln_pre is not None:
      tokens = self.ln_pre(tokens)
    return tokens
