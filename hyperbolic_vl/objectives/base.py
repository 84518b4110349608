"""The one small interface every objective implements, plus shared pieces.

The training step (`hyperbolic_vl.train`) runs `Objective.loss` inside
`jax.shard_map` over the `data` mesh axis. `loss` sees the LOCAL slice of the
global batch and returns the mean loss over its local rows; the step averages
that over devices with `pmean`, which equals the global-batch mean because
every device holds the same number of rows. Cross-device interactions go
through `gather_columns` (a differentiable `all_gather`: its transpose is a
reduce-scatter, so gradients reach the device that produced each column).

With `axis_name=None` the same code runs on one device without shard_map,
which is how tests build float64 and single-device references.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from hyperbolic_vl.data import pipeline
from hyperbolic_vl.models import two_towers
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


class Objective:
  """Base class. Subclasses set `name`/`geometry` and implement `loss`.

  Hooks with defaults:
    build_model     the module to train (default: TwoTowers from config.model)
    init_aux        non-trainable state carried in the train state and the
                    checkpoint but never given to the optimizer (frozen
                    teachers, momentum encoders, queues)
    trainable       which parameters the optimizer updates (others get no
                    optimizer state at all)
    score           similarity of image and text embeddings for retrieval and
                    zero-shot classification (higher = more similar)
    class_embedding prompt ensembling for zero-shot classifiers
    make_train_iterator  the batches (default: image-caption pipeline)

  Hyperparameters are parsed once, from `config.objective`, into
  `self.settings` (a frozen dataclass of objectives/settings.py, where every
  default lives).
  """

  name = "base"
  geometry = "lorentz"
  Settings: ClassVar[type[settings_lib.ObjectiveSettings]] = settings_lib.ObjectiveSettings

  def __init__(self, config: Mapping[str, Any] | None = None):
    self.settings = self.Settings.from_config(config)
    # Transitional: objectives not yet converted read their raw section.
    self.config = dict(config or {})

  def build_model(self, config, *, vocab_size: int, context_length: int, rngs: nnx.Rngs):
    model_config = dict(config.model)
    if model_config.get("geometry", self.geometry) != self.geometry:
      raise ValueError(
        f"objective {self.name!r} needs model.geometry={self.geometry!r}, "
        f"got {model_config['geometry']!r}"
      )
    model_config["geometry"] = self.geometry
    return two_towers.build_two_towers(
      model_config,
      vocab_size=vocab_size,
      context_length=context_length,
      image_size=config.input.image_size,
      rngs=rngs,
    )

  def make_train_iterator(self, config, tokenizer):
    return pipeline.make_train_iterator(config.input, tokenizer, seed=config.seed)

  def init_aux(self, model, params: dict, rng: jax.Array) -> dict:
    del model, params, rng
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

  def loss(
    self, model, aux: dict, batch: Mapping[str, jax.Array], *, rng: jax.Array, axis_name: str | None
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
    if model.geometry == "lorentz":
      metrics["curv"] = model.curv()
      metrics["alpha_img"] = model.alpha("img")
      metrics["alpha_txt"] = model.alpha("txt")
    return metrics
