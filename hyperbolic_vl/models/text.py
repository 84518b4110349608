"""Causal pre-LN text transformer (MERU / CLIP text tower).

Tokens are right-padded with 0 after the end-of-text token. The EOT id is
the largest id in the vocabulary (CLIP's BPE convention), so the pooled
position is ``argmax(tokens)``; with a causal mask, nothing after EOT can
influence the pooled feature.

`embedding_noise` alpha > 0 adds NEFTune's noise (Jain et al. 2023) to the
embedded sequence in training steps only, as HAC's release does
(fdibiton/HAC hac/encoders/text_encoders.py:19-35, applied at :226-227 after
the position embedding is added): each real token's row (id != 0) gets
U(-1, 1)^D noise times alpha / sqrt(L D), L the row's count of real tokens,
D the width; padding rows get none. The key comes from the training step
(lora.training_mode); without one (evaluation, inference) the tower is
deterministic.
"""

from __future__ import annotations

from typing import Any, Literal

import jax
import jax.numpy as jnp
from flax import nnx

from hyperbolic_vl.models import lora as lora_lib
from hyperbolic_vl.models import transformer

Dtype = Any

# MLP width is always 4 * width (MERU's TransformerTextEncoder).
TEXT_SIZES = {
  "mu": dict(width=64, depth=2, heads=2),
  "base": dict(width=512, depth=12, heads=8),
  "large": dict(width=768, depth=12, heads=12),  # OpenAI CLIP ViT-L/14's text tower
}


TEXT_INITS = ("clip", "normal")


class TextTransformer(nnx.Module):
  """Token + learned position embedding, causal encoder, LN, EOT pooling.

  Parameters: ``token_embedding`` (vocab, D), ``positional_embedding``
  (context, D), ``encoder``, ``norm`` (final LN).
  """

  def __init__(
    self,
    variant: str,
    vocab_size: int,
    context_length: int,
    *,
    dtype: Dtype = jnp.float32,
    param_dtype: Dtype = jnp.float32,
    attention_implementation: Literal["xla", "cudnn"] | None = None,
    activation: str = "gelu",
    init: str = "clip",
    lora: lora_lib.LoraSettings = lora_lib.NO_LORA,
    remat: str = "none",
    embedding_noise: float = 0.0,
    rngs: nnx.Rngs,
  ):
    """Builds the tower.

    Args:
      activation: MLP activation, "gelu" (MERU) or "quick_gelu" (OpenAI CLIP).
      init: "clip" (MERU's and CLIP's width-dependent stds for the attention
        and MLP kernels, see `_clip_init`) or "normal" (std 0.02 everywhere).
      lora: LoRA adapters of this tower (models/lora.py), none by default.
      remat: what each encoder block keeps for the backward pass
        (`transformer.REMAT_POLICIES`).
      embedding_noise: NEFTune's alpha (the module docstring); 0: none.
    """
    if init not in TEXT_INITS:
      raise ValueError(f"text init={init!r}; valid: {TEXT_INITS}")
    if variant not in TEXT_SIZES:
      raise ValueError(f"Unknown text size {variant!r}; valid sizes: {sorted(TEXT_SIZES)}")
    config = TEXT_SIZES[variant]
    self.variant = variant
    self.width = config["width"]
    self.vocab_size = vocab_size
    self.context_length = context_length
    self.dtype = dtype
    if not embedding_noise >= 0:
      raise ValueError(f"embedding_noise must be >= 0, got {embedding_noise!r}")
    self.embedding_noise = float(embedding_noise)
    # Set by lora.training_mode on the model a training step merges; None:
    # no noise (evaluation, inference). Each call draws its own.
    self.noise_key = None
    self.noise_calls = 0

    # CLIP's init: token std 0.02, position std 0.01.
    self.token_embedding = nnx.Embed(
      vocab_size,
      self.width,
      dtype=dtype,
      param_dtype=param_dtype,
      embedding_init=nnx.initializers.normal(stddev=0.02),
      rngs=rngs,
    )
    self.positional_embedding = nnx.Param(
      nnx.initializers.normal(stddev=0.01)(rngs.params(), (context_length, self.width), param_dtype)
    )
    self.encoder = transformer.Encoder(
      self.width,
      config["depth"],
      config["heads"],
      4 * self.width,
      causal=True,
      attention_implementation=attention_implementation,
      activation=activation,
      lora=lora,
      remat=remat,
      dtype=dtype,
      param_dtype=param_dtype,
      rngs=rngs,
    )
    if init == "clip":
      self._clip_init(rngs, param_dtype)
    # float32 computation so the tower hands float32 features to the
    # projection even under bf16 (geometry downstream must be float32).
    self.norm = transformer.layer_norm(
      self.width, dtype=jnp.promote_types(dtype, jnp.float32), param_dtype=param_dtype, rngs=rngs
    )

  def _clip_init(self, rngs: nnx.Rngs, param_dtype: Dtype) -> None:
    """Re-draws the block kernels with CLIP's stds (MERU uses the same).

    The residual stream sums 2 * depth branch outputs, so the output
    projections get std width**-0.5 * (2 depth)**-0.5 to keep its variance
    independent of depth; qkv uses width**-0.5 and the MLP input
    (2 width)**-0.5.
    """
    depth = len(self.encoder.blocks)
    attn_std = self.width**-0.5
    proj_std = attn_std * (2 * depth) ** -0.5
    fc_std = (2 * self.width) ** -0.5

    def redraw(linear: nnx.Linear, std: float) -> None:
      shape = linear.kernel[...].shape
      linear.kernel[...] = nnx.initializers.normal(stddev=std)(rngs.params(), shape, param_dtype)

    for block in self.encoder.blocks:
      redraw(block.attn.qkv, attn_std)
      redraw(block.attn.out, proj_std)
      redraw(block.mlp.fc1, fc_std)
      redraw(block.mlp.fc2, proj_std)

  def fold_in_slice(self, index: jax.Array) -> None:
    """A micro-batch's own noise (models/micro_batches.py)."""
    if self.noise_key is not None:
      self.noise_key = nnx.data(jax.random.fold_in(self.noise_key, index))

  def __call__(self, tokens: jax.Array) -> jax.Array:
    """Encodes token ids.

    Args:
      tokens: int (B, L), L <= context_length, EOT = the largest id in each
        row, 0-padded after it.

    Returns:
      float32 (B, width): final-LayerNorm features at the EOT position.
    """
    length = tokens.shape[1]
    if length > self.context_length:
      raise ValueError(f"{length} tokens exceed the context length {self.context_length}")
    features = self.token_embedding(tokens)
    # Shorter inputs use the leading rows of the table, as MERU does.
    features = features + self.positional_embedding[:length].astype(self.dtype)
    if self.embedding_noise > 0 and self.noise_key is not None:
      key = jax.random.fold_in(self.noise_key, self.noise_calls)
      self.noise_calls += 1
      features = features + neftune_noise(key, tokens, self.width, self.embedding_noise).astype(
        features.dtype
      )
    eot_position = jnp.argmax(tokens, axis=-1)
    pooled = self.encoder(features, output_position=eot_position)
    return self.norm(pooled)


def neftune_noise(key: jax.Array, tokens: jax.Array, width: int, alpha: float) -> jax.Array:
  """NEFTune's noise for int tokens (B, L), float32 (B, L, width): U(-1, 1)
  times alpha / sqrt(n_b width) on the n_b real (non-zero) tokens of row b,
  zero on padding (the module docstring)."""
  real = tokens != 0
  count = jnp.maximum(real.sum(axis=1), 1).astype(jnp.float32)
  scale = alpha / jnp.sqrt(count * width)
  uniform = jax.random.uniform(key, (*tokens.shape, width), jnp.float32, -1.0, 1.0)
  return uniform * scale[:, None, None] * real[..., None]
