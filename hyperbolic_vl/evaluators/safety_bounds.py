"""Evaluator type "safety_bounds": HySAC's radius bounds of a run, in the
release's `hysac_bounds.json` layout.

  python -m hyperbolic_vl.evaluate --workdir=runs/hysac_tiny --eval=safety_bounds
  python -m hyperbolic_vl.evaluate --workdir=runs/hysac_l14 --eval=safety_bounds \\
      --split=train --set=output_dir=runs/hysac_l14

Embeds a quadruplet split of the run's own data source (`split`, default
"validation"; a ViSU run reads its `input.data.eval_path`, the setting
`eval_path` names another ViSU file) and writes the per-modality bounds
(metrics/safety.py) to <output_dir>/hysac_bounds.json, by default
<workdir>/eval/<name>/, where `hyperbolic_vl.load(...)`'s
`traverse_to_safe_image` / `traverse_to_safe_text` and the HySAC exporter
find them (a <workdir>/hysac_bounds.json, the converter's copy of the
released file, comes first: `--set=output_dir=RUN` replaces it).

Figures: safety_bounds/{V,S,G,U}/{up_95,low_05,avg}, the bounds written.
"""

from __future__ import annotations

import os

import ml_collections

from hyperbolic_vl import errors, files
from hyperbolic_vl.evaluators import registry, safety_retrieval
from hyperbolic_vl.evaluators.metrics import safety

SETTINGS = dict(
  split="validation",
  num_examples=None,
  eval_path="",  # another ViSU file for the run's `input.data.eval_path`
  output_dir="",
)


def with_eval_path(run_input, eval_path: str) -> ml_collections.FrozenConfigDict:
  """The run's frozen `config.input` with its source's `eval_path` replaced."""
  edited = ml_collections.ConfigDict(run_input.as_configdict())
  if "eval_path" not in edited.data:
    raise errors.ConfigError(f"eval_path: source {edited.data.name!r} has no eval_path")
  edited.data.eval_path = eval_path
  return ml_collections.FrozenConfigDict(edited)


@registry.register(
  "safety_bounds",
  settings=SETTINGS,
  description="HySAC's radius bounds of a run, written as hysac_bounds.json (the release's layout)",
  # Distances to the hyperboloid's origin: build_all disables it for any other model.
  geometries=("lorentz",),
)
class SafetyBoundsEvaluator:
  def __init__(self, name: str, settings, run_input, tokenizer=None):
    del name
    if settings.eval_path:
      run_input = with_eval_path(run_input, settings.eval_path)
    self.data = safety_retrieval.quadruplet_split(
      run_input, tokenizer, settings.split, settings.num_examples
    )
    self.output_dir = str(settings.output_dir or "")

  def __call__(self, predictor) -> dict[str, float]:
    embeddings = safety_retrieval.embed(predictor, self.data)
    bounds = safety.estimate_bounds(embeddings, float(predictor.curv))
    if self.output_dir:
      os.makedirs(self.output_dir, exist_ok=True)
      path = os.path.join(self.output_dir, safety.BOUNDS_FILE)
      files.write_file_atomically(path, safety.bounds_json(bounds))
      print(f"wrote {path}", flush=True)
    return {
      f"safety_bounds/{letter}/{statistic}": value
      for letter, statistics in bounds.items()
      for statistic, value in statistics.items()
    }
