"""Data sources by name (`input.data.name`): the trainer's and evaluators' only
door to data.

A source is a `DataSource` subclass that registers itself once, in the module
that defines it, with `@register`. It declares

  name        its `input.data.name`
  Settings    a frozen `SourceSettings` dataclass: every key its `input.data`
              section may hold, with defaults (`section` builds configs from it)
  batch_keys  the keys of its training batches (how many images and token
              rows each key holds per row: `row_inputs`, from the settings'
              `slots`)

and implements `train_iterator` (and `eval_split` when it has an evaluation
split, `num_train_examples` when a run may be sized in epochs). Every module of this folder is imported on the first lookup (a new
source module is found without editing anything), and a source whose
optional dependency is missing never breaks the others. A user's module registers a new source by calling
`register` itself; nothing in the package needs editing.

  make_train_iterator(input_config, tokenizer, *, seed, process_index, process_count)
      a checkpointable grain iterator over this process's slice of batches
  load_eval_split(input_config, tokenizer, split, num_examples)
      a whole evaluation split in memory; NoEvalSplitError if the source has none
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Mapping
from typing import Any, ClassVar

import ml_collections
from ml_collections import config_dict

from hyperbolic_vl import errors
from hyperbolic_vl.data.settings import InputSettings, SourceSettings
from hyperbolic_vl.package_modules import package_modules

# Batch keys holding uint8 (image_size, image_size, 3) images; keys ending in
# "tokens" hold token rows.
IMAGE_KEYS = frozenset({"image", "box_image", "unsafe_image", "view1", "view2", "scene", "object"})


@dataclasses.dataclass(frozen=True)
class RowInput:
  """The inputs one batch key holds in each row of a training batch."""

  key: str
  kind: str  # "image" (uint8, image_size x image_size x 3) or "text" (one token row)
  count: int  # per batch row
  setting: str = ""  # the input.data setting `count` follows ("" when fixed)


class NoEvalSplitError(ValueError):
  """The source has no evaluation split (e.g. text-only training tiers)."""


class DataSource:
  """One kind of training data. Subclasses set the class attributes and
  implement `train_iterator`; `eval_split` is optional."""

  name: ClassVar[str] = ""
  Settings: ClassVar[type[SourceSettings]] = SourceSettings
  batch_keys: ClassVar[tuple[str, ...]] = ()
  # The source whose evaluation split load_eval_split gives (e.g. "world" for
  # every source built on the synthetic world); "" when there is none.
  eval_source: ClassVar[str] = ""

  def train_iterator(
    self,
    input_settings: InputSettings,
    settings: SourceSettings,
    tokenizer,
    *,
    seed: int,
    process_index: int,
    process_count: int,
  ):
    """A grain DatasetIterator of this process's slice of training batches.
    `tokenizer` may be None: `input_settings.resolve_tokenizer` builds it."""
    raise NotImplementedError

  def row_inputs(self, settings: SourceSettings) -> tuple[RowInput, ...]:
    """Every image and token row one row of this source's training batches
    carries (box slots, crops, caption tiers, unsafe counterparts): what the
    memory preflight counts before anything is built. From `batch_keys` and
    the settings' `slots`."""
    found = []
    for key in self.batch_keys:
      kind = "image" if key in IMAGE_KEYS else "text" if key.endswith("tokens") else ""
      count, setting = settings.slots(key)
      if kind and count:
        found.append(RowInput(key, kind, count, setting))
    return tuple(found)

  def eval_split(
    self,
    input_settings: InputSettings,
    settings: SourceSettings,
    tokenizer,
    split: str,
    num_examples: int | None,
  ) -> dict[str, Any]:
    del input_settings, settings, tokenizer, split, num_examples
    raise NoEvalSplitError(f"data source {self.name!r} has no evaluation split")

  def num_train_examples(self, settings: SourceSettings) -> int:
    """Rows in one pass over the training data (what `config.epochs`
    counts, data/run_length.py)."""
    del settings
    raise errors.ConfigError(
      f"data source {self.name!r} cannot count its training rows: set total_steps > 0 "
      "instead of epochs"
    )


_SOURCES: dict[str, DataSource] = {}
_BUILTINS_LOADED = False
_IMPORT_FAILURES: dict[str, str] = {}


def register(source):
  """Registers a DataSource subclass (or instance) under its `name`; usable as
  a class decorator. Returns its argument."""
  instance = source() if isinstance(source, type) else source
  if not isinstance(instance, DataSource):
    raise TypeError(f"{source!r} is not a DataSource")
  name = instance.name
  if not name:
    raise ValueError(f"{source!r} has no name")
  if instance.Settings.source != name:
    raise ValueError(
      f"data source {name!r} declares settings {instance.Settings.__name__} of source "
      f"{instance.Settings.source!r}"
    )
  previous = _SOURCES.get(name)
  identity = lambda value: (type(value).__module__, type(value).__qualname__)
  # The same class registering again (its module re-imported) is no clash.
  if previous is not None and identity(previous) != identity(instance):
    raise ValueError(f"data source {name!r} is already registered ({type(previous).__name__})")
  _SOURCES[name] = instance
  return source


def _load_builtins() -> None:
  global _BUILTINS_LOADED
  if _BUILTINS_LOADED:
    return
  _BUILTINS_LOADED = True
  for module in package_modules("hyperbolic_vl.data"):
    try:
      importlib.import_module(module)
    except ImportError as error:
      _IMPORT_FAILURES[module] = f"{type(error).__name__}: {error}"


def names() -> list[str]:
  """Every registered source name, sorted."""
  _load_builtins()
  return sorted(_SOURCES)


def get(name: str) -> DataSource:
  _load_builtins()
  if name not in _SOURCES:
    failed = (
      f" (modules that failed to import: {sorted(_IMPORT_FAILURES)})" if _IMPORT_FAILURES else ""
    )
    raise errors.ConfigError(f"unknown input.data.name {name!r}; valid: {names()}{failed}")
  return _SOURCES[name]


def settings_class(name: str) -> type[SourceSettings]:
  return get(name).Settings


def read_config(input_config: Mapping[str, Any]) -> tuple[DataSource, InputSettings, Any]:
  """(source, input settings, source settings) of `config.input`."""
  input_settings = InputSettings.from_config(input_config)
  name = _plain(input_settings.data).get("name")
  if not name:
    raise errors.ConfigError("input.data.name is required")
  source = get(name)
  return source, input_settings, source.Settings.from_config(input_settings.data)


def _plain(value: Any) -> dict:
  return value.to_dict() if isinstance(value, ml_collections.ConfigDict) else dict(value)


def make_train_iterator(
  input_config: Mapping[str, Any],
  tokenizer,
  *,
  seed: int,
  process_index: int | None = None,
  process_count: int | None = None,
):
  """A checkpointable grain iterator over this process's slice of training
  batches (`get_state()` / `set_state()` resume exactly).

  Args:
    input_config: `config.input` (dict or ConfigDict): batch_size (global),
      image_size, tokenizer, num_threads, prefetch_batches, num_workers,
      max_bad_fraction, data = {name, ...that source's settings}.
    tokenizer: object with `encode`; built from input_config.tokenizer if None.
    seed: shuffling and augmentation seed.
    process_index: this process (default `jax.process_index()`).
    process_count: number of processes (default `jax.process_count()`).
  """
  if process_index is None or process_count is None:
    import jax  # pylint: disable=g-import-not-at-top  (only for the defaults)

    process_index = jax.process_index() if process_index is None else process_index
    process_count = jax.process_count() if process_count is None else process_count
  source, input_settings, settings = read_config(input_config)
  return source.train_iterator(
    input_settings,
    settings,
    tokenizer,
    seed=seed,
    process_index=process_index,
    process_count=process_count,
  )


def load_eval_split(
  input_config: Mapping[str, Any],
  tokenizer=None,
  split: str = "test",
  num_examples: int | None = None,
) -> dict[str, Any]:
  """A whole evaluation split in memory, deterministic, un-augmented; raises
  NoEvalSplitError for a source without one. `num_examples` defaults to the
  source's `num_eval` (else the whole split)."""
  source, input_settings, settings = read_config(input_config)
  return source.eval_split(input_settings, settings, tokenizer, split, num_examples)


def section(name: str, **overrides) -> ml_collections.ConfigDict:
  """A complete `config.input.data` section: `name` plus every setting of the
  source with its default (so each can be overridden from the command line),
  updated by `overrides` (checked like a config)."""
  cls = settings_class(name)
  cls.from_config(overrides)  # fails on unknown keys and bad values
  values: dict[str, Any] = {"name": name}
  for field in dataclasses.fields(cls):
    value = overrides.get(field.name, getattr(cls(), field.name))
    if value is None:
      value = config_dict.placeholder(cls.placeholder_type(field.name))
    values[field.name] = value
  return ml_collections.ConfigDict(values)
