"""The base of every objective's hyperparameters: parsed once, checked, frozen.

Each objective declares a subclass of `ObjectiveSettings` beside its loss (its
`Settings`), reads its `config.objective` section once into it and never
re-defaults a value afterwards. Configs build the section from the same
dataclass (`objectives.registry.section`), so a key exists in a config
exactly when the objective understands it: an unknown key (a typo on the
command line) fails at once with the valid names, and a bad choice (an
unknown `pullback` kind, say) fails before the model is built.

Kept free of JAX so that configs can import it cheaply.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, ClassVar

import ml_collections

from hyperbolic_vl import errors


def _plain(value: Any) -> Any:
  if isinstance(value, ml_collections.ConfigDict):
    return value.to_dict()
  if isinstance(value, ml_collections.FieldReference):
    return value.get()
  return value


def check_choice(settings, key: str, valid: tuple[str, ...]) -> None:
  value = getattr(settings, key)
  if value not in valid:
    raise errors.ConfigError(f"objective.{key}={value!r}; valid: {', '.join(map(repr, valid))}")


@dataclasses.dataclass(frozen=True)
class ObjectiveSettings:
  """Settings shared by every objective."""

  name: ClassVar[str] = ""

  @classmethod
  def from_config(cls, config: Mapping[str, Any] | None) -> ObjectiveSettings:
    values = {key: _plain(value) for key, value in dict(config or {}).items()}
    values.pop("name", None)
    fields = {field.name: field for field in dataclasses.fields(cls)}
    unknown = sorted(set(values) - set(fields))
    if unknown:
      raise errors.ConfigError(
        f"unknown objective setting(s) {unknown} for objective {cls.name!r}; "
        f"valid: {sorted(fields)}"
      )
    defaults = cls()
    coerced = {}
    for key, value in values.items():
      default = getattr(defaults, key)
      # Command-line overrides may arrive as ints where floats are meant;
      # None keeps the default, as an unset optional value.
      if value is None:
        continue
      if isinstance(default, bool):
        coerced[key] = bool(value)
      elif isinstance(default, (int, float, str)):
        coerced[key] = type(default)(value)
      else:
        coerced[key] = value
    return cls(**coerced)
