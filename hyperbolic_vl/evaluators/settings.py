"""The settings of each evaluator type of `config.evals`, with defaults.

Kept apart from the evaluators themselves (evaluators/registry.py) so that
configs can build complete entries without importing any evaluator.
"""

from __future__ import annotations

import ml_collections

COMMON_SETTINGS = {"type": "", "every_steps": 0, "batch_size": 256}

_LABELLED = dict(dataset="", split="", data_dir="", num_examples=None, image_size=0)
# type -> (settings beyond COMMON_SETTINGS with their defaults, what it computes)
TYPE_SETTINGS: dict[str, tuple[dict, str]] = {
  "world": (
    dict(split="test", num_examples=None, zero_shot_kinds=("shape", "color", "count")),
    "retrieval, zero-shot and hierarchy figures on the synthetic world's held-out split",
  ),
  "hierarchy": (
    dict(
      source="world",
      path="",
      image_root="",
      split="test",
      num_examples=None,
      root="objective",
      method="thresholds",
      omit_first_prediction=False,
    ),
    "HierarCaps precision / recall / tau_d (world caption tiers or a HierarCaps CSV)",
  ),
  "atmg_analysis": (
    dict(
      source="world",
      path="",
      image_root="",
      split="test",
      num_examples=None,
      region_fraction=0.5,
      num_eigenvalues=10,
      output_dir="",
    ),
    "ATMG's image / text hierarchy accuracy and covariance eigenvalue spectrum (PNG)",
  ),
  "hcl_world": (
    dict(split="test", num_examples=None),
    "HCL: object linear probe and scene-norm NDCG on world scenes",
  ),
  "zero_shot": (
    dict(_LABELLED, prompts=(), classnames=()),
    "zero-shot classification (benchmark name, tfds:NAME or folder:DIR)",
  ),
  "retrieval": (
    dict(_LABELLED, images="", captions_key="captions/text"),
    "image-text retrieval (coco, flickr30k, tfds:NAME or csv:FILE with images=DIR)",
  ),
  "linear_probe": (
    dict(_LABELLED, train_split="", val_split=""),
    "logistic regression on frozen image embeddings (benchmark name or tfds:NAME)",
  ),
}


def valid_keys(type_name: str) -> set[str]:
  return set(COMMON_SETTINGS) | set(TYPE_SETTINGS[type_name][0])


def entry(type_name: str, **settings) -> ml_collections.ConfigDict:
  """A complete `config.evals.<name>` entry: every valid key with its default
  (so each can be overridden from the command line), updated by `settings`."""
  if type_name not in TYPE_SETTINGS:
    raise ValueError(f"unknown evaluator type {type_name!r}; valid: {sorted(TYPE_SETTINGS)}")
  values = dict(COMMON_SETTINGS, **TYPE_SETTINGS[type_name][0], type=type_name)
  unknown = set(settings) - set(values)
  if unknown:
    raise ValueError(
      f"unknown setting(s) {sorted(unknown)} for evaluator type {type_name!r}; "
      f"valid: {sorted(values)}"
    )
  values.update(settings)
  config = ml_collections.ConfigDict()
  for key, value in values.items():
    # None defaults become typed placeholders so "--config.evals.x.num_examples=64" parses.
    config[key] = ml_collections.config_dict.placeholder(int) if value is None else value
  return config
