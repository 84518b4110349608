"""Objectives by name: `config.objective.name` -> an Objective.

An objective registers once, in its own module, with the class decorator
`register`; its `name` and its `Settings` (the frozen dataclass of its
hyperparameters) are attributes of the class, so nothing else lists them.
Every module of this folder is imported on the first lookup, so a new
objective module is found without editing anything; a user's module outside
the package registers its own objective by importing this and decorating
its class (and is imported before the run, e.g. `main.py --module=...`):

    @objectives.registry.register
    class MyObjective(objectives.base.Objective):
      name = "mine"
      Settings = MySettings
      def loss(self, model, aux, batch, *, rng, axis_name, context): ...
"""

from __future__ import annotations

import dataclasses
import importlib

import ml_collections

from hyperbolic_vl import errors
from hyperbolic_vl.package_modules import package_modules

_CLASSES: dict[str, type] = {}
_builtins_loaded = False


def register(cls: type) -> type:
  """Class decorator: `cls.name` becomes a valid `config.objective.name`."""
  name = getattr(cls, "name", "")
  if not name or name == "base":
    raise ValueError(f"{cls.__name__} needs a `name` class attribute to be registered")
  if name in _CLASSES and _CLASSES[name].__qualname__ != cls.__qualname__:
    raise ValueError(f"objective {name!r} is registered twice")
  _CLASSES[name] = cls
  return cls


def _load_builtins() -> None:
  global _builtins_loaded
  if not _builtins_loaded:
    _builtins_loaded = True
    for module in package_modules("hyperbolic_vl.objectives"):
      importlib.import_module(module)


def names() -> list[str]:
  _load_builtins()
  return sorted(_CLASSES)


def objective_class(name: str) -> type:
  _load_builtins()
  if name not in _CLASSES:
    raise errors.ConfigError(f"objective.name={name!r} is unknown; valid: {names()}")
  return _CLASSES[name]


def get(objective_config):
  """The objective `config.objective` names, its settings parsed and checked."""
  return objective_class(objective_config["name"])(objective_config)


def section(name: str, **overrides) -> ml_collections.ConfigDict:
  """A complete `config.objective` section: `name` plus every setting with its
  default (so each can be overridden from the command line), updated by
  `overrides` (checked like a config)."""
  settings_class = objective_class(name).Settings
  settings_class.from_config(overrides)  # fails on unknown keys and bad choices
  values = dataclasses.asdict(settings_class())
  values.update(overrides)
  return ml_collections.ConfigDict({"name": name, **values})
