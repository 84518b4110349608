"""Zero-shot figures on hand-made sets, and the prompt ensembling of the
predictor's class embeddings (the objective's rule: tangent mean then lift
for MERU, normalised mean for CLIP, every prompt kept for ATMG) against
NumPy references."""

import numpy as np
import pytest
from tiny_fixtures import random_batch, tiny_two_towers

from configs import atmg as atmg_config
from configs import clip as clip_config
from configs import meru as meru_config
from hyperbolic_vl import objectives as objectives_lib
from hyperbolic_vl import predictor as predictor_lib
from hyperbolic_vl.evaluators.metrics import classification


def test_accuracy_and_mean_per_class_on_a_known_answer():
  # 3 classes; class 0 has 4 images (3 right), class 1 has 1 (right),
  # class 2 has 1 (wrong): top1 = 4/6, mean per class = (3/4 + 1 + 0) / 3.
  labels = np.array([0, 0, 0, 0, 1, 2])
  predicted = np.array([0, 0, 0, 1, 1, 0])
  scores = np.eye(3)[predicted]
  figures = classification.classification_figures(scores, labels, 3)
  assert figures["top1"] == pytest.approx(4 / 6, abs=0)
  assert figures["top1_mean_per_class"] == pytest.approx((0.75 + 1 + 0) / 3, abs=1e-15)


def np_log0(x, c):
  time = np.sqrt(1 / c + np.sum(x * x, -1, keepdims=True))
  norm = np.linalg.norm(x, axis=-1, keepdims=True)
  return np.arccosh(np.sqrt(c) * time) / (np.sqrt(c) * norm) * x


def np_exp0(v, c):
  norm = np.linalg.norm(v, axis=-1, keepdims=True)
  return np.sinh(np.sqrt(c) * norm) / (np.sqrt(c) * norm) * v


def ensemble(get_config, geometry):
  """(prompt embeddings (C, P, D), the predictor's class embeddings, curv)
  of a tiny untrained model: 3 classes x 4 prompts of random tokens."""
  model_def, params = tiny_two_towers(geometry=geometry)
  objective = objectives_lib.get(get_config().objective)
  predictor = predictor_lib.Predictor(model_def, objective, params, tokenizer=None, image_size=16)
  tokens = random_batch(12, seed=3)["tokens"]
  prompts = predictor.encode_tokens(tokens).astype(np.float64).reshape(3, 4, -1)
  classes = predictor.class_embeddings_from_tokens(tokens.reshape(3, 4, -1))
  return prompts, classes, predictor.curv


def test_lorentz_ensemble_is_the_tangent_mean_lifted():
  prompts, classes, c = ensemble(meru_config.get_config, "lorentz")
  want = np_exp0(np_log0(prompts, c).mean(axis=1), c)
  np.testing.assert_allclose(classes, want, rtol=2e-4, atol=1e-6)


def test_euclidean_ensemble_is_the_normalised_mean_and_atmg_keeps_prompts():
  prompts, classes, _ = ensemble(clip_config.get_config, "euclidean")
  unit = prompts / np.linalg.norm(prompts, axis=-1, keepdims=True)
  want = unit.mean(1) / np.linalg.norm(unit.mean(1), axis=-1, keepdims=True)
  np.testing.assert_allclose(classes, want, rtol=1e-5, atol=1e-6)
  prompts, classes, _ = ensemble(atmg_config.get_config, "lorentz")
  assert classes.shape == prompts.shape
  np.testing.assert_allclose(classes, prompts, rtol=1e-6, atol=1e-7)
