"""Objective registry: `config.objective.name` -> Objective subclass."""

from __future__ import annotations

import importlib

# name -> "module:Class"; imported lazily so one objective's optional
# dependencies never break another.
_REGISTRY = {
  "clip": "hyperbolic_vl.objectives.clip:ClipObjective",
  "meru": "hyperbolic_vl.objectives.meru:MeruObjective",
  "hmid": "hyperbolic_vl.objectives.hmid:HmidObjective",
  "atmg": "hyperbolic_vl.objectives.atmg:AtmgObjective",
  "radial": "hyperbolic_vl.objectives.radial:RadialObjective",
  "hcl": "hyperbolic_vl.objectives.hcl:HclObjective",
}


def register(name: str, target: str) -> None:
  _REGISTRY[name] = target


def names() -> list[str]:
  return sorted(_REGISTRY)


def get(objective_config):
  name = objective_config["name"]
  if name not in _REGISTRY:
    raise ValueError(f"objective.name={name!r} is unknown; valid: {names()}")
  module_name, class_name = _REGISTRY[name].split(":")
  cls = getattr(importlib.import_module(module_name), class_name)
  return cls(objective_config)
