"""Evaluator type "hcl": HCL's figures on the synthetic world's held-out scenes.

eval/linear_probe_accuracy   logistic regression (JAX/optax, Adam, full
                             batch) on frozen, standardised backbone features
                             of object crops -> shape class; the first half
                             of the scenes' objects train it, the rest test
eval/ndcg_norm_vs_objects    NDCG of ranking full scenes by Poincare norm
                             (descending) with gain = number of objects:
                             DCG = sum_i gain_i / log2(i + 1), / ideal DCG
eval/ndcg_entropy_vs_objects the entropy baseline of HCL's Table 3: scenes
                             ranked by the entropy (descending) of the
                             object probe's class distribution on them
eval/ndcg_random             the same for a random ranking (mean of 20)
eval/norm/object             mean |z| / r of single-object crops
eval/norm/scene              mean |z| / r of whole scenes with >= 2 objects
eval/norm/scene_all          mean |z| / r of all whole scenes
"""

from __future__ import annotations

import jax
import numpy as np

from hyperbolic_vl.data import synthetic_world as world
from hyperbolic_vl.evaluators import registry
from hyperbolic_vl.evaluators.datasets import world_scenes
from hyperbolic_vl.evaluators.metrics import linear_probe_adam, ranking
from hyperbolic_vl.geometry import poincare

SETTINGS = dict(split="test", num_examples=None)
# The objective settings that place an embedding on the ball (poincare.to_ball).
BALL_SETTINGS = ("radius", "eps", "hyp_input_scale", "ball_clip")


@registry.register(
  "hcl",
  settings=SETTINGS,
  description="HCL: object linear probe and scene-norm NDCG on world scenes",
)
class HclEvaluator:
  """Renders the held-out scenes and their object crops once; embeds per call.

  Settings (`config.evals.<name>`): split, num_examples, batch_size. The
  ball's radius, eps, input scale and clip are those of the predictor's
  objective, read when it is called.
  """

  def __init__(self, name: str, settings, run_input, tokenizer=None):
    del name
    world_scenes.require_world_split(
      run_input,
      tokenizer,
      split=settings.get("split", "test"),
      needed_by="the HCL evaluator (synthetic scenes with known objects)",
    )
    self.batch_size = int(settings.get("batch_size", 256))
    rendered = world_scenes.scenes_and_object_crops(
      world_scenes.world_seed(run_input),
      settings.get("split", "test"),
      int(settings.get("num_examples", None) or 512),
      int(run_input.image_size),
    )
    self.scenes, self.crops = rendered["scenes"], rendered["crops"]
    self.crop_labels, self.crop_scene = rendered["crop_labels"], rendered["crop_scene"]
    self.counts = rendered["counts"]
    self.radius = None  # the ball's, set with the compiled functions
    self._compiled_for = None  # (model_def, objective)

  def _compile(self, model_def, objective):
    """Compiles the embedding functions for this model and its objective's
    ball; a predictor with another model or objective compiles anew."""
    # By identity: a training run hands every call the same two objects.
    compiled_for = self._compiled_for or (None, None)
    if compiled_for[0] is not model_def or compiled_for[1] is not objective:
      ball = objective.settings
      missing = [k for k in BALL_SETTINGS if not hasattr(ball, k)]
      if missing:
        raise ValueError(
          f"the HCL evaluator maps onto the objective's Poincare ball; objective "
          f"{objective.name!r} has no {missing}"
        )
      merge = model_def.merge
      radius, eps, scale, clip = (getattr(ball, k) for k in BALL_SETTINGS)
      self._features = jax.jit(lambda p, x: merge(p).features(x))
      self._ball = jax.jit(
        lambda p, x: poincare.to_ball(merge(p)(x), radius, eps, False, scale, clip)
      )
      self.radius = radius
      self._compiled_for = (model_def, objective)

  def _batched(self, fn, params, array):
    return np.concatenate(
      [
        np.asarray(fn(params, array[i : i + self.batch_size]))
        for i in range(0, len(array), self.batch_size)
      ]
    )

  def __call__(self, predictor) -> dict[str, float]:
    self._compile(predictor.model_def, predictor.objective)
    params = predictor.params
    features = self._batched(self._features, params, self.crops)
    scene_features = self._batched(self._features, params, self.scenes)
    split = self.crop_scene < (self.crop_scene.max() + 1) // 2
    accuracy, scene_probabilities = linear_probe_adam.linear_probe(
      features[split],
      self.crop_labels[split],
      features[~split],
      self.crop_labels[~split],
      num_classes=len(world.SHAPES),
      score_x=scene_features,
    )
    scene_norm = np.linalg.norm(self._batched(self._ball, params, self.scenes), axis=-1)
    crop_norm = np.linalg.norm(self._batched(self._ball, params, self.crops), axis=-1)
    rng = np.random.default_rng(0)
    return {
      "eval/linear_probe_accuracy": accuracy,
      "eval/ndcg_norm_vs_objects": ranking.ndcg(scene_norm, self.counts),
      "eval/ndcg_entropy_vs_objects": ranking.ndcg(
        ranking.entropy(scene_probabilities), self.counts
      ),
      "eval/ndcg_random": float(
        np.mean([ranking.ndcg(rng.permutation(len(self.counts)), self.counts) for _ in range(20)])
      ),
      "eval/norm/object": float(crop_norm.mean() / self.radius),
      "eval/norm/scene": float(scene_norm[self.counts >= 2].mean() / self.radius),
      "eval/norm/scene_all": float(scene_norm.mean() / self.radius),
    }
