"""HCL's image model: an image tower and MoCo-v2's projection head (no text
tower). The paper's and the released code's backbone is torchvision's
ResNet-50 (`model.image_variant="RN50"`); a ViT ("S/16") works the same way."""

from __future__ import annotations

import jax
from flax import nnx

from hyperbolic_vl.models import micro_batches, tower_options


class HclModel(micro_batches.MicroBatched, nnx.Module):
  """Image tower (ViT or ResNet) + MoCo-v2 projection head (Linear-ReLU-Linear).
  Its output runs in micro-batches when the trainer sets them
  (`optim.accumulation_steps`, ViT towers: a ResNet has batch norms)."""

  geometry = "poincare"
  has_text_tower = False  # an image model: evaluators that need texts skip it

  def __init__(
    self,
    *,
    image_variant: str,
    image_size: int,
    embed_dim: int,
    head_dim: int,
    dtype: str = "float32",
    image_remat: str = "none",
    rngs: nnx.Rngs,
  ):
    tower_dtype = tower_options.compute_dtype(dtype)
    self.feature_dtype = tower_options.feature_dtype(tower_dtype)
    self.image_tower = tower_options.image_tower(
      image_variant,
      image_size,
      dtype=tower_dtype,
      param_dtype=self.feature_dtype,
      remat=image_remat,
      rngs=rngs,
    )
    width = self.image_tower.width
    head = dict(dtype=self.feature_dtype, param_dtype=self.feature_dtype, rngs=rngs)
    self.head_hidden = nnx.Linear(width, head_dim, **head)
    self.head_out = nnx.Linear(head_dim, embed_dim, **head)
    self.embed_dim = embed_dim

  def features(self, images: jax.Array) -> jax.Array:
    """Backbone features (linear probes read these), float32 (B, width)."""
    return self.image_tower(images).astype(self.feature_dtype)

  def __call__(self, images: jax.Array) -> jax.Array:
    """Head output g(x) in float32 (B, embed_dim), before any normalisation."""
    return micro_batches.map_rows(self, HclModel._head_output_of_rows, images)

  def _head_output_of_rows(self, images: jax.Array) -> jax.Array:
    return self.head_out(jax.nn.relu(self.head_hidden(self.features(images))))
