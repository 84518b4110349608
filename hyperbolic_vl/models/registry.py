"""Models by name: `config.model.name` -> the module the trainer builds.

Each builder takes the `config.model` section and the sizes the rest of the
run fixes (image size from `config.input`, vocabulary and context length from
the tokenizer) and returns an NNX module. A model family registers once, here
or from the user's own module:

    @models.registry.register("my_model")
    def build_my_model(model_config, *, image_size, vocab_size, context_length, rngs): ...
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from flax.nnx import traversals

from hyperbolic_vl import errors
from hyperbolic_vl.models import batch_norm, lora, two_towers

Builder = Callable[..., nnx.Module]
DEFAULT_MODEL = "two_towers"
_BUILDERS: dict[str, Builder] = {}


def register(name: str) -> Callable[[Builder], Builder]:
  """Decorator: `builder` makes the model `config.model.name == name`."""

  def add(builder: Builder) -> Builder:
    if name in _BUILDERS and _BUILDERS[name] is not builder:
      raise ValueError(f"model {name!r} is registered twice")
    _BUILDERS[name] = builder
    return builder

  return add


def names() -> list[str]:
  return sorted(_BUILDERS)


def model_name(model_config: Mapping[str, Any]) -> str:
  return str(dict(model_config).get("name", DEFAULT_MODEL) or DEFAULT_MODEL)


def build(
  model_config: Mapping[str, Any],
  *,
  image_size: int,
  vocab_size: int,
  context_length: int,
  rngs: nnx.Rngs,
) -> nnx.Module:
  """The module `config.model` names, with fresh parameters from `rngs`."""
  name = model_name(model_config)
  if name not in _BUILDERS:
    raise errors.ConfigError(f"model.name={name!r} is unknown; valid: {names()}")
  return _BUILDERS[name](
    dict(model_config),
    image_size=int(image_size),
    vocab_size=int(vocab_size),
    context_length=int(context_length),
    rngs=rngs,
  )


def build_for_run(run_config, *, vocab_size: int, context_length: int, seed: int) -> nnx.Module:
  """The model of a whole run config (image size from its input section)."""
  return build(
    run_config.model,
    image_size=int(run_config.input.image_size),
    vocab_size=vocab_size,
    context_length=context_length,
    rngs=nnx.Rngs(params=seed),
  )


def abstract_model(run_config, vocab_size: int | None = None, context_length: int | None = None):
  """The run's model with abstract (ShapeDtypeStruct) params: nothing allocated."""
  vocab = vocab_size or run_config.input.tokenizer.get("vocab_size", 49408)
  context = context_length or run_config.input.tokenizer.context_length
  return nnx.eval_shape(
    lambda: build_for_run(run_config, vocab_size=vocab, context_length=context, seed=0)
  )


@dataclasses.dataclass
class ModelDef:
  """An NNX module split into a static graph, a param template and the rest.

  Training works on `params`, a pure nested dict of arrays (what optax and
  Orbax see); `merge(params)` rebuilds the module inside traced functions.

  A model with batch norms (a ResNet tower) also has running statistics
  (`nnx.BatchStat`), kept apart from the params: the trainer carries them
  as `state["batch_stats"]` and merges with `merge(params, batch_stats)`.
  Their names never collide with the params' (`.../bn1/mean` beside
  `.../bn1/scale`), so the two may also travel as one dict, "variables"
  (`variables(params, batch_stats)`), which `merge` accepts alone: that is
  the form a `Predictor` holds. A model without batch norms has no
  statistics (`initial_batch_stats() == {}`) and merges exactly as before.
  """

  graphdef: Any
  param_template: Any
  rest: Any
  module: Any  # the concrete module, for static attributes (geometry, clamps)
  batch_stat_template: Any = None  # nnx.State of the running statistics

  @classmethod
  def from_module(cls, module) -> tuple[ModelDef, dict]:
    graphdef, param_state, stat_state, rest = nnx.split(module, nnx.Param, nnx.BatchStat, ...)
    params = nnx.to_pure_dict(param_state)
    return cls(graphdef, param_state, rest, module, stat_state), params

  @property
  def has_batch_stats(self) -> bool:
    return self.batch_stat_template is not None and bool(jax.tree.leaves(self.batch_stat_template))

  def initial_batch_stats(self) -> dict:
    """The freshly built module's running statistics; {} without batch norms.
    Copies: the train step donates its state, which would delete the
    template's own arrays (an abstract module's shapes are returned as they are)."""
    if not self.has_batch_stats:
      return {}
    copy = lambda x: jnp.array(x, copy=True) if isinstance(x, jax.Array) else x
    return jax.tree.map(copy, nnx.to_pure_dict(self.batch_stat_template))

  def _stat_paths(self) -> set[tuple]:
    return set(traversals.flatten_mapping(nnx.to_pure_dict(self.batch_stat_template)))

  def variables(self, params: dict, batch_stats: dict | None) -> dict:
    """params and running statistics as one nested dict (params alone for a
    model without batch norms)."""
    if not self.has_batch_stats:
      return params
    return _deep_union(params, batch_stats or {})

  def split_variables(self, variables: dict) -> tuple[dict, dict]:
    """(params, batch_stats) of a `variables` dict; batch_stats is {} when it
    holds none (or the model has none)."""
    if not self.has_batch_stats:
      return variables, {}
    stat_paths = self._stat_paths()
    flat = traversals.flatten_mapping(variables)
    params = {path: value for path, value in flat.items() if path not in stat_paths}
    stats = {path: value for path, value in flat.items() if path in stat_paths}
    unflatten = lambda tree: traversals.unflatten_mapping(tree) if tree else {}
    return unflatten(params), unflatten(stats)

  def merge(self, params: dict, batch_stats: dict | None = None):
    """The module with these params (and, with batch norms, running
    statistics: `batch_stats`, or inside `params` as `variables`), its
    batch norms in evaluation mode (`merge_for_training` for training)."""
    state = jax.tree.map(lambda x: x, self.param_template)
    if not self.has_batch_stats:
      nnx.replace_by_pure_dict(state, params)
      return nnx.merge(self.graphdef, state, self.rest)
    if batch_stats is None:
      params, batch_stats = self.split_variables(params)
    expected = self._stat_paths()
    given = set(traversals.flatten_mapping(batch_stats))
    if given != expected:
      missing = sorted("/".join(map(str, path)) for path in expected - given)
      raise ValueError(
        f"{type(self.module).__name__} has batch norms: merge needs their running "
        f"statistics (state['batch_stats']); missing {missing[:3]}"
        + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
      )
    nnx.replace_by_pure_dict(state, params)
    stats = jax.tree.map(lambda x: x, self.batch_stat_template)
    nnx.replace_by_pure_dict(stats, batch_stats)
    return nnx.merge(self.graphdef, state, stats, self.rest)

  def merge_for_training(self, params: dict, batch_stats: dict, axis_name: str | None):
    """The module with its batch norms in training mode: statistics of the
    global batch (averaged over `axis_name`), running ones updated in place;
    read them back with `batch_stats_of`."""
    module = self.merge(params, batch_stats)
    batch_norm.training_mode(module, axis_name)
    return module

  def batch_stats_of(self, module) -> dict:
    """The running statistics a merged module holds now ({} without batch norms)."""
    if not self.has_batch_stats:
      return {}
    return nnx.to_pure_dict(nnx.state(module, nnx.BatchStat))


def _deep_union(a: dict, b: dict) -> dict:
  out = dict(a)
  for key, value in b.items():
    if key in out and isinstance(out[key], dict) and isinstance(value, dict):
      out[key] = _deep_union(out[key], value)
    elif key in out:
      raise ValueError(f"a running statistic and a parameter share the name {key!r}")
    else:
      out[key] = value
  return out


def build_model_def(run_config, tokenizer, seed: int) -> tuple[ModelDef, dict]:
  """(ModelDef, fresh params) of a run config's model, sized by its tokenizer."""
  module = build_for_run(
    run_config,
    vocab_size=tokenizer.vocab_size,
    context_length=tokenizer.context_length,
    seed=seed,
  )
  return ModelDef.from_module(module)


@register("two_towers")
def _two_towers(model_config, *, learned_root: bool = False, **sizes):
  return two_towers.build_two_towers(model_config, learned_root=learned_root, **sizes)


@register("two_towers_with_root")
def _two_towers_with_root(model_config, **sizes):
  return _two_towers(model_config, learned_root=True, **sizes)


@register("hcl")
def _hcl(model_config, *, image_size, vocab_size, context_length, rngs):
  from hyperbolic_vl.models.hcl import HclModel  # pylint: disable=g-import-not-at-top

  del vocab_size, context_length  # image model only
  if lora.LoraSettings.from_model_config(model_config).enabled:
    raise errors.ConfigError("model.lora adapts two-tower models; model.name='hcl' has none")
  return HclModel(
    image_variant=model_config["image_variant"],
    image_size=image_size,
    embed_dim=model_config["embed_dim"],
    head_dim=model_config.get("head_dim", 2048),
    dtype=model_config.get("dtype", "float32"),
    image_remat=model_config.get("image_remat", "none"),
    rngs=rngs,
  )
