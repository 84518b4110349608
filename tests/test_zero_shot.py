"""Zero-shot figures on hand-made sets and prompt ensembling vs float64 NumPy."""

import jax
import numpy as np
import pytest

from hyperbolic_vl.evaluators import zero_shot


def test_accuracy_and_mean_per_class_on_a_known_answer():
  # 3 classes; class 0 has 4 images (3 right), class 1 has 1 (right),
  # class 2 has 1 (wrong): top1 = 4/6, mean per class = (3/4 + 1 + 0) / 3.
  labels = np.array([0, 0, 0, 0, 1, 2])
  predicted = np.array([0, 0, 0, 1, 1, 0])
  scores = np.eye(3)[predicted]
  figures = zero_shot.classification_figures(scores, labels, 3)
  assert figures["top1"] == pytest.approx(4 / 6, abs=0)
  assert figures["top1_mean_per_class"] == pytest.approx((0.75 + 1 + 0) / 3, abs=1e-15)


def np_log0(x, c):
  time = np.sqrt(1 / c + np.sum(x * x, -1, keepdims=True))
  norm = np.linalg.norm(x, axis=-1, keepdims=True)
  return np.arccosh(np.sqrt(c) * time) / (np.sqrt(c) * norm) * x


def np_exp0(v, c):
  norm = np.linalg.norm(v, axis=-1, keepdims=True)
  return np.sinh(np.sqrt(c) * norm) / (np.sqrt(c) * norm) * v


def test_lorentz_ensemble_is_the_tangent_mean_lifted():
  rng = np.random.default_rng(0)
  prompts = rng.normal(size=(4, 5, 6))
  c = 0.7
  with jax.enable_x64(True):
    got = zero_shot.class_embeddings(prompts, "tangent_mean", c)
  want = np_exp0(np_log0(prompts, c).mean(axis=1), c)
  np.testing.assert_allclose(got, want, rtol=1e-10)


def test_euclidean_ensemble_is_the_normalised_mean_and_atmg_keeps_prompts():
  rng = np.random.default_rng(1)
  prompts = rng.normal(size=(3, 4, 5))
  unit = prompts / np.linalg.norm(prompts, axis=-1, keepdims=True)
  want = unit.mean(1) / np.linalg.norm(unit.mean(1), axis=-1, keepdims=True)
  np.testing.assert_allclose(zero_shot.class_embeddings(prompts, "normalised_mean"), want)
  np.testing.assert_array_equal(zero_shot.class_embeddings(prompts, "per_prompt"), prompts)
  assert zero_shot.ensemble_rule("atmg", "lorentz") == "per_prompt"
  assert zero_shot.ensemble_rule("meru", "lorentz") == "tangent_mean"
  assert zero_shot.ensemble_rule("clip", "euclidean") == "normalised_mean"
  with pytest.raises(ValueError, match="valid"):
    zero_shot.class_embeddings(prompts, "median")
