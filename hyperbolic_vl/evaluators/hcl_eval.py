"""HCL evaluations on the synthetic world's held-out scenes.

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
import jax.numpy as jnp
import numpy as np
import optax

from hyperbolic_vl.data import world
from hyperbolic_vl.evaluators import EvaluatorUnavailable
from hyperbolic_vl.geometry import poincare
from hyperbolic_vl.objectives import settings as objective_settings


def ndcg(scores: np.ndarray, gains: np.ndarray) -> float:
  """NDCG of ranking items by descending score against non-negative gains."""
  order = np.argsort(-np.asarray(scores), kind="stable")
  discount = 1.0 / np.log2(np.arange(2, len(gains) + 2))
  dcg = np.sum(np.asarray(gains, np.float64)[order] * discount)
  ideal = np.sum(np.sort(np.asarray(gains, np.float64))[::-1] * discount)
  return float(dcg / ideal)


def linear_probe(
  train_x,
  train_y,
  test_x,
  test_y,
  num_classes: int,
  steps: int = 300,
  lr: float = 1e-2,
  weight_decay: float = 1e-4,
  score_x=None,
):
  """Test accuracy of multinomial logistic regression on standardised features;
  with `score_x`, also the probe's class probabilities on those rows."""
  mean, std = train_x.mean(0), train_x.std(0) + 1e-6
  train_x, test_x = (train_x - mean) / std, (test_x - mean) / std
  params = {"w": jnp.zeros((train_x.shape[1], num_classes)), "b": jnp.zeros((num_classes,))}
  tx = optax.adamw(lr, weight_decay=weight_decay)
  x, y = jnp.asarray(train_x, jnp.float32), jnp.asarray(train_y)

  def loss(p):
    return optax.softmax_cross_entropy_with_integer_labels(x @ p["w"] + p["b"], y).mean()

  @jax.jit
  def fit(p):
    def step(carry, _):
      p, state = carry
      grads = jax.grad(loss)(p)
      updates, state = tx.update(grads, state, p)
      return (optax.apply_updates(p, updates), state), None

    (p, _), _ = jax.lax.scan(step, (p, tx.init(p)), None, length=steps)
    return p

  params = fit(params)
  predictions = np.argmax(np.asarray(test_x @ params["w"] + params["b"]), axis=1)
  accuracy = float(np.mean(predictions == np.asarray(test_y)))
  if score_x is None:
    return accuracy
  logits = ((np.asarray(score_x) - mean) / std) @ np.asarray(params["w"]) + np.asarray(params["b"])
  return accuracy, np.asarray(jax.nn.softmax(jnp.asarray(logits, jnp.float32), axis=-1))


def entropy(probabilities: np.ndarray) -> np.ndarray:
  """Shannon entropy (nats) of each row of a probability matrix."""
  p = np.asarray(probabilities, np.float64)
  return -np.sum(np.where(p > 0, p * np.log(np.where(p > 0, p, 1.0)), 0.0), axis=-1)


class HclEvaluator:
  """Renders the held-out scenes and their object crops once; embeds per call.

  Settings (`config.evals.<name>`): split, num_examples, batch_size. The
  ball's radius, eps, input scale and clip are the run's objective settings.
  """

  def __init__(self, name: str, settings, run_config, tokenizer=None):
    del name, tokenizer
    data_name = run_config.input.data.get("name", "")
    if data_name != "world":
      raise EvaluatorUnavailable(
        f"the HCL world evaluator renders synthetic scenes with known objects; this run "
        f"trains on input.data.name={data_name!r}"
      )
    objective = objective_settings.HclSettings.from_config(run_config.objective)
    self.radius = objective.radius
    self.eps = objective.eps
    self.input_scale = objective.hyp_input_scale
    self.ball_clip = objective.ball_clip
    num = int(settings.get("num_examples", None) or 512)
    size = int(run_config.input.image_size)
    seed = int(run_config.input.data.get("world_seed", 0))
    self.batch_size = int(settings.get("batch_size", 256))
    scenes, crops, crop_labels, crop_scene, counts = [], [], [], [], []
    for index in range(num):
      scene = world.sample_scene(seed, settings.get("split", "test"), index)
      scenes.append(world.render(scene, size))
      counts.append(scene.count)
      for box, label in zip(world.object_boxes(scene), world.object_labels(scene)):
        crops.append(world.render_region(scene, box, size))
        crop_labels.append(label)
        crop_scene.append(index)
    to_float = lambda a: np.stack(a).astype(np.float32) / 255.0
    self.scenes, self.crops = to_float(scenes), to_float(crops)
    self.crop_labels, self.crop_scene = np.asarray(crop_labels), np.asarray(crop_scene)
    self.counts = np.asarray(counts)
    self._compiled_for = None

  def _compile(self, model_def):
    if self._compiled_for is not model_def:
      merge = model_def.merge
      radius, eps, scale, clip = self.radius, self.eps, self.input_scale, self.ball_clip
      self._features = jax.jit(lambda p, x: merge(p).features(x))
      self._ball = jax.jit(
        lambda p, x: poincare.to_ball(merge(p)(x), radius, eps, False, scale, clip)
      )
      self._compiled_for = model_def

  def _batched(self, fn, params, array):
    return np.concatenate(
      [
        np.asarray(fn(params, array[i : i + self.batch_size]))
        for i in range(0, len(array), self.batch_size)
      ]
    )

  def __call__(self, predictor) -> dict[str, float]:
    self._compile(predictor.model_def)
    params = predictor.params
    features = self._batched(self._features, params, self.crops)
    scene_features = self._batched(self._features, params, self.scenes)
    split = self.crop_scene < (self.crop_scene.max() + 1) // 2
    accuracy, scene_probabilities = linear_probe(
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
      "eval/ndcg_norm_vs_objects": ndcg(scene_norm, self.counts),
      "eval/ndcg_entropy_vs_objects": ndcg(entropy(scene_probabilities), self.counts),
      "eval/ndcg_random": float(
        np.mean([ndcg(rng.permutation(len(self.counts)), self.counts) for _ in range(20)])
      ),
      "eval/norm/object": float(crop_norm.mean() / self.radius),
      "eval/norm/scene": float(scene_norm[self.counts >= 2].mean() / self.radius),
      "eval/norm/scene_all": float(scene_norm.mean() / self.radius),
    }
