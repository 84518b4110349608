"""Frozen settings of the input (`config.input`) and of each data source
(`config.input.data`).

A source reads its `input.data` section once, into the dataclass it declares
(a subclass of `SourceSettings`), and never re-defaults a value afterwards.
Configs build the section from the same dataclass (`registry.section`), so a
key exists in a config exactly when the source understands it: an unknown key
(a typo on the command line, or a key of another source) fails at once with
the valid names.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from typing import Any, ClassVar

import ml_collections

from hyperbolic_vl import errors
from hyperbolic_vl.data import tokenizer as tokenizer_lib
from hyperbolic_vl.data.transforms import NUM_TIERS

# Batch keys holding a row's caption tiers and their negatives (NUM_TIERS each).
TIER_KEYS = ("tier_tokens", "neg_tier_tokens")


def _plain(value: Any) -> Any:
  if isinstance(value, ml_collections.ConfigDict):
    return value.to_dict()
  if isinstance(value, ml_collections.FieldReference):
    return value.get()
  return value


def _coerce(value: Any, default: Any) -> Any:
  """`value` as the type of `default`: command-line overrides arrive as ints
  where floats are meant, and ConfigDicts hold lists where tuples are meant."""
  if isinstance(default, bool):
    return bool(value)
  if isinstance(default, (int, float, str)):
    return type(default)(value)
  if isinstance(default, tuple):
    return tuple(type(item)(x) for item, x in zip(default, value)) + tuple(value[len(default) :])
  return value


def _read(cls, config: Mapping[str, Any] | None, where: str, ignore: tuple[str, ...] = ()):
  values = {key: _plain(value) for key, value in dict(config or {}).items() if key not in ignore}
  fields = {field.name: field for field in dataclasses.fields(cls)}
  unknown = sorted(set(values) - set(fields))
  if unknown:
    raise errors.ConfigError(f"unknown {where} setting(s) {unknown}; valid: {sorted(fields)}")
  missing = sorted(
    name
    for name, field in fields.items()
    if values.get(name) is None
    and field.default is dataclasses.MISSING
    and field.default_factory is dataclasses.MISSING
  )
  if missing:
    raise errors.ConfigError(f"{where}.{missing[0]} is required")
  coerced = {}
  for key, value in values.items():
    field = fields[key]
    default = field.default if field.default is not dataclasses.MISSING else None
    if value is None:
      # None keeps the default: an unset optional value.
      if default is not None or field.default is dataclasses.MISSING:
        continue
      coerced[key] = None
    elif default is None:
      coerced[key] = value
    else:
      coerced[key] = _coerce(value, default)
  return cls(**coerced)


@dataclasses.dataclass(frozen=True)
class SourceSettings:
  """Settings of one data source (`input.data` less its `name`)."""

  source: ClassVar[str] = ""

  @classmethod
  def from_config(cls, config: Mapping[str, Any] | None) -> SourceSettings:
    return _read(cls, config, f"input.data (source {cls.source!r})", ignore=("name",))

  def slots(self, key: str) -> tuple[int, str]:
    """(inputs of batch key `key` in one batch row, the setting of this
    section that count follows, "" when none): what the memory preflight
    counts before anything is built (`registry.DataSource.row_inputs`)."""
    return (NUM_TIERS, "") if key in TIER_KEYS else (1, "")

  @classmethod
  def placeholder_type(cls, name: str) -> type:
    """The value type of an optional (None by default) setting, for a
    ConfigDict placeholder that the command line can fill."""
    hint = typing.get_type_hints(cls)[name]
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
      hint = next(arg for arg in typing.get_args(hint) if arg is not type(None))
    return hint


@dataclasses.dataclass(frozen=True)
class InputSettings:
  """`config.input`: what every source shares. `data` stays raw; its source
  reads it (SourceSettings)."""

  batch_size: int  # global, over all processes
  image_size: int = 0  # 0: not given (text-only sources need none)
  # A tokenizer.get_tokenizer config, used when the caller passes no tokenizer.
  tokenizer: Any = None
  num_threads: int = 1  # background reader threads
  prefetch_batches: int = 2
  num_workers: int = 0  # worker processes (0: read in this process)
  # Share of undecodable examples (skipped and counted) that stops a run; the
  # trainer reads it.
  max_bad_fraction: float = 0.01
  data: Any = None

  def __post_init__(self):
    # Checked here, with the key named: the reader library's own messages
    # ("batch_size must be positive.") say neither where nor which.
    bounds = dict(batch_size=1, image_size=0, num_threads=1, prefetch_batches=0, num_workers=0)
    for key, lowest in bounds.items():
      value = getattr(self, key)
      if not isinstance(value, int) or value < lowest:
        raise errors.ConfigError(f"input.{key} must be an integer >= {lowest}, got {value!r}")
    if not 0 <= self.max_bad_fraction <= 1:
      raise errors.ConfigError(
        f"input.max_bad_fraction must be in [0, 1], got {self.max_bad_fraction!r}"
      )

  @classmethod
  def from_config(cls, config: Mapping[str, Any]) -> InputSettings:
    settings = _read(cls, config, "input")
    if settings.data is None:
      raise errors.ConfigError("input.data is required")
    return settings

  def need_image_size(self) -> int:
    if self.image_size <= 0:
      raise errors.ConfigError("input.image_size is required")
    return self.image_size

  def resolve_tokenizer(self, tokenizer):
    """`tokenizer`, else the one `input.tokenizer` describes."""
    if tokenizer is not None:
      return tokenizer
    if self.tokenizer is None:
      raise errors.ConfigError("input.tokenizer is required")
    return tokenizer_lib.get_tokenizer(self.tokenizer)
