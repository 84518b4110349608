"""LoRA: low-rank adapters on the towers' projections (`config.model.lora`).

An adapted projection computes

    y = x W + b + s dropout(x) A B,     A: (in, rank), B: (rank, out)

with s = alpha / rank (PEFT's LoRA), or s = alpha / sqrt(rank) with
`rank_stabilised` (PEFT's `use_rslora`, Kalajdzievski 2023: the update's
size then does not shrink as the rank grows; HAC's recipe),

with the base W, b locked (models/locking.py) and only A, B trained. B starts
at zero, so at step 0 the adapted model computes exactly what its base
computes; A starts uniform in +-1/sqrt(in), the initialisation PEFT's LoRA
uses, so that B's first gradients are of the usual size.

Targets (`lora.targets`) name projections of every encoder block of the
towers in `lora.towers`:
  "q", "k", "v"   the query, key and value columns of the fused qkv kernel
  "out"           the attention output projection
  "fc1", "fc2"    the MLP's two linears
  "patch"         the ViT patch embedding (image tower only); its adapter
                  reads the flattened p x p x 3 patch, as a conv kernel would

`image_excluded_blocks` / `text_excluded_blocks` name encoder blocks (by
index) of a tower that get no adapters (PEFT's `exclude_modules`; HAC
leaves visual blocks 0-7 and text blocks 0-3 as they are). `train_beside`
names param paths ("image_proj", "text_tower/norm") that train in an
adapted tower although they are not adapters (models/locking.py): HAC
trains its re-initialised projections and final LayerNorms.

Adapters live beside what they adapt, under names starting with "lora_"
(`.../attn/lora_k/down`, `.../attn/lora_k/up`, `image_tower/lora_patch/up`),
so a run without adapters keeps its parameter layout and checkpoints.
`merge_adapters` folds trained adapters into the base kernels; the merged
params are those of the base model (`without_lora_config`) and compute the
same function, which is what inference exports and converters see.

Dropout on the adapter input needs a key: the trainer switches a merged
model to training mode with `training_mode(module, key)`; without it (every
evaluation and inference path) adapters are deterministic.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from hyperbolic_vl import errors

TARGETS = ("q", "k", "v", "out", "fc1", "fc2", "patch")
TOWERS = ("image", "text")
ADAPTER_PREFIX = "lora_"
# The fused qkv kernel's column blocks, in order.
QKV_TARGETS = ("q", "k", "v")


def _as_tuple(value, key: str) -> tuple[str, ...]:
  if isinstance(value, str):
    return tuple(part.strip() for part in value.split(",") if part.strip())
  if isinstance(value, (list, tuple)):
    return tuple(str(part) for part in value)
  raise errors.ConfigError(f"model.lora.{key}={value!r}: give a tuple or a comma-separated string")


def _block_indices(value, key: str) -> tuple[int, ...]:
  parts = _as_tuple(value, key)
  if not all(part.isdigit() for part in parts):
    raise errors.ConfigError(f"model.lora.{key}={value!r}: give block indices (ints >= 0)")
  return tuple(sorted({int(part) for part in parts}))


@dataclasses.dataclass(frozen=True)
class LoraSettings:
  """`config.model.lora`: rank 0 (the default) adds no adapters."""

  rank: int = 0
  alpha: float = 1.0  # the update is scaled by alpha / rank (PEFT's lora_alpha)
  dropout: float = 0.0  # on each adapter's input, training steps only
  targets: tuple[str, ...] = ("q", "k", "v", "out", "fc1", "fc2")
  towers: tuple[str, ...] = TOWERS
  rank_stabilised: bool = False  # scale alpha / sqrt(rank) (PEFT's use_rslora)
  image_excluded_blocks: tuple[int, ...] = ()  # encoder blocks left without adapters
  text_excluded_blocks: tuple[int, ...] = ()
  train_beside: tuple[str, ...] = ()  # param path prefixes that train beside the adapters
  # The blocks of the tower these settings were resolved for (`for_tower`).
  excluded_blocks: tuple[int, ...] = ()

  @property
  def enabled(self) -> bool:
    return self.rank > 0

  @property
  def scale(self) -> float:
    if self.rank_stabilised:
      return self.alpha / self.rank**0.5
    return self.alpha / self.rank

  def adapts(self, target: str) -> bool:
    return self.enabled and target in self.targets

  def for_tower(self, tower: str) -> LoraSettings:
    """These settings in `tower`, or no adapters where `towers` leaves it out;
    `excluded_blocks` then holds that tower's excluded blocks."""
    if not (self.enabled and tower in self.towers):
      return NO_LORA
    return dataclasses.replace(self, excluded_blocks=getattr(self, f"{tower}_excluded_blocks"))

  def for_block(self, index: int) -> LoraSettings:
    """The settings of encoder block `index` of a tower (`for_tower`'s)."""
    return NO_LORA if index in self.excluded_blocks else self

  @classmethod
  def from_model_config(cls, model_config: Mapping[str, Any]) -> LoraSettings:
    section = dict(model_config).get("lora") or {}
    section = dict(section.to_dict() if hasattr(section, "to_dict") else section)
    known = {field.name for field in dataclasses.fields(cls)} - {"excluded_blocks"}
    unknown = sorted(set(section) - known)
    if unknown:
      raise errors.ConfigError(f"model.lora has unknown keys {unknown}; valid: {sorted(known)}")
    values = {}
    if "rank" in section:
      values["rank"] = int(section["rank"])
    if "alpha" in section:
      values["alpha"] = float(section["alpha"])
    if "dropout" in section:
      values["dropout"] = float(section["dropout"])
    if "rank_stabilised" in section:
      values["rank_stabilised"] = bool(section["rank_stabilised"])
    for key in ("targets", "towers", "train_beside"):
      if key in section:
        values[key] = _as_tuple(section[key], key)
    for key in ("image_excluded_blocks", "text_excluded_blocks"):
      if key in section:
        values[key] = _block_indices(section[key], key)
    settings = cls(**values)
    settings.check()
    return settings

  def check(self) -> None:
    if self.rank < 0:
      raise errors.ConfigError(f"model.lora.rank={self.rank}: must be >= 0 (0: no adapters)")
    if not 0.0 <= self.dropout < 1.0:
      raise errors.ConfigError(f"model.lora.dropout={self.dropout}: must be in [0, 1)")
    if self.enabled and self.alpha <= 0:
      raise errors.ConfigError(f"model.lora.alpha={self.alpha}: must be > 0")
    for key, valid in (("targets", TARGETS), ("towers", TOWERS)):
      bad = [name for name in getattr(self, key) if name not in valid]
      if bad:
        raise errors.ConfigError(f"model.lora.{key} has {bad}; valid: {list(valid)}")
    if self.enabled and not self.targets:
      raise errors.ConfigError("model.lora.targets is empty: name at least one projection")


NO_LORA = LoraSettings()


class LowRankAdapter(nnx.Module):
  """x -> (alpha / rank) dropout(x) A B for inputs (..., in_features)."""

  def __init__(
    self,
    in_features: int,
    out_features: int,
    settings: LoraSettings,
    *,
    dtype,
    param_dtype,
    rngs: nnx.Rngs,
  ):
    bound = in_features**-0.5
    self.down = nnx.Param(
      jax.random.uniform(rngs.params(), (in_features, settings.rank), param_dtype, -bound, bound)
    )
    self.up = nnx.Param(jnp.zeros((settings.rank, out_features), param_dtype))
    self.scale = settings.scale
    self.dropout = settings.dropout
    self.dtype = dtype
    # Set by `training_mode` on the model a training step merges; None:
    # deterministic (evaluation, inference).
    self.dropout_key = None

  def fold_in_slice(self, index: jax.Array) -> None:
    """A micro-batch's own dropout masks (models/micro_batches.py)."""
    if self.dropout_key is not None:
      self.dropout_key = nnx.data(jax.random.fold_in(self.dropout_key, index))

  def __call__(self, x: jax.Array) -> jax.Array:
    x = x.astype(self.dtype)
    if self.dropout > 0 and self.dropout_key is not None:
      keep = jax.random.bernoulli(self.dropout_key, 1.0 - self.dropout, x.shape)
      x = jnp.where(keep, x / (1.0 - self.dropout), jnp.zeros_like(x))
    hidden = x @ self.down[...].astype(self.dtype)
    return (hidden @ self.up[...].astype(self.dtype)) * jnp.asarray(self.scale, self.dtype)


def adapter(
  settings: LoraSettings,
  target: str,
  in_features: int,
  out_features: int,
  *,
  dtype,
  param_dtype,
  rngs: nnx.Rngs,
) -> LowRankAdapter | None:
  """The adapter of `target` (settings of one tower, `for_tower`), or None
  where the settings add none."""
  if not settings.adapts(target):
    return None
  return LowRankAdapter(
    in_features, out_features, settings, dtype=dtype, param_dtype=param_dtype, rngs=rngs
  )


def patches(pixels: jax.Array, patch_size: int) -> jax.Array:
  """(B, H, W, C) -> (B, N, p*p*C) in row-major patch order, each patch
  flattened (row, column, channel) like a (p, p, C, D) conv kernel's inputs."""
  batch, height, width, channels = pixels.shape
  grid_h, grid_w = height // patch_size, width // patch_size
  blocks = pixels.reshape(batch, grid_h, patch_size, grid_w, patch_size, channels)
  blocks = blocks.transpose(0, 1, 3, 2, 4, 5)
  return blocks.reshape(batch, grid_h * grid_w, patch_size * patch_size * channels)


def _draws_in_training(node) -> bool:
  """An adapter with dropout, or a text tower with NEFTune's embedding noise
  (models/text.py): the parts of a model that draw random numbers in a
  training step and never outside one."""
  if isinstance(node, LowRankAdapter):
    return node.dropout > 0
  return getattr(node, "embedding_noise", 0.0) > 0


def training_mode(module: nnx.Module, key: jax.Array) -> None:
  """Gives each adapter with dropout (and each text tower with embedding
  noise) its own key, folded from `key`."""
  index = 0
  for _, node in module.iter_modules():
    if not _draws_in_training(node):
      continue
    folded = nnx.data(jax.random.fold_in(key, index))
    if isinstance(node, LowRankAdapter):
      node.dropout_key = folded
    else:
      node.noise_key = folded
    index += 1


# -- parameters ---------------------------------------------------------------


def is_adapter_path(path: tuple[str, ...]) -> bool:
  return any(str(part).startswith(ADAPTER_PREFIX) for part in path)


def has_adapters(params: Mapping) -> bool:
  return any(is_adapter_path(path) for path in _flatten(params))


def _flatten(tree: Mapping, prefix: tuple = ()) -> dict[tuple, Any]:
  """{path: leaf}; keys stay as they are (a block list's are ints)."""
  flat = {}
  for key, value in tree.items():
    path = (*prefix, key)
    if isinstance(value, Mapping):
      flat.update(_flatten(value, path))
    else:
      flat[path] = value
  return flat


def _unflatten(flat: Mapping[tuple[str, ...], Any]) -> dict:
  tree: dict = {}
  for path, value in flat.items():
    node = tree
    for part in path[:-1]:
      node = node.setdefault(part, {})
    node[path[-1]] = value
  return tree


def merge_adapters(params: Mapping, model_config: Mapping[str, Any]) -> dict:
  """The base model's params with every adapter folded in: W + (alpha/rank) A B.

  The result has no "lora_" entries and computes what the adapted model
  computes (up to rounding; exactly in float64 up to the matmul's own
  rounding). Params without adapters are returned unchanged.
  """
  flat = _flatten(params)
  if not any(is_adapter_path(path) for path in flat):
    return _unflatten(flat)
  settings = LoraSettings.from_model_config(model_config)
  if not settings.enabled:
    raise errors.ConfigError(
      "params hold LoRA adapters but model.lora.rank is 0: merge with the run's own config"
    )
  merged = {path: value for path, value in flat.items() if not is_adapter_path(path)}
  adapters = {path[:-1] for path in flat if path[-1] == "down" and is_adapter_path(path)}
  for adapter_path in adapters:
    name = str(adapter_path[-1])[len(ADAPTER_PREFIX) :]
    parent = adapter_path[:-1]
    down = np.asarray(flat[(*adapter_path, "down")])
    up = np.asarray(flat[(*adapter_path, "up")])
    delta = settings.scale * (down.astype(np.float64) @ up.astype(np.float64))
    if name in QKV_TARGETS:
      kernel_path = (*parent, "qkv", "kernel")
      kernel = np.array(merged[kernel_path], np.float64)
      width = kernel.shape[1] // 3
      column = QKV_TARGETS.index(name) * width
      kernel[:, column : column + width] += delta
    elif name == "patch":
      kernel_path = (*parent, "patch_embed", "kernel")
      kernel = np.array(merged[kernel_path], np.float64)
      kernel += delta.reshape(kernel.shape)
    elif name in ("out", "fc1", "fc2"):
      kernel_path = (*parent, name, "kernel")
      kernel = np.array(merged[kernel_path], np.float64)
      kernel += delta
    else:
      raise errors.ConfigError(f"unknown adapter {'/'.join(map(str, adapter_path))}")
    dtype = np.asarray(merged[kernel_path]).dtype
    merged[kernel_path] = jnp.asarray(kernel.astype(dtype))
  return _unflatten(merged)


def without_lora_config(run_config):
  """A copy of a run config with adapters off: the model that merged params
  (`merge_adapters`) belong to."""
  config = run_config.copy_and_resolve_references()
  if "lora" in config.model:
    with config.unlocked():
      config.model.lora.rank = 0
  return config


def has_dropout(module: nnx.Module) -> bool:
  """True when a training step must give the model keys (`training_mode`):
  adapter dropout, or NEFTune's noise on a text tower's embeddings."""
  return any(_draws_in_training(node) for _, node in module.iter_modules())
