"""Evaluator type "safety_retrieval": HySAC's safety-aware retrieval on a
quadruplet split (sources `world_quadruplets`, `visu`).

The run's data source gives the split's safe and unsafe images and captions
(`split`, `num_examples`). Figures (hyperbolic_vl/evaluators/metrics/safety.py has the
release's definitions):

  safety_retrieval/<config>/R@{1,10,20}, .../safety
  safety_retrieval/<config>/traversal/R@{1,10,20}, .../traversal/safety
      for the release's configurations u2v_and_g (unsafe caption against
      [safe; unsafe] images), u2g_and_v ([unsafe; safe] images, a lower
      bound), g2s_and_u and g2u_and_s (unsafe image against the captions),
      u2u_and_s (unsafe caption against [safe; unsafe] captions); "safety"
      is the share of top-1 results in the gallery's first half
  safety_retrieval/{s2v,u2g}/{t2i,i2t}/R@k   plain retrieval within the
      safe and the unsafe pairs
  safety_retrieval/bounds/{V,S,G,U}/{up_95,low_05,avg}   the bounds used

Bounds: a `hysac_bounds.json` (`bounds`, e.g. the released one), or,
without it, estimated from the run's own `bounds_split` and written to
<output_dir>/hysac_bounds.json (default <workdir>/eval/<name>/), the file
`hyperbolic_vl.load(...).traverse_to_safe` and the exporter read. With
neither, only the figures without traversal are given.
"""

from __future__ import annotations

import os

import numpy as np

from hyperbolic_vl import files
from hyperbolic_vl.data import registry as data_registry
from hyperbolic_vl.evaluators import EvaluatorUnavailable, registry
from hyperbolic_vl.evaluators.metrics import safety

SETTINGS = dict(
  split="test",
  num_examples=None,
  bounds="",  # a hysac_bounds.json; "": estimated from bounds_split
  bounds_split="validation",  # "": no traversal unless `bounds` is given
  bounds_examples=None,
  alpha=safety.DEFAULT_ALPHA,
  output_dir="",
)
QUADRUPLET_KEYS = ("image", "tokens", "unsafe_image", "unsafe_tokens")


def quadruplet_split(run_input, tokenizer, split: str, num_examples) -> dict:
  """A quadruplet split of the source `run_input` (a run's `config.input`) names."""
  try:
    data = data_registry.load_eval_split(run_input, tokenizer, split, num_examples)
  except data_registry.NoEvalSplitError as error:
    raise EvaluatorUnavailable(str(error)) from None
  missing = [key for key in QUADRUPLET_KEYS if key not in data]
  if missing:
    raise EvaluatorUnavailable(
      f"the {split!r} split of source {run_input.data.name!r} has no {missing}: "
      "safety retrieval needs quadruplets (data=world_quadruplets or visu with images)"
    )
  return data


def embed(predictor, data) -> dict[str, np.ndarray]:
  """The four embeddings of a quadruplet split."""
  return {
    "image": predictor.encode_images(data["image"]),
    "text": predictor.encode_tokens(data["tokens"]),
    "unsafe_image": predictor.encode_images(data["unsafe_image"]),
    "unsafe_text": predictor.encode_tokens(data["unsafe_tokens"]),
  }


def table(figures: dict[str, float], ks=safety.RECALL_KS) -> str:
  """The release's table: one row per configuration, without and with
  traversal (R@k and the safety share in %)."""
  columns = [f"R@{k}" for k in ks] + ["safety"]
  header = f"  {'configuration':<22}" + "".join(f"{c:>9}" for c in columns)
  lines = ["Safety retrieval (%)", header]
  for name in safety.CONFIGURATIONS:
    for suffix, label in (("", name), ("/traversal", f"{name} + traversal")):
      if f"{name}{suffix}/safety" not in figures:
        continue
      values = "".join(f"{100 * figures[f'{name}{suffix}/{c}']:>9.1f}" for c in columns)
      lines.append(f"  {label:<22}{values}")
  return "\n".join(lines)


@registry.register(
  "safety_retrieval",
  settings=SETTINGS,
  description="HySAC's safety retrieval (R@1/10/20, safety share, with and without traversal)",
  # It ranks on the hyperboloid: build_all disables it at start-up for any other model.
  geometries=("lorentz",),
)
class SafetyRetrievalEvaluator:
  def __init__(self, name: str, settings, run_input, tokenizer=None):
    del name
    self.alpha = float(settings.alpha)
    self.data = quadruplet_split(run_input, tokenizer, settings.split, settings.num_examples)
    self.bounds = safety.read_bounds(settings.bounds) if settings.bounds else None
    self.bounds_data = None
    if self.bounds is None and settings.bounds_split:
      self.bounds_data = quadruplet_split(
        run_input, tokenizer, settings.bounds_split, settings.bounds_examples
      )
    self.output_dir = str(settings.output_dir or "")

  def __call__(self, predictor) -> dict[str, float]:
    curv = float(predictor.curv)
    bounds = self.bounds
    if bounds is None and self.bounds_data is not None:
      bounds = safety.estimate_bounds(embed(predictor, self.bounds_data), curv)
      if self.output_dir:
        os.makedirs(self.output_dir, exist_ok=True)
        files.write_file_atomically(
          os.path.join(self.output_dir, safety.BOUNDS_FILE), safety.bounds_json(bounds)
        )
    figures = safety.safety_figures(embed(predictor, self.data), curv, bounds, alpha=self.alpha)
    print(table(figures), flush=True)
    if bounds is not None:
      for letter, statistics in bounds.items():
        for statistic, value in statistics.items():
          figures[f"bounds/{letter}/{statistic}"] = value
    return {f"safety_retrieval/{key}": value for key, value in figures.items()}
