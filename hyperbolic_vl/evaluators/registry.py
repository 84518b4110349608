"""Evaluators chosen by config: `config.evals.<name> = {type, every_steps, ...}`.

A run's config lists named evaluators (big_vision's `config.evals`); `type`
picks the implementation below, the other keys are its settings. Every type
declares its settings and their defaults, so an unknown type or key fails
with the valid names. `every_steps` > 0 also runs it periodically during
training; every listed evaluator runs at the end of training and in
`python -m hyperbolic_vl.evaluate`.

An evaluator is built once, before step 1 (it loads or opens its data then,
so one that cannot run on this run's data says why at start-up), and is
called with a `predictor.Predictor` to return {figure name: value}.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable

import ml_collections

from hyperbolic_vl.evaluators import (
  EvaluatorUnavailable,
  atmg_analysis,
  benchmark_evaluators,
  hcl_eval,
  hierarchy_eval,
  world_eval,
)
from hyperbolic_vl.evaluators.settings import TYPE_SETTINGS, entry, valid_keys

# type -> builder: (name, settings, run_config, tokenizer) -> evaluator.
BUILDERS: dict[str, Callable] = {
  "world": world_eval.WorldEvaluator,
  "hierarchy": hierarchy_eval.HierarchyEvaluator,
  "atmg_analysis": atmg_analysis.AtmgAnalysisEvaluator,
  "hcl_world": hcl_eval.HclEvaluator,
  "zero_shot": benchmark_evaluators.ZeroShotEvaluator,
  "retrieval": benchmark_evaluators.RetrievalEvaluator,
  "linear_probe": benchmark_evaluators.LinearProbeEvaluator,
}
assert set(BUILDERS) == set(TYPE_SETTINGS)


def validate(name: str, settings) -> ml_collections.ConfigDict:
  """The settings of `config.evals.<name>` checked against its type."""
  settings = ml_collections.ConfigDict(dict(settings))
  type_name = settings.get("type", "")
  if type_name not in BUILDERS:
    raise ValueError(
      f"config.evals.{name}.type={type_name!r} is not an evaluator type; valid: {sorted(BUILDERS)}"
    )
  valid = valid_keys(type_name)
  unknown = set(settings.keys()) - valid
  if unknown:
    raise ValueError(
      f"config.evals.{name}: unknown setting(s) {sorted(unknown)} for type {type_name!r}; "
      f"valid: {sorted(valid)}"
    )
  complete = entry(type_name)
  complete.update(settings)
  return complete


@dataclasses.dataclass
class NamedEvaluator:
  name: str
  every_steps: int
  evaluate: Callable  # predictor -> {figure: value}


def build_all(
  run_config, tokenizer, only: tuple[str, ...] = (), workdir: str | None = None
) -> list[NamedEvaluator]:
  """Builds the run's evaluators. A bad name, type or key raises; one that
  cannot run on this data (missing dataset, wrong source) is left out with
  one printed line saying which and why, and the others still run.

  Types that write files (an `output_dir` setting) write, when it is unset,
  to <workdir>/eval/<name>; without a workdir they write nothing."""
  evals = run_config.get("evals", None) or {}
  names = list(evals.keys())
  for name in only:
    if name not in evals:
      raise ValueError(f"no evaluator {name!r} in config.evals; valid: {names}")
  built = []
  for name in only or names:
    settings = validate(name, evals[name])
    if "output_dir" in settings and not settings.output_dir and workdir:
      settings.output_dir = os.path.join(workdir, "eval", name)
    try:
      evaluate = BUILDERS[settings.type](name, settings, run_config, tokenizer)
    except (EvaluatorUnavailable, OSError) as error:  # data it needs is absent
      print(f"Evaluator {name!r} ({settings.type}) disabled: {error}", flush=True)
      continue
    built.append(NamedEvaluator(name, int(settings.every_steps), evaluate))
  return built


def run_all(evaluators: list[NamedEvaluator], predictor, step: int | None = None) -> dict:
  """Runs each evaluator; one that fails is reported and skipped (evaluation
  never ends a training run)."""
  figures = {}
  for evaluator in evaluators:
    if step is not None and not (evaluator.every_steps and step % evaluator.every_steps == 0):
      continue
    try:
      figures.update(evaluator.evaluate(predictor))
    except Exception as error:  # reported, then the others and training go on
      print(f"Evaluator {evaluator.name!r} failed: {type(error).__name__}: {error}", flush=True)
  return figures


def as_logged(figures: dict) -> dict:
  """Figure names as training writes them to metrics.jsonl: under eval/."""
  return {k if k.startswith("eval/") else f"eval/{k}": v for k, v in figures.items()}
