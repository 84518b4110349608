"""ResNet image tower in torchvision's layout (the backbone of MoCo-v2/HCL).

`"RN50"` is torchvision's `resnet50` without its classifier: a 7x7 stride-2
stem conv, batch norm, ReLU and 3x3 stride-2 max pool, then four stages of
bottleneck blocks ([3, 4, 6, 3] blocks of widths 64, 128, 256, 512, output
4x wider), global average pooling, and the 2048-d pooled feature. The
stride of a stage's first block sits on its 3x3 conv ("ResNet v1.5", as
torchvision and timm), and the shortcut is a 1x1 conv + batch norm wherever
the shape changes. `"RN101"` and `"RN152"` are the deeper torchvision
layouts; `"RN-mu"` (one block per stage, widths 8 to 64, a 256-d feature)
runs the same code at a size for CPU tests and tiny runs.

This is not OpenAI CLIP's "RN50" (`ModifiedResNet`: a three-conv stem,
average-pool downsampling and an attention-pooling head); the name follows
the usual short form of torchvision's model.

Parameter names follow torchvision's (`conv1`, `bn1`, `layer1`...`layer4`,
blocks `0`..., `downsample_conv`/`downsample_norm` for its
`downsample.0`/`downsample.1`), so `interop/torchvision_resnet.py` is a
renaming. Batch norms are `batch_norm.BatchNorm`: evaluation mode unless the
trainer switches them, running statistics as `nnx.BatchStat`.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from hyperbolic_vl.models import batch_norm, vit

Dtype = Any

# blocks per stage and the first stage's width (stage s: width * 2**s,
# output 4 * width * 2**s channels).
RESNET_SIZES = {
  "RN-mu": dict(blocks=(1, 1, 1, 1), width=8),
  "RN50": dict(blocks=(3, 4, 6, 3), width=64),
  "RN101": dict(blocks=(3, 4, 23, 3), width=64),
  "RN152": dict(blocks=(3, 8, 36, 3), width=64),
}
EXPANSION = 4  # a bottleneck's output / inner width


def is_resnet_variant(variant: str) -> bool:
  """True for the names of RESNET_SIZES (what `model.image_variant` picks)."""
  return variant in RESNET_SIZES


def _conv(in_features, out_features, kernel, stride, *, dtype, param_dtype, rngs):
  pad = kernel // 2
  return nnx.Conv(
    in_features,
    out_features,
    kernel_size=(kernel, kernel),
    strides=(stride, stride),
    padding=((pad, pad), (pad, pad)),
    use_bias=False,
    dtype=dtype,
    param_dtype=param_dtype,
    # torchvision's kaiming_normal_(mode="fan_out", nonlinearity="relu").
    kernel_init=nnx.initializers.variance_scaling(2.0, "fan_out", "normal"),
    rngs=rngs,
  )


class Bottleneck(nnx.Module):
  """1x1 reduce, 3x3 (with the stride), 1x1 expand; batch norm after each;
  the shortcut is projected when the stride or the width changes."""

  def __init__(self, in_features, width, stride, *, dtype, param_dtype, rngs):
    layer = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
    out_features = width * EXPANSION
    self.conv1 = _conv(in_features, width, 1, 1, **layer)
    self.bn1 = batch_norm.BatchNorm(width, **layer)
    self.conv2 = _conv(width, width, 3, stride, **layer)
    self.bn2 = batch_norm.BatchNorm(width, **layer)
    self.conv3 = _conv(width, out_features, 1, 1, **layer)
    self.bn3 = batch_norm.BatchNorm(out_features, **layer)
    if stride != 1 or in_features != out_features:
      self.downsample_conv = _conv(in_features, out_features, 1, stride, **layer)
      self.downsample_norm = batch_norm.BatchNorm(out_features, **layer)
    else:
      self.downsample_conv = self.downsample_norm = None

  def __call__(self, x: jax.Array) -> jax.Array:
    y = jax.nn.relu(self.bn1(self.conv1(x)))
    y = jax.nn.relu(self.bn2(self.conv2(y)))
    y = self.bn3(self.conv3(y))
    shortcut = x if self.downsample_conv is None else self.downsample_norm(self.downsample_conv(x))
    return jax.nn.relu(y + shortcut)


class ResNet(nnx.Module):
  """torchvision's ResNet without `fc`: images -> pooled (B, width) features."""

  def __init__(
    self,
    variant: str,
    image_size: int,
    *,
    dtype: Dtype = jnp.float32,
    param_dtype: Dtype = jnp.float32,
    pixel_stats: str = "imagenet",
    rngs: nnx.Rngs,
  ):
    if variant not in RESNET_SIZES:
      raise ValueError(f"Unknown ResNet variant {variant!r}; valid: {sorted(RESNET_SIZES)}")
    if pixel_stats not in vit.PIXEL_STATS:
      raise ValueError(f"pixel_stats={pixel_stats!r}; valid: {sorted(vit.PIXEL_STATS)}")
    size = RESNET_SIZES[variant]
    self.variant = variant
    self.image_size = int(image_size)
    self.dtype = dtype
    self.pixel_mean, self.pixel_std = vit.PIXEL_STATS[pixel_stats]
    layer = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
    stem = size["width"]
    self.conv1 = _conv(3, stem, 7, 2, **layer)
    self.bn1 = batch_norm.BatchNorm(stem, **layer)
    in_features = stem
    for stage, num_blocks in enumerate(size["blocks"]):
      width = size["width"] * 2**stage
      blocks = []
      for index in range(num_blocks):
        stride = 2 if stage > 0 and index == 0 else 1
        blocks.append(Bottleneck(in_features, width, stride, **layer))
        in_features = width * EXPANSION
      setattr(self, f"layer{stage + 1}", nnx.List(blocks))
    self.num_stages = len(size["blocks"])
    self.width = in_features  # the pooled feature's size (2048 for RN50)

  def __call__(self, images: jax.Array, *, keep_indices: jax.Array | None = None) -> jax.Array:
    """Encodes images.

    Args:
      images: uint8 (B, H, W, 3), or float in [0, 1]; H = W = image_size.
      keep_indices: patch dropping is a ViT feature; must be None.

    Returns:
      float32 (float64 in a float64 model) (B, width): the global average
      of the last stage's activations.
    """
    if keep_indices is not None:
      raise ValueError(
        f"image_variant={self.variant!r} is a ResNet: patch dropping (keep_indices, "
        "mask ratios) needs a ViT image tower"
      )
    if images.shape[1:] != (self.image_size, self.image_size, 3):
      raise ValueError(
        f"expected images (B, {self.image_size}, {self.image_size}, 3), got {images.shape}"
      )
    x = vit.normalized_pixels(images, self.pixel_mean, self.pixel_std, self.dtype)
    x = jax.nn.relu(self.bn1(self.conv1(x)))
    # torchvision's MaxPool2d(3, 2, padding=1): padding never wins a max.
    x = nnx.max_pool(x, (3, 3), strides=(2, 2), padding=((1, 1), (1, 1)))
    for stage in range(1, self.num_stages + 1):
      for block in getattr(self, f"layer{stage}"):
        x = block(x)
    return jnp.mean(x.astype(jnp.promote_types(self.dtype, jnp.float32)), axis=(1, 2))
