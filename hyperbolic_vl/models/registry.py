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
from flax import nnx

from hyperbolic_vl import errors
from hyperbolic_vl.models import two_towers

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
  tokenizer = run_config.input.tokenizer
  vocab = vocab_size or tokenizer.get("vocab_size", 49408)
  context = context_length or tokenizer.context_length
  return nnx.eval_shape(
    lambda: build_for_run(run_config, vocab_size=vocab, context_length=context, seed=0)
  )


@dataclasses.dataclass
class ModelDef:
  """An NNX module split into a static graph, a param template and the rest.

  Training works on `params`, a pure nested dict of arrays (what optax and
  Orbax see); `merge(params)` rebuilds the module inside traced functions.
  """

  graphdef: Any
  param_template: Any
  rest: Any
  module: Any  # the concrete module, for static attributes (geometry, clamps)

  @classmethod
  def from_module(cls, module) -> tuple[ModelDef, dict]:
    graphdef, param_state, rest = nnx.split(module, nnx.Param, ...)
    params = nnx.to_pure_dict(param_state)
    return cls(graphdef, param_state, rest, module), params

  def merge(self, params: dict):
    state = jax.tree.map(lambda x: x, self.param_template)
    nnx.replace_by_pure_dict(state, params)
    return nnx.merge(self.graphdef, state, self.rest)


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
  return HclModel(
    image_variant=model_config["image_variant"],
    image_size=image_size,
    embed_dim=model_config["embed_dim"],
    head_dim=model_config.get("head_dim", 2048),
    dtype=model_config.get("dtype", "float32"),
    rngs=rngs,
  )
