"""Batch normalisation with PyTorch's semantics, synchronised over devices.

`BatchNorm` normalises NHWC (or any channels-last) activations per channel.
In evaluation mode (the default of every module built here) it uses the
running statistics; in training mode it uses the statistics of the whole
global batch and updates the running ones:

    mean_B, var_B = per-channel mean and biased variance over every row of
                    every device (two passes; `pmean` over `axis_name`)
    y             = (x - mean_B) / sqrt(var_B + eps) * scale + bias
    running_mean <- m running_mean + (1 - m) mean_B
    running_var  <- m running_var  + (1 - m) var_B n / (n - 1)

with n the number of values averaged per channel (global rows x H x W) and
m = 0.9 (torch's `momentum=0.1` counts the other way round). The unbiased
n / (n - 1) of the running variance is torch's too, so running statistics
after a step equal torchvision's on the same global batch.

Synchronised statistics make a step on 1 device equal a step on N (the
trainer's invariant); MoCo's "shuffle BN" instead normalises each GPU's
rows with that GPU's statistics.

The running statistics are `nnx.BatchStat` variables in the parameter dtype
(float64 in a float64 model, so identities can be checked exactly). The
trainer carries them as `state["batch_stats"]` (models/registry.py's
`ModelDef` splits them from the params) and switches a merged model to
training mode with `training_mode`.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

Dtype = Any

# torch.nn.BatchNorm2d's momentum=0.1, as the weight of the running value.
TORCH_MOMENTUM = 0.9


class BatchNorm(nnx.Module):
  """Per-channel batch normalisation over the last axis (see module doc).

  Attributes switched by `training_mode`: `use_running_average` (True:
  evaluation) and `axis_name` (the device axis statistics are averaged
  over in training, None on one device outside `shard_map`).
  """

  def __init__(
    self,
    num_features: int,
    *,
    momentum: float = TORCH_MOMENTUM,
    epsilon: float = 1e-5,
    dtype: Dtype = jnp.float32,
    param_dtype: Dtype = jnp.float32,
    rngs: nnx.Rngs,
  ):
    del rngs  # torch's initialisation is deterministic: gain 1, bias 0
    shape = (num_features,)
    self.scale = nnx.Param(jnp.ones(shape, param_dtype))
    self.bias = nnx.Param(jnp.zeros(shape, param_dtype))
    self.mean = nnx.BatchStat(jnp.zeros(shape, param_dtype))
    self.var = nnx.BatchStat(jnp.ones(shape, param_dtype))
    self.momentum = float(momentum)
    self.epsilon = float(epsilon)
    self.dtype = dtype
    self.use_running_average = True
    self.axis_name: str | None = None

  def __call__(self, x: jax.Array) -> jax.Array:
    # Statistics and the affine map in at least float32 (bf16 towers too).
    compute = jnp.promote_types(jnp.promote_types(self.dtype, jnp.float32), self.mean[...].dtype)
    x = x.astype(compute)
    if self.use_running_average:
      mean, var = self.mean[...].astype(compute), self.var[...].astype(compute)
    else:
      axes = tuple(range(x.ndim - 1))
      mean = self._global_mean(jnp.mean(x, axis=axes))
      var = self._global_mean(jnp.mean(jnp.square(x - mean), axis=axes))
      count = math.prod(x.shape[:-1])
      if self.axis_name is not None:
        count *= jax.lax.axis_size(self.axis_name)
      unbiased = var * (count / max(count - 1, 1))
      stat_dtype = self.mean[...].dtype
      m = self.momentum
      # set_value, not `[...] =`: flax's item assignment compares the new
      # value's `sharding` with the old one's, and a tracer's `sharding`
      # raises with a message that walks every equation traced so far: two
      # such walks per batch norm made tracing ResNet-50's step quadratic in
      # its length (minutes of HCL's `rn50` step).
      self.mean.set_value(
        jax.lax.stop_gradient(m * self.mean[...] + (1 - m) * mean).astype(stat_dtype)
      )
      self.var.set_value(
        jax.lax.stop_gradient(m * self.var[...] + (1 - m) * unbiased).astype(stat_dtype)
      )
    inverse = jax.lax.rsqrt(var + self.epsilon) * self.scale[...].astype(compute)
    return ((x - mean) * inverse + self.bias[...].astype(compute)).astype(self.dtype)

  def _global_mean(self, local: jax.Array) -> jax.Array:
    # Every device holds the same number of rows, so the mean of the
    # devices' means is the global batch's mean.
    if self.axis_name is None:
      return local
    return jax.lax.pmean(local, self.axis_name)


def training_mode(module: nnx.Module, axis_name: str | None) -> None:
  """Switches every batch norm of `module` (ours and `nnx.BatchNorm`) to
  training with statistics averaged over `axis_name`; no-op without one."""
  module.set_attributes(
    BatchNorm,
    nnx.BatchNorm,
    use_running_average=False,
    axis_name=axis_name,
    raise_if_not_found=False,
  )
