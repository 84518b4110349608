"""Evaluators chosen by config: `config.evals.<name> = {type, every_steps, ...}`.

A run's config lists named evaluators (big_vision's `config.evals`); `type`
picks an evaluator type, the other keys are its settings. Every type
registers once, in its own module, with its settings and their defaults:

  @registry.register("my_type", settings=dict(split="test", num_examples=None))
  class MyEvaluator:
    def __init__(self, name, settings, run_input, tokenizer): ...   # loads its data
    def __call__(self, predictor) -> dict[str, float]: ...

An evaluator sees no more of the run than it needs: its own settings, the
run's `config.input` section (`run_input`: the data source, `image_size`, the
tokenizer settings; a frozen copy, so nothing it does changes the run's
config) and the tokenizer; the model and its objective reach it only as the
`predictor` it is called with (`predictor.objective`, `predictor.geometry`,
`predictor.curv`). A type that cannot run on some model geometries declares
the ones it can, `register(..., geometries=("lorentz",))`: `build_all`
checks `config.model.geometry` (default "lorentz") against them and reports
the evaluator disabled, without building it, for any other.

The built-in types live in the modules of this folder (one module per type,
named by it), imported on first lookup, so a new module is found without
editing anything; any other module registers a
type by calling `register` (nothing here is edited) and is then used as
`config.evals.x = registry.entry("my_type", split="validation")`. An unknown
type or key fails with the valid names.

Every type also has the settings of `COMMON_SETTINGS`: `every_steps` > 0 runs
it periodically during training; every listed evaluator runs at the end of
training and in `python -m hyperbolic_vl.evaluate`.

An evaluator is built once, before step 1 (it loads or opens its data then,
so one that cannot run on this run's data says why at start-up, by raising
`EvaluatorUnavailable`), and is called with a `predictor.Predictor` to return
{figure name: value}.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
from collections.abc import Callable, Mapping
from typing import Any

import ml_collections

from hyperbolic_vl import errors
from hyperbolic_vl.evaluators import EvaluatorUnavailable
from hyperbolic_vl.package_modules import package_modules

# One module per built-in type, named by the type; imported when first needed
# so a type whose optional dependencies are missing never breaks the others.

# Settings every type has, with their defaults.
COMMON_SETTINGS: dict[str, Any] = {"type": "", "every_steps": 0, "batch_size": 256}


@dataclasses.dataclass(frozen=True)
class EvaluatorType:
  """A registered type: `build(name, settings, run_input, tokenizer)`
  returns the evaluator, a callable predictor -> {figure: value}."""

  name: str
  build: Callable
  settings: Mapping[str, Any]  # the type's own settings (beyond COMMON_SETTINGS), with defaults
  description: str = ""
  geometries: tuple[str, ...] = ()  # the model geometries it runs on; (): any

  def check_geometry(self, geometry: str) -> None:
    """EvaluatorUnavailable unless the type runs on a model of `geometry`."""
    if self.geometries and geometry not in self.geometries:
      raise EvaluatorUnavailable(
        f"evaluator type {self.name!r} runs on model.geometry in {list(self.geometries)}; "
        f"this run's is {geometry!r}"
      )

  def defaults(self) -> dict[str, Any]:
    """Every valid key with its default."""
    return dict(COMMON_SETTINGS, **self.settings, type=self.name)


_TYPES: dict[str, EvaluatorType] = {}
_BROKEN: dict[str, ImportError] = {}  # built-in type -> why its module did not import


def register(
  type_name: str,
  *,
  settings: Mapping[str, Any] = (),
  description: str = "",
  geometries: tuple[str, ...] = (),
):
  """Class/function decorator registering an evaluator type under `type_name`.

  settings: the type's own settings with their defaults (`None` for an
  optional int). geometries: the model geometries (`config.model.geometry`)
  it can evaluate, () for any. Registering a name twice is an error, unless
  it is the same builder again (a module imported twice, e.g. by pytest).
  """
  settings = dict(settings)
  if isinstance(geometries, str):  # ("lorentz") is a string, not a 1-tuple
    geometries = (geometries,)
  geometries = tuple(geometries)
  clash = sorted(set(settings) & set(COMMON_SETTINGS))
  if clash:
    raise ValueError(f"evaluator type {type_name!r}: settings {clash} are common to every type")

  def decorate(build: Callable) -> Callable:
    known = _TYPES.get(type_name)
    if known is not None and _qualified(known.build) != _qualified(build):
      raise ValueError(
        f"evaluator type {type_name!r} is already registered by {_qualified(known.build)}"
      )
    _TYPES[type_name] = EvaluatorType(type_name, build, settings, description, geometries)
    return build

  return decorate


def _qualified(build: Callable) -> str:
  return f"{getattr(build, '__module__', '?')}.{getattr(build, '__qualname__', repr(build))}"


def _import_builtins(type_name: str | None = None) -> None:
  """Imports the built-in module of `type_name`, or all of them for None."""
  for module in package_modules("hyperbolic_vl.evaluators"):
    builtin = module.rpartition(".")[2]
    if (type_name is not None and builtin != type_name) or builtin in _TYPES:
      continue
    try:
      importlib.import_module(module)
    except ImportError as error:
      _BROKEN[builtin] = error


def names() -> list[str]:
  """Every evaluator type: the built-in ones and those registered since."""
  _import_builtins()
  return sorted(set(_TYPES) | set(_BROKEN))


def get(type_name: str) -> EvaluatorType:
  """The registered type; ValueError listing the valid names when unknown,
  EvaluatorUnavailable when its module's dependencies are missing."""
  if type_name not in _TYPES:
    _import_builtins(type_name)
  if type_name in _BROKEN:
    raise EvaluatorUnavailable(
      f"evaluator type {type_name!r} cannot be imported: {_BROKEN[type_name]}"
    )
  if type_name not in _TYPES:
    raise errors.ConfigError(f"unknown evaluator type {type_name!r}; valid: {names()}")
  return _TYPES[type_name]


def _as_config(values: Mapping[str, Any]) -> ml_collections.ConfigDict:
  config = ml_collections.ConfigDict()
  for key, value in values.items():
    # None defaults become typed placeholders so "--config.evals.x.num_examples=64" parses.
    config[key] = ml_collections.config_dict.placeholder(int) if value is None else value
  return config


def entry(type_name: str, **settings) -> ml_collections.ConfigDict:
  """A complete `config.evals.<name>` entry: every valid key with its default
  (so each can be overridden from the command line), updated by `settings`."""
  values = get(type_name).defaults()
  unknown = set(settings) - set(values)
  if unknown:
    raise errors.ConfigError(
      f"unknown setting(s) {sorted(unknown)} for evaluator type {type_name!r}; "
      f"valid: {sorted(values)}"
    )
  values.update(settings)
  return _as_config(values)


def validate(name: str, settings) -> ml_collections.ConfigDict:
  """The settings of `config.evals.<name>` checked against its type, with
  the defaults of the keys it leaves out."""
  settings = ml_collections.ConfigDict(dict(settings))
  type_name = settings.get("type", "")
  try:
    evaluator_type = get(type_name)
  except ValueError:
    raise errors.ConfigError(
      f"config.evals.{name}.type={type_name!r} is not an evaluator type; valid: {names()}"
    ) from None
  defaults = evaluator_type.defaults()
  unknown = set(settings.keys()) - set(defaults)
  if unknown:
    raise errors.ConfigError(
      f"config.evals.{name}: unknown setting(s) {sorted(unknown)} for type {type_name!r}; "
      f"valid: {sorted(defaults)}"
    )
  complete = _as_config(defaults)
  complete.update(settings)
  return complete


@dataclasses.dataclass
class NamedEvaluator:
  name: str
  every_steps: int
  evaluate: Callable  # predictor -> {figure: value}


def run_input_of(run_config) -> ml_collections.FrozenConfigDict:
  """The run's `config.input`, frozen: what an evaluator is built from."""
  return ml_collections.FrozenConfigDict(run_config.get("input", None) or {})


def build_all(
  run_config,
  tokenizer,
  only: tuple[str, ...] = (),
  workdir: str | None = None,
  refusals: dict[str, str] | None = None,
) -> list[NamedEvaluator]:
  """Builds the run's evaluators. A bad name, type or key raises; one that
  cannot run on this data (a missing or malformed dataset, a wrong source)
  or on this model's geometry is left out with one printed line saying
  which and why, and the others still run. `refusals`, when given,
  receives {name: that reason}.

  The one reader of the whole `run_config`: each evaluator is built from its
  `config.evals` entry and `config.input` alone.

  Types that write files (an `output_dir` setting) write, when it is unset,
  to <workdir>/eval/<name>; without a workdir they write nothing."""
  evals = run_config.get("evals", None) or {}
  run_input = run_input_of(run_config)
  geometry = str((run_config.get("model", None) or {}).get("geometry", "lorentz"))
  listed = list(evals.keys())
  for name in only:
    if name not in evals:
      raise errors.ConfigError(f"no evaluator {name!r} in config.evals; valid: {listed}")
  built = []
  for name in only or listed:
    type_name = dict(evals[name]).get("type", "")
    try:
      settings = validate(name, evals[name])
      if "output_dir" in settings and not settings.output_dir and workdir:
        settings.output_dir = os.path.join(workdir, "eval", name)
      evaluator_type = get(settings.type)
      evaluator_type.check_geometry(geometry)
      evaluate = evaluator_type.build(name, settings, run_input, tokenizer)
    # Its data or geometry is absent, or its data file is not what it reads.
    except (EvaluatorUnavailable, errors.DataError, OSError) as error:
      print(f"Evaluator {name!r} ({type_name}) disabled: {error}", flush=True)
      if refusals is not None:
        refusals[name] = str(error)
      continue
    built.append(NamedEvaluator(name, int(settings.every_steps), evaluate))
  return built


def run_all(
  evaluators: list[NamedEvaluator],
  predictor,
  step: int | None = None,
  refusals: dict[str, str] | None = None,
) -> dict:
  """Runs each evaluator; one that refuses this model (EvaluatorUnavailable,
  e.g. a geometry it does not define its figures for) or fails is reported
  in one line and skipped (evaluation never ends a training run).
  `refusals`, when given, receives {name: that line's reason}."""
  figures = {}
  for evaluator in evaluators:
    if step is not None and not (evaluator.every_steps and step % evaluator.every_steps == 0):
      continue
    try:
      figures.update(evaluator.evaluate(predictor))
    except EvaluatorUnavailable as error:
      reason = str(error)
      print(f"Evaluator {evaluator.name!r} refused: {reason}", flush=True)
    except Exception as error:  # reported, then the others and training go on
      reason = f"failed: {type(error).__name__}: {error}"
      print(f"Evaluator {evaluator.name!r} {reason}", flush=True)
    else:
      continue
    if refusals is not None:
      refusals[evaluator.name] = reason
  return figures


def as_logged(figures: dict) -> dict:
  """Figure names as training writes them to metrics.jsonl: under eval/."""
  return {k if k.startswith("eval/") else f"eval/{k}": v for k, v in figures.items()}


def format_results(results: dict, title: str = "Evaluation") -> str:
  """One figure per line, sorted by name, under `title`."""
  lines = [title]
  width = max(len(k) for k in results)
  for key in sorted(results):
    lines.append(f"  {key:<{width}}  {results[key]:.4f}")
  return "\n".join(lines)
