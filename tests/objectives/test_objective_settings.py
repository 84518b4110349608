"""Objective hyperparameters: parsed once, defaults in one place, bad keys fail."""

from __future__ import annotations

import dataclasses
import importlib

import pytest
from paths import method_config_names

from hyperbolic_vl import objectives

CONFIG_MODULES = method_config_names(recipes=True)


@pytest.mark.parametrize("name", CONFIG_MODULES)
def test_config_section_holds_exactly_the_objectives_settings(name):
  config = importlib.import_module(f"configs.{name}").get_config()
  objective = objectives.get(config.objective)
  fields = {field.name for field in dataclasses.fields(objective.settings)}
  assert set(config.objective.keys()) - {"name"} == fields
  # Every value the objective uses is the config's value, not a re-default.
  for key in fields:
    value = config.objective[key]
    value = value.to_dict() if hasattr(value, "to_dict") else value
    assert getattr(objective.settings, key) == value, key


def test_unknown_key_names_the_valid_ones():
  with pytest.raises(ValueError, match=r"entail_wieght.*valid: \[.*'entail_weight'"):
    objectives.get({"name": "meru", "entail_wieght": 0.5})


@pytest.mark.parametrize(
  "name, key, value",
  [
    ("radial", "pullback", "cosine"),
    ("radial", "root", "centre"),
    ("atmg", "angle_loss", "mine"),
    ("atmg", "inference", "mine"),
    ("hcl", "ball_clip", "none"),
    ("hmid", "teacher_width_map", "pca"),
  ],
)
def test_bad_choice_fails_at_construction(name, key, value):
  with pytest.raises(ValueError, match=f"objective.{key}={value!r}"):
    objectives.get({"name": name, key: value})


def test_settings_are_frozen_and_typed():
  objective = objectives.get({"name": "meru", "entail_weight": 1, "logit_chunk_size": 8.0})
  assert objective.settings.entail_weight == 1.0
  assert isinstance(objective.settings.entail_weight, float)
  assert isinstance(objective.settings.logit_chunk_size, int)
  with pytest.raises(dataclasses.FrozenInstanceError):
    objective.settings.entail_weight = 0.3


def test_command_line_override_reaches_the_objective():
  config = importlib.import_module("configs.atmg").get_config()
  config.objective.inference = "paper"
  assert objectives.get(config.objective).settings.inference == "paper"
  hmid_config = importlib.import_module("configs.hmid").get_config()
  with hmid_config.unlocked():
    hmid_config.total_steps = 321  # linked to objective.total_steps
  assert objectives.get(hmid_config.objective).settings.total_steps == 321


def test_every_registered_objective_has_its_own_settings():
  builtin = objectives.names()
  # Each method config names a registered objective (its own, or one it adapts).
  assert {
    importlib.import_module(f"configs.{n}").get_config().objective.name for n in CONFIG_MODULES
  } <= set(builtin)
  for name in builtin:
    assert objectives.registry.objective_class(name).Settings.name == name
