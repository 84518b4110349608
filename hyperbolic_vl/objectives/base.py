"""The one small interface every objective implements, plus shared pieces.

The training step (`hyperbolic_vl.training.train`) runs `Objective.loss` inside
`jax.shard_map` over the `data` mesh axis. `loss` sees the LOCAL slice of the
global batch and returns the mean loss over its local rows; the step averages
that over devices with `pmean`, which equals the global-batch mean because
every device holds the same number of rows. Cross-device interactions go
through `gather_columns` (a differentiable `all_gather`: its transpose is a
reduce-scatter, so gradients reach the device that produced each column).

With `axis_name=None` the same code runs on one device without shard_map,
which is how tests build float64 and single-device references.

The contract. An objective is pure computation: it never builds a model (the
model registry does, from `config.model.name`), never builds an iterator (the
data registry does, from `config.input.data.name`), writes no file and holds
no state that depends on the order of calls. What it needs beyond its own
settings arrives as arguments: the model and its params, `aux` (its
non-trainable state, checkpointed with the run) and a frozen `RunContext`.
Every hook the runtime calls is declared on `Objective` below with a default,
so the runtime never asks whether an objective has a method.

Image token dropping (`model.image_token_drop`, models/token_drop.py) is the
same for every objective, so no objective implements it: every subclass's
`loss` is wrapped once, at class creation (`Objective.__init_subclass__`),
to put the merged model in dropping mode for that step before the loss runs,
and `init_aux` to add the step counter of a final unmasked phase.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import optax

from hyperbolic_vl import errors
from hyperbolic_vl.models import token_drop, two_towers
from hyperbolic_vl.objectives import settings as settings_lib

Metrics = dict[str, jax.Array]


def gather_columns(x: jax.Array, axis_name: str | None) -> jax.Array:
  """(b, ...) local rows -> (B, ...) rows of every device, in device order."""
  if axis_name is None:
    return x
  return jax.lax.all_gather(x, axis_name, axis=0, tiled=True)


def local_targets(local_batch: int, axis_name: str | None) -> jax.Array:
  """Column index of each local row's positive in the gathered (b, B) logits."""
  offset = 0 if axis_name is None else jax.lax.axis_index(axis_name) * local_batch
  return jnp.arange(local_batch) + offset


def cross_entropy(logits: jax.Array, targets: jax.Array) -> jax.Array:
  """Mean softmax cross-entropy of (b, B) logits against integer targets (b,)."""
  return optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()


def symmetric_contrastive(
  logits_image_to_text: jax.Array, logits_text_to_image: jax.Array, axis_name: str | None
) -> jax.Array:
  """CLIP/MERU N-pair loss on local rows against global columns.

  logits_image_to_text: (b, B) local images vs all texts;
  logits_text_to_image: (b, B) local texts vs all images.
  """
  targets = local_targets(logits_image_to_text.shape[0], axis_name)
  return 0.5 * (
    cross_entropy(logits_image_to_text, targets) + cross_entropy(logits_text_to_image, targets)
  )


@dataclasses.dataclass(frozen=True)
class Teacher:
  """A frozen model of another run: static graph, params and that run's config."""

  model_def: Any  # checkpointing.ModelDef
  params: dict
  config: Any = None  # the teacher run's config (None for a random teacher)


@dataclasses.dataclass(frozen=True)
class TeacherRequest:
  """What an objective asks the trainer to restore before `init_aux`."""

  workdir: str = ""  # another run of this codebase
  # Without a workdir: a randomly initialised two-tower teacher of this
  # `config.model`-like size (benchmarks only), or None to refuse.
  random_model: Mapping[str, Any] | None = None


@dataclasses.dataclass(frozen=True)
class RunContext:
  """What the run hands an objective at `init_aux` and `loss` time.

  Built once by the trainer (and by `hyperbolic_vl.load` for inference) and
  never changed; the default is an empty context, as for unit tests.
  """

  tokenizer: Any = None  # .encode(list[str]) -> (n, L) int32 token rows
  input_config: Mapping[str, Any] | None = None  # config.input
  total_steps: int = 0
  teacher: Teacher | None = None  # what `teacher_request` asked for
  # One fixed-seed training batch of this run's data source (statistics at
  # init, e.g. Radial's mean root); None where the trainer has no data.
  sample_batch: Callable[[], Mapping[str, Any]] | None = None


EMPTY_CONTEXT = RunContext()


def _loss_with_token_drop(loss: Callable) -> Callable:
  """An objective's `loss` that first puts a token-dropping model in dropping
  mode (rng=None, as in unit tests calling `loss` directly, never drops).
  With a final unmasked phase the step counter `token_drop.STEP_KEY` rides
  in aux: taken out before the objective sees aux, put back one higher."""

  @functools.wraps(loss)
  def wrapped(self, model, aux, batch, *, rng, axis_name, context=EMPTY_CONTEXT):
    if (
      rng is None
      or not token_drop.is_enabled(model)
      or getattr(model, "token_drop_key", None) is not None  # an inner super().loss
    ):
      return loss(self, model, aux, batch, rng=rng, axis_name=axis_name, context=context)
    step = None
    if token_drop.has_final_phase(model) and token_drop.STEP_KEY in aux:
      aux = dict(aux)
      step = aux.pop(token_drop.STEP_KEY)
    token_drop.training_mode(model, rng, batch, step)
    value, (metrics, new_aux) = loss(
      self, model, aux, batch, rng=rng, axis_name=axis_name, context=context
    )
    if step is not None:
      new_aux = {**new_aux, token_drop.STEP_KEY: step + 1}
    return value, (metrics, new_aux)

  wrapped.wraps_token_drop = True
  return wrapped


def _init_aux_with_token_drop(init_aux: Callable) -> Callable:
  """`init_aux` plus the step counter of a final unmasked phase, when set."""

  @functools.wraps(init_aux)
  def wrapped(self, model, params, rng, context=EMPTY_CONTEXT):
    aux = init_aux(self, model, params, rng, context)
    if token_drop.has_final_phase(model):
      aux = {**aux, token_drop.STEP_KEY: jnp.zeros((), jnp.int32)}
    return aux

  wrapped.wraps_token_drop = True
  return wrapped


class Objective:
  """Base class. Subclasses set `name`, `geometry` and `Settings`, implement
  `loss` and `score`, and register with `@objectives.registry.register`.

  Hooks with defaults (the whole contract; the runtime calls each of them):
    check_model_config  refuses a `config.model` the loss cannot use
    check_input_config  refuses a `config.input` the loss cannot use
    teacher_request     another run to restore before init_aux (HMID-Net)
    init_aux            non-trainable state carried in the train state and
                        the checkpoint but never given to the optimizer
                        (frozen teachers, momentum encoders, queues)
    trainable           which parameters the optimizer updates (others get
                        no optimizer state at all)
    fresh_params        params that keep their init under `config.init_from`
    project_params      projection after every optimizer update
    score / score_text_to_image   similarity for retrieval and zero-shot
    class_embedding     prompt ensembling for zero-shot classifiers
    root_embedding      the hierarchy root for Euclidean models (Radial)
    inference_aux_template  aux entries inference restores with the params
    scalar_metrics      learned scalars logged with every loss
    tower_inputs        (class attribute) the batch keys each tower reads per row
                        (and frozen_tower_inputs, inputs_per_row; batch_inputs)

  Hyperparameters are parsed once, from `config.objective`, into
  `self.settings` (a frozen `Settings` dataclass, where every default lives).
  """

  name = "base"
  # "lorentz", "euclidean", "poincare", or None for a loss of either kind.
  geometry: str | None = "lorentz"
  # Whether the loss and score take a product of Lorentz spaces
  # (`model.factor_dim` > 0, a (K,) curvature vector); those that do not
  # refuse such a model in check_model_config.
  product_geometry: ClassVar[bool] = False
  # (batch key, tower) of every per-row input a training step sends through
  # a tower ("image" or "text"): what step_throughput synthesises and counts
  # model FLOPs of.
  tower_inputs: ClassVar[tuple[tuple[str, str], ...]] = (("image", "image"), ("tokens", "text"))
  # (batch key, tower) of the inputs a frozen copy of a tower reads, forward
  # only (HCL's momentum key encoder, Radial's reference model): synthesised
  # too, and counted as one forward pass in the model FLOPs.
  frozen_tower_inputs: ClassVar[tuple[tuple[str, str], ...]] = ()
  # Batch keys whose rows hold several tower inputs each (Radial's caption
  # tiers); box slots come from the data source (`input.data.max_boxes`).
  inputs_per_row: ClassVar[Mapping[str, int]] = {}
  Settings: ClassVar[type[settings_lib.ObjectiveSettings]] = settings_lib.ObjectiveSettings

  def __init__(self, config: Mapping[str, Any] | None = None):
    self.settings = self.Settings.from_config(config)

  def __init_subclass__(cls, **kwargs):
    super().__init_subclass__(**kwargs)
    # Token dropping for every objective (see the module docstring): each
    # class's `loss` and `init_aux` wrapped once, wherever in its bases they
    # come from (a hooks mixin such as EntailmentWeightHooks is no Objective,
    # so its methods were never wrapped at its own definition).
    for name, wrap in (("loss", _loss_with_token_drop), ("init_aux", _init_aux_with_token_drop)):
      method = getattr(cls, name, None)
      if method is not None and not getattr(method, "wraps_token_drop", False):
        setattr(cls, name, wrap(method))

  def batch_inputs(self) -> tuple[tuple[str, str], ...]:
    """Every (batch key, tower) a training step reads, trained or frozen,
    each once: what a synthetic batch must hold."""
    return tuple(dict.fromkeys((*self.tower_inputs, *self.frozen_tower_inputs)))

  # -- set-up -----------------------------------------------------------------
  def check_model_config(self, model_config: Mapping[str, Any]) -> None:
    """Raises ValueError when `config.model` cannot serve this objective."""
    geometry = dict(model_config).get("geometry", self.geometry)
    if self.geometry is not None and geometry != self.geometry:
      raise errors.ConfigError(
        f"objective {self.name!r} needs model.geometry={self.geometry!r}, got {geometry!r}"
      )
    self.refuse_product_geometry(model_config)

  def check_input_config(self, input_config: Mapping[str, Any]) -> None:
    """Raises ConfigError when `config.input` cannot feed this objective's
    loss (UNCHA: no box slots); read before any batch is built."""
    del input_config

  def refuse_product_geometry(self, model_config: Mapping[str, Any]) -> None:
    """ValueError when `model.factor_dim` asks for a product of Lorentz
    spaces and this objective works in one space."""
    factor_dim = dict(model_config).get("factor_dim", 0) or 0
    if factor_dim and not self.product_geometry:
      raise ValueError(
        f"objective {self.name!r} works in one Lorentz space; model.factor_dim={factor_dim} "
        "makes a product of spaces (set model.factor_dim=0, or use objective 'phyclip')"
      )

  def teacher_request(self) -> TeacherRequest | None:
    """Another run's model this objective distils from; None: no teacher."""
    return None

  def init_aux(self, model, params: dict, rng: jax.Array, context: RunContext = EMPTY_CONTEXT):
    del model, params, rng, context
    return {}

  def fresh_params(self) -> tuple[str, ...]:
    """Top-level params this objective adds to the run it initialises from
    (`config.init_from`); they keep their fresh init."""
    return ()

  def trainable(self, path: tuple[str, ...]) -> bool:
    del path
    return True

  def project_params(self, params: dict, model) -> dict:
    """Projection applied after every optimizer update (parameter clamps)."""
    return two_towers.project_learned_scalars(params, model)

  # -- the loss -----------------------------------------------------------------
  def loss(
    self,
    model,
    aux: dict,
    batch: Mapping[str, jax.Array],
    *,
    rng: jax.Array,
    axis_name: str | None,
    context: RunContext = EMPTY_CONTEXT,
  ) -> tuple[jax.Array, tuple[Metrics, dict]]:
    """Returns (mean loss over local rows, (metrics, new_aux))."""
    raise NotImplementedError

  # -- evaluation -------------------------------------------------------------
  def inference_aux_template(self, model) -> dict | None:
    """aux entries inference needs beyond the params, as {name:
    ShapeDtypeStruct} (restored from a run's checkpoint by
    hyperbolic_vl.load); None when the params suffice."""
    del model
    return None

  def root_embedding(self, model, aux: Mapping[str, Any] | None) -> jax.Array | None:
    """(D,) hierarchy root of a Euclidean model's embeddings; None: the
    space's own origin (Lorentz models, or no root at all)."""
    del model, aux
    return None

  def score(self, model, image_emb: jax.Array, text_emb: jax.Array) -> jax.Array:
    raise NotImplementedError

  def score_text_to_image(self, model, image_emb: jax.Array, text_emb: jax.Array) -> jax.Array:
    """(N images, M texts) scores for ranking images per text; default `score`.

    Objectives whose released evaluation ranks the two directions by
    different functions (ATMG) override it.
    """
    return self.score(model, image_emb, text_emb)

  def class_embedding(self, model, prompt_tangents: jax.Array) -> jax.Array:
    """(C, P, D) tangent features of P prompts per class -> (C, D) embeddings.

    Default (MERU): average in the tangent space, then lift; Euclidean
    objectives override to normalise before and after averaging (CLIP).
    """
    return model.lift(prompt_tangents.mean(axis=1))

  def scalar_metrics(self, model) -> Metrics:
    metrics = {"logit_scale": model.logit_scale()}
    if getattr(model, "has_logit_bias", lambda: False)():
      metrics["logit_bias"] = model.learned_logit_bias()
    if model.geometry == "lorentz":
      metrics["curv"] = model.curv()
      metrics["alpha_img"] = model.alpha("img")
      metrics["alpha_txt"] = model.alpha("txt")
    return metrics


# The base's own init_aux too, for the objectives that keep it.
Objective.init_aux = _init_aux_with_token_drop(Objective.init_aux)
