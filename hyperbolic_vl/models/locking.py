"""Locked towers: which parameters a run leaves as they are.

`config.model` keys, per tower (`image`, `text`), open_clip's LiT options:

    lock_image                    True: the image tower and its projection
                                  (`image_tower/...`, `image_proj`) are locked
    lock_image_unlocked_blocks    N > 0: the last N encoder blocks and all
                                  that follows them (final LayerNorm,
                                  projection) stay trainable
    lock_image_norms_trainable    True: the locked part's LayerNorms stay
                                  trainable

and the same three with `text`. LoRA adapters (`model.lora`, models/lora.py)
lock their towers' base weights the same way: in an adapted tower only the
`lora_*` parameters train, and the paths `model.lora.train_beside` names
(HAC: its re-initialised projections and final LayerNorms). The learned
scalars (logit scale, curvature, alphas) are never locked by these keys.

A locked parameter is handled twice by the trainer: the optimizer labels it
"frozen" (no optimizer state at all, optimizer.py), and the step puts it
through `stop_gradient` before the forward, so a wholly locked tower is a
constant of the differentiated function: no gradient is computed for it and
none of its activations are kept for a backward pass.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any

from hyperbolic_vl import errors
from hyperbolic_vl.models import lora

TOWERS = ("image", "text")
_BLOCK = re.compile(r"^\d+$")
# Module names of LayerNorms in the towers (transformer.layer_norm users).
_NORM_NAMES = re.compile(r"^(norm\d*|ln_pre)$")


@dataclasses.dataclass(frozen=True)
class TowerLock:
  locked: bool = False
  unlocked_blocks: int = 0
  norms_trainable: bool = False


def _tower_lock(model_config: Mapping[str, Any], tower: str) -> TowerLock:
  prefix = f"lock_{tower}"
  locked = bool(model_config.get(prefix, False))
  unlocked = int(model_config.get(f"{prefix}_unlocked_blocks", 0) or 0)
  norms = bool(model_config.get(f"{prefix}_norms_trainable", False))
  if unlocked < 0:
    raise errors.ConfigError(f"model.{prefix}_unlocked_blocks={unlocked}: must be >= 0")
  if not locked and (unlocked or norms):
    key = f"{prefix}_unlocked_blocks" if unlocked else f"{prefix}_norms_trainable"
    raise errors.ConfigError(f"model.{key} is set but model.{prefix} is False: set {prefix}=True")
  return TowerLock(locked, unlocked, norms)


@dataclasses.dataclass(frozen=True)
class Locks:
  """Which params of a two-tower (or HCL) model the run leaves unchanged."""

  towers: dict[str, TowerLock]
  adapters: lora.LoraSettings
  depth: dict[str, int]  # encoder blocks per tower, from the params

  @classmethod
  def from_model_config(cls, model_config: Mapping[str, Any], params: Mapping) -> Locks:
    model_config = dict(model_config)
    towers = {tower: _tower_lock(model_config, tower) for tower in TOWERS}
    depth = {tower: _encoder_depth(params, tower) for tower in TOWERS}
    for tower, lock in towers.items():
      if lock.unlocked_blocks and lock.unlocked_blocks > depth[tower]:
        raise errors.ConfigError(
          f"model.lock_{tower}_unlocked_blocks={lock.unlocked_blocks} exceeds the "
          f"{depth[tower]} encoder blocks of the {tower} tower"
        )
    return cls(towers, lora.LoraSettings.from_model_config(model_config), depth)

  @property
  def any(self) -> bool:
    return self.adapters.enabled or any(lock.locked for lock in self.towers.values())

  def locked(self, path: tuple[str, ...]) -> bool:
    """True when the parameter at `path` ("image_tower", "encoder", ...) is locked."""
    if lora.is_adapter_path(path):
      return False
    tower = _tower_of(path)
    if tower is None:
      return False
    if self.adapters.enabled and tower in self.adapters.towers:
      return not _under_any(path, self.adapters.train_beside)
    lock = self.towers[tower]
    if not lock.locked:
      return False
    if lock.norms_trainable and len(path) >= 2 and _NORM_NAMES.match(str(path[-2])):
      return False
    if lock.unlocked_blocks:
      first_unlocked = self.depth[tower] - lock.unlocked_blocks
      block = _block_index(path)
      if block is not None:
        return block < first_unlocked
      # Outside the blocks: what comes after them (final norm, projection)
      # trains with the unlocked blocks; what comes before stays locked.
      return not _after_blocks(path)
    return True


def _under_any(path: tuple[str, ...], prefixes: tuple[str, ...]) -> bool:
  """True when `path` is, or lies under, one of the "/"-joined `prefixes`."""
  name = "/".join(map(str, path))
  return any(name == prefix or name.startswith(prefix + "/") for prefix in prefixes)


def _tower_of(path: tuple[str, ...]) -> str | None:
  head = str(path[0])
  for tower in TOWERS:
    if head in (f"{tower}_tower", f"{tower}_proj"):
      return tower
  return None


def _block_index(path: tuple[str, ...]) -> int | None:
  parts = [str(part) for part in path]
  for i in range(len(parts) - 2):
    if parts[i + 1] == "blocks" and parts[i] == "encoder" and _BLOCK.match(parts[i + 2]):
      return int(parts[i + 2])
  return None


def _after_blocks(path: tuple[str, ...]) -> bool:
  head = str(path[0])
  return head.endswith("_proj") or (len(path) >= 2 and str(path[1]) == "norm")


def _encoder_depth(params: Mapping, tower: str) -> int:
  tower_params = params.get(f"{tower}_tower", {})
  blocks = (
    tower_params.get("encoder", {}).get("blocks", {}) if isinstance(tower_params, Mapping) else {}
  )
  return len(blocks)
