"""Pre-LN transformer pieces shared by the image and text towers.

Layout and numerics follow the PyTorch models MERU/CLIP were trained with, so
that their checkpoints can be converted without changing the function:

* LayerNorm epsilon 1e-5 (PyTorch default; Flax defaults to 1e-6).
* Exact (erf) GELU (Flax/JAX default to the tanh approximation).
* Fused qkv projection with bias, output projection with bias.

Mixed precision: ``dtype`` is the computation dtype (e.g. ``jnp.bfloat16``),
``param_dtype`` the storage dtype of the parameters (float32). Attention
logits and softmax, and LayerNorm statistics, are always float32.

Shapes: B batch, L sequence length, D width, H heads, D/H head dimension.
"""

from __future__ import annotations

from typing import Any, Literal

import jax
import jax.numpy as jnp
from flax import nnx

from hyperbolic_vl import errors
from hyperbolic_vl.models import attention as attention_lib
from hyperbolic_vl.models import compile_target, cpu_gradients
from hyperbolic_vl.models import lora as lora_lib

Dtype = Any

LAYER_NORM_EPSILON = 1e-5

# What an encoder block keeps for the backward pass (`Encoder(remat=...)`):
# "none" every activation; "dots_saveable" only matrix-product outputs, the
# rest (norms, GELU, softmax, residual adds) recomputed; "full" only the
# block's input, the whole block recomputed in the backward pass.
REMAT_POLICIES = ("none", "dots_saveable", "full")

# CLIP/timm-style initialisation: small normal kernels, zero biases, unit
# LayerNorm scale (nnx.LayerNorm's default).
default_kernel_init = nnx.initializers.normal(stddev=0.02)
default_bias_init = nnx.initializers.zeros_init()


def layer_norm(width: int, *, dtype: Dtype, param_dtype: Dtype, rngs: nnx.Rngs) -> nnx.LayerNorm:
  """LayerNorm with PyTorch's epsilon; statistics in at least float32."""
  return LayerNorm(
    width,
    epsilon=LAYER_NORM_EPSILON,
    # The two-pass variance is the one PyTorch computes; the one-pass
    # E[x^2] - E[x]^2 loses digits on the large-mean residual stream.
    use_fast_variance=False,
    dtype=dtype,
    param_dtype=param_dtype,
    rngs=rngs,
  )


class LayerNorm(nnx.LayerNorm):
  """nnx.LayerNorm (same params, same function); on a CPU its gradient is
  written out (`cpu_gradients.normalized_rows`), elsewhere autodiff's."""

  def __call__(self, x, *, mask=None):
    if (
      compile_target.platform() != "cpu"
      or mask is not None
      or self.scale is None
      or self.bias is None
      or self.reduction_axes != -1
    ):
      return super().__call__(x, mask=mask)
    x, scale, bias = self.promote_dtype((x, self.scale[...], self.bias[...]), dtype=self.dtype)
    output_dtype = x.dtype if self.dtype is None else self.dtype
    compute = jnp.promote_types(x.dtype, jnp.float32)
    x, scale, bias = cpu_gradients.common_varying(*(o.astype(compute) for o in (x, scale, bias)))
    return cpu_gradients.normalized_rows(x, scale, bias, self.epsilon).astype(output_dtype)


def affine(x: jax.Array, kernel: jax.Array, bias: jax.Array) -> jax.Array:
  """x @ kernel + bias over x's last axis (operands already in the
  computation dtype): `cpu_gradients.linear` on a CPU, plain autodiff elsewhere (GPUs and
  TPUs take either operand order of the weight gradient without copies)."""
  if compile_target.platform() != "cpu":
    return cpu_gradients.contract_last(x, kernel) + bias
  return cpu_gradients.linear(*cpu_gradients.common_varying(x, kernel, bias))


class Dense(nnx.Linear):
  """nnx.Linear (same params, same function) computed by `affine`."""

  def __call__(self, inputs: jax.Array, out_sharding=None) -> jax.Array:
    if (
      self.bias is None
      or out_sharding is not None
      or self.precision is not None
      or self.preferred_element_type is not None
    ):
      return super().__call__(inputs, out_sharding)
    inputs, kernel, bias = self.promote_dtype(
      (inputs, self.kernel[...], self.bias[...]), dtype=self.dtype
    )
    return affine(inputs, kernel, bias)


def dense(
  in_features: int,
  out_features: int,
  *,
  dtype: Dtype,
  param_dtype: Dtype,
  rngs: nnx.Rngs,
) -> nnx.Linear:
  return Dense(
    in_features,
    out_features,
    use_bias=True,
    dtype=dtype,
    param_dtype=param_dtype,
    kernel_init=default_kernel_init,
    bias_init=default_bias_init,
    rngs=rngs,
  )


class MultiHeadSelfAttention(nnx.Module):
  """Self-attention with a fused qkv projection.

  ``qkv`` kernel is (D, 3D) with output columns ordered [q | k | v], each
  split head-major into (H, D/H), matching PyTorch's ``in_proj_weight`` and
  timm's ``qkv`` after a transpose.
  """

  def __init__(
    self,
    width: int,
    num_heads: int,
    *,
    causal: bool = False,
    attention_implementation: Literal["xla", "cudnn"] | None = None,
    lora: lora_lib.LoraSettings = lora_lib.NO_LORA,
    dtype: Dtype = jnp.float32,
    param_dtype: Dtype = jnp.float32,
    rngs: nnx.Rngs,
  ):
    if width % num_heads:
      raise ValueError(f"width {width} is not divisible by {num_heads} heads")
    self.width = width
    self.num_heads = num_heads
    self.head_dim = width // num_heads
    self.causal = causal
    self.attention_implementation = attention_implementation
    self.dtype = dtype
    self.qkv = dense(width, 3 * width, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
    self.out = dense(width, width, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
    # LoRA adapters (None where model.lora adds none): one per qkv column
    # block, so q, k and v are adapted independently, and the output's.
    adapter = lambda target: lora_lib.adapter(
      lora, target, width, width, dtype=dtype, param_dtype=param_dtype, rngs=rngs
    )
    self.lora_q, self.lora_k, self.lora_v = adapter("q"), adapter("k"), adapter("v")
    self.lora_out = adapter("out")

  def __call__(
    self,
    x: jax.Array,
    *,
    mask: jax.Array | None = None,
    query_position: jax.Array | None = None,
  ) -> jax.Array:
    """Attends over the sequence.

    Args:
      x: (B, L, D).
      mask: optional bool, True where attention is allowed. Either (B, L), a
        key padding mask (True = real token), or anything broadcastable to
        (B, H, L, L). Combined with the causal mask when ``causal``.
      query_position: optional int (B,): attend from that row alone in each
        sequence (keys and values still come from every row).

    Returns:
      (B, L, D), or (B, 1, D) with ``query_position``, in the computation
      dtype.
    """
    batch, length, _ = x.shape
    qkv = self.qkv(x)
    qkv_adapters = (self.lora_q, self.lora_k, self.lora_v)
    if any(adapter is not None for adapter in qkv_adapters):
      columns = jnp.split(qkv, 3, axis=-1)
      columns = [c if a is None else c + a(x) for c, a in zip(columns, qkv_adapters, strict=True)]
      qkv = jnp.concatenate(columns, axis=-1)
    qkv = qkv.reshape(batch, length, 3, self.num_heads, self.head_dim)
    query, key, value = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    if mask is not None:
      mask = jnp.asarray(mask, bool)
      if mask.ndim == 2:
        mask = mask[:, None, None, :]
    causal = self.causal
    if query_position is not None:
      query = jnp.take_along_axis(query, query_position[:, None, None, None], axis=1)
      mask = _query_row_mask(mask, query_position, length, self.num_heads, causal)
      causal = False  # now part of the mask
    # The scope names these kernels in profiles (benchmarks/profile_split.py).
    with jax.named_scope("attention"):
      attended = self._attend(query, key, value, mask, causal)
    attended = attended.reshape(batch, query.shape[1], self.width)
    if self.lora_out is None:
      return self.out(attended)
    return self.out(attended) + self.lora_out(attended)

  def _attend(self, query, key, value, mask, causal):
    if query.dtype == jnp.float64:
      # The fused op computes float64 inputs in float32; float64 models exist
      # for exact identities, so they take the explicit softmax.
      return attention_lib.plain_attention(query, key, value, mask=mask, is_causal=causal)
    if query.shape[1] == 1 and compile_target.platform() != "cpu":
      # One query per sequence (a tower's pooled row): a (B, H, 1, L) score
      # matrix, nothing for a fused kernel to save, and not every kernel
      # takes a query shorter than its keys.
      return jax.nn.dot_product_attention(query, key, value, mask=mask, implementation="xla")
    if self.attention_implementation is None:
      # cuDNN's fused kernel on GPUs (no score matrices kept), else XLA's.
      return attention_lib.automatic_attention(query, key, value, mask=mask, is_causal=causal)
    # jax.nn.dot_product_attention computes logits and softmax in float32
    # for bf16 inputs. An explicit "cudnn" pads the sequences as the default
    # does: the kernel refuses ViT-B/16's 197 tokens and the text's 77 (H100
    # and H200, jax 0.11.2), and takes them padded to a multiple of 16.
    attend = jax.nn.dot_product_attention
    if self.attention_implementation == "cudnn":
      attend = attention_lib.padded_attention
    try:
      return attend(
        query,
        key,
        value,
        mask=mask,
        is_causal=causal,
        implementation=self.attention_implementation,
      )
    except (RuntimeError, NotImplementedError) as error:
      # An explicit request the kernel refuses (no cuDNN on a CPU, float32
      # operands) is the user's setting to change, said in one line; None
      # falls back on its own.
      raise errors.ConfigError(
        f"model.attention_implementation={self.attention_implementation!r} cannot run these "
        f"operands ({str(error).splitlines()[0][:160]}); leave it unset (None) to fall back "
        "to XLA's attention where the fused kernel refuses"
      ) from None


def _query_row_mask(mask, query_position, length, num_heads, causal):
  """The (B, H or 1, 1, L) mask of the query at `query_position` (B,) alone,
  from a mask for every query (None, or broadcastable to (B, H, L, L)) and
  the causal pattern."""
  batch = query_position.shape[0]
  if mask is not None and mask.shape[-2] != 1:
    mask = jnp.broadcast_to(mask, (batch, num_heads, length, length))
    mask = jnp.take_along_axis(mask, query_position[:, None, None, None], axis=2)
  if causal:
    earlier = jnp.arange(length)[None, :] <= query_position[:, None]
    earlier = earlier[:, None, None, :]
    mask = earlier if mask is None else mask & earlier
  return mask


ACTIVATIONS = ("gelu", "quick_gelu", "gelu_tanh")


def gelu(x: jax.Array) -> jax.Array:
  """Exact GELU, x * Phi(x), as PyTorch's nn.GELU() computes it:
  0.5 x (1 + erf(x / sqrt(2))). jax.nn.gelu writes it with erfc, which
  XLA:CPU evaluates piecewise with an exponential; erf is one rational
  polynomial (the switch took about 5% off the tiny CPU step). The two
  differ only where Phi(x) < float32's epsilon, by less than |x| * 1e-7."""
  return 0.5 * x * (1.0 + jax.lax.erf(x * jnp.asarray(0.7071067811865476, x.dtype)))


def activation_fn(name: str):
  """ "gelu": exact (erf) GELU, as nn.GELU(), what MERU's checkpoints need;
  "quick_gelu": x * sigmoid(1.702 x), the approximation OpenAI CLIP was
  trained with; "gelu_tanh": the tanh approximation, for training from
  scratch (cheaper on accelerators, where XLA can fuse it into the matmul's
  epilogue; about 1e-3 away from the exact GELU, so not for converted
  checkpoints)."""
  if name == "gelu":
    return gelu
  if name == "quick_gelu":
    return lambda x: x * jax.nn.sigmoid(1.702 * x)
  if name == "gelu_tanh":
    return lambda x: jax.nn.gelu(x, approximate=True)
  raise ValueError(f"activation={name!r}; valid: {ACTIVATIONS}")


class MlpBlock(nnx.Module):
  """Linear -> activation (exact GELU by default) -> Linear."""

  def __init__(
    self,
    width: int,
    mlp_dim: int,
    *,
    activation: str = "gelu",
    lora: lora_lib.LoraSettings = lora_lib.NO_LORA,
    dtype: Dtype = jnp.float32,
    param_dtype: Dtype = jnp.float32,
    rngs: nnx.Rngs,
  ):
    self.activation = activation_fn(activation)
    self.fc1 = dense(width, mlp_dim, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
    self.fc2 = dense(mlp_dim, width, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
    adapter = lambda target, fan_in, fan_out: lora_lib.adapter(
      lora, target, fan_in, fan_out, dtype=dtype, param_dtype=param_dtype, rngs=rngs
    )
    self.lora_fc1 = adapter("fc1", width, mlp_dim)
    self.lora_fc2 = adapter("fc2", mlp_dim, width)

  def __call__(self, x: jax.Array) -> jax.Array:
    hidden = self.fc1(x)
    if self.lora_fc1 is not None:
      hidden = hidden + self.lora_fc1(x)
    hidden = self.activation(hidden)
    if self.lora_fc2 is None:
      return self.fc2(hidden)
    return self.fc2(hidden) + self.lora_fc2(hidden)


class EncoderBlock(nnx.Module):
  """Pre-LN block: x + attn(LN(x)); x + mlp(LN(x))."""

  def __init__(
    self,
    width: int,
    num_heads: int,
    mlp_dim: int,
    *,
    causal: bool = False,
    attention_implementation: Literal["xla", "cudnn"] | None = None,
    activation: str = "gelu",
    lora: lora_lib.LoraSettings = lora_lib.NO_LORA,
    dtype: Dtype = jnp.float32,
    param_dtype: Dtype = jnp.float32,
    rngs: nnx.Rngs,
  ):
    self.norm1 = layer_norm(width, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
    self.attn = MultiHeadSelfAttention(
      width,
      num_heads,
      causal=causal,
      attention_implementation=attention_implementation,
      lora=lora,
      dtype=dtype,
      param_dtype=param_dtype,
      rngs=rngs,
    )
    self.norm2 = layer_norm(width, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
    self.mlp = MlpBlock(
      width,
      mlp_dim,
      activation=activation,
      lora=lora,
      dtype=dtype,
      param_dtype=param_dtype,
      rngs=rngs,
    )

  def __call__(
    self,
    x: jax.Array,
    *,
    mask: jax.Array | None = None,
    output_position: jax.Array | None = None,
  ) -> jax.Array:
    """(B, L, D) -> (B, L, D); with `output_position` (B,) ints, (B, D): the
    output row at that position alone, whose attention query and MLP run on
    that row only."""
    if output_position is None:
      x = x + self.attn(self.norm1(x), mask=mask)
      x = residual_gradient_stored(x)
      return x + self.mlp(self.norm2(x))
    row = jnp.take_along_axis(x, output_position[:, None, None], axis=1)
    row = row + self.attn(self.norm1(x), mask=mask, query_position=output_position)
    return (row + self.mlp(self.norm2(row)))[:, 0]


class Encoder(nnx.Module):
  """``depth`` pre-LN blocks. No final LayerNorm: the towers own theirs.

  ``remat`` (REMAT_POLICIES) rematerialises each block: the backward pass
  recomputes what the forward pass did not keep, trading compute for
  activation memory.
  """

  def __init__(
    self,
    width: int,
    depth: int,
    num_heads: int,
    mlp_dim: int,
    *,
    causal: bool = False,
    attention_implementation: Literal["xla", "cudnn"] | None = None,
    activation: str = "gelu",
    lora: lora_lib.LoraSettings = lora_lib.NO_LORA,
    remat: str = "none",
    dtype: Dtype = jnp.float32,
    param_dtype: Dtype = jnp.float32,
    rngs: nnx.Rngs,
  ):
    if remat not in REMAT_POLICIES:
      raise ValueError(f"remat={remat!r}; valid: {REMAT_POLICIES}")
    self.remat = remat
    self.dtype = dtype
    self.blocks = nnx.List(
      [
        EncoderBlock(
          width,
          num_heads,
          mlp_dim,
          causal=causal,
          attention_implementation=attention_implementation,
          activation=activation,
          # A block the settings exclude (model.lora.*_excluded_blocks) has none.
          lora=lora.for_block(index),
          dtype=dtype,
          param_dtype=param_dtype,
          rngs=rngs,
        )
        for index in range(depth)
      ]
    )

  def __call__(
    self,
    x: jax.Array,
    *,
    mask: jax.Array | None = None,
    output_position: jax.Array | None = None,
  ) -> jax.Array:
    """(B, L, D) -> (B, L, D) in the computation dtype.

    `output_position` (B,) ints: the caller reads one row per sequence (a
    tower's CLS or EOT row), and gets (B, D), that row alone. The last
    block then computes its attention query and its MLP for that row only:
    the same values, without the work for rows nothing reads (about 6% of
    MERU ViT-S/16's step FLOPs)."""
    # Cast once so the residual stream stays in the computation dtype (a
    # float32 input would otherwise promote every residual add).
    x = x.astype(self.dtype)
    run_block = _block_runner(self.remat)
    last = len(self.blocks) - 1
    for index, block in enumerate(self.blocks):
      x = run_block(block, x, mask, output_position if index == last else None)
    return x


def _run_block(
  block: EncoderBlock,
  x: jax.Array,
  mask: jax.Array | None,
  output_position: jax.Array | None = None,
) -> jax.Array:
  return block(residual_gradient_stored(x), mask=mask, output_position=output_position)


def residual_gradient_stored(x: jax.Array) -> jax.Array:
  """x, whose gradient XLA:CPU writes to memory once instead of recomputing.

  The residual stream's gradient is a running sum over every later block
  (each LayerNorm's backward adds a term). XLA:CPU fuses element-wise
  producers into each consumer, so without a stored value every block's
  backward recomputed the whole sum from the last block down: quadratic in
  depth, about a tenth of a ViT-S step. An optimization barrier on the
  cotangent stops that fusion, where the compiler keeps barriers: XLA:CPU
  expands them before fusing unless the step is compiled with
  `training.compilation.step_compiler_options()` (without them this is a plain
  identity). Values are unchanged either way; GPUs and TPUs get the
  identity."""
  if compile_target.platform() != "cpu":
    return x
  return cpu_gradients.stored_cotangent(x)


def _block_runner(remat: str):
  """`_run_block`, rematerialised as `remat` says (REMAT_POLICIES): the
  gradient is the same function, only what the forward pass stores for the
  backward one changes (tests/models/test_remat.py)."""
  if remat == "none":
    return _run_block
  # None saves nothing but the block's arguments (jax.checkpoint's default).
  policy = jax.checkpoint_policies.dots_saveable if remat == "dots_saveable" else None
  return nnx.remat(_run_block, policy=policy)
