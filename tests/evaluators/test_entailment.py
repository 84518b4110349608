"""Entailment detection: the pairs of caption chains, and the figures of a
stand-in Lorentz predictor whose text points are placed by hand, against a
float64 NumPy transcription of MERU's eqs. 10-11 and a hand-ranked AUC / AP."""

import ml_collections
import numpy as np
import pytest
from paths import HIERARCAPS_MINI

from hyperbolic_vl.evaluators import EvaluatorUnavailable, registry
from hyperbolic_vl.evaluators import entailment as entailment_module


def test_pairs_keep_same_chain_tiers_as_positives_and_drop_shared_texts_from_negatives():
  chains = [["x", "x1"], ["x", "x2"], ["y", "y1"]]
  general, specific, labels = entailment_module.entailment_pairs(chains)
  pairs = sorted(zip(general, specific, labels.tolist()))
  # Chains 0 and 1 share "x": (x, x2) from chain 0 and (x, x1) from chain 1 entail, so they are no negatives.
  assert pairs == sorted(
    [
      ("x", "x1", True),
      ("x", "x2", True),
      ("y", "y1", True),
      ("x", "y1", False),
      ("x", "y1", False),
      ("y", "x1", False),
      ("y", "x2", False),
    ]
  )


# Space components of points on the hyperboloid of curvature 1.
POINTS = {
  "a": (1.0, 0.0),
  "a red": (2.0, 0.0),  # on the ray through "a", beyond it: exterior angle 0
  "b": (0.0, 1.0),
  "b blue": (1.5, 1.2),  # off b's ray: a wider angle from b than from a
}


class LorentzTexts:
  geometry, curv = "lorentz", 1.0

  def encode_texts(self, texts):
    return np.array([POINTS[t] for t in texts])


def reference_ratio(x, y, curv=1.0, min_radius=0.1):
  """MERU eq. 11 / eq. 10 in float64: exterior angle at x towards y over x's half aperture."""
  x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
  x_time = np.sqrt(1 / curv + x @ x)
  y_time = np.sqrt(1 / curv + y @ y)
  inner = x @ y - x_time * y_time
  numerator = y_time + x_time * curv * inner
  denominator = np.linalg.norm(x) * np.sqrt((curv * inner) ** 2 - 1)
  angle = np.arccos(np.clip(numerator / denominator, -1, 1))
  aperture = np.arcsin(min(1.0, 2 * min_radius / (np.sqrt(curv) * np.linalg.norm(x))))
  return angle / aperture


def evaluator_of(chains):
  evaluator = registry.get("entailment").build(
    "hand",
    registry.entry("entailment", source="world", num_examples=2),
    ml_collections.ConfigDict({"image_size": 8, "data": {}}),
  )
  evaluator.chains = chains
  evaluator.general, evaluator.specific, evaluator.labels = entailment_module.entailment_pairs(
    chains
  )
  evaluator.label = "hand"
  return evaluator


def test_lorentz_figures_hand_computed():
  evaluator = evaluator_of([["a", "a red"], ["b", "b blue"]])
  ratios = {
    pair: reference_ratio(POINTS[pair[0]], POINTS[pair[1]])
    for pair in [("a", "a red"), ("b", "b blue"), ("a", "b blue"), ("b", "a red")]
  }
  # The placement gives this order of scores (-ratio), best first:
  # (a, a red) +, (a, b blue) -, (b, b blue) +, (b, a red) -.
  assert ratios[("a", "a red")] < 1e-6
  assert ratios[("a", "a red")] < ratios[("a", "b blue")] < ratios[("b", "b blue")]
  assert ratios[("b", "b blue")] < ratios[("b", "a red")]
  figures = evaluator(LorentzTexts())
  # AUC: of the 4 (positive, negative) pairs, only (b, b blue) < (a, b blue) is lost: 3/4.
  assert figures["entailment/hand/auc_roc"] == 0.75
  # AP: positives at ranks 1 and 3: (1/1 + 2/3) / 2.
  assert figures["entailment/hand/average_precision"] == pytest.approx(5 / 6, abs=1e-12)
  in_cone = [ratios[("a", "a red")] <= 1, ratios[("b", "b blue")] <= 1]
  assert figures["entailment/hand/positives_in_cone"] == np.mean(in_cone)
  assert figures["entailment/hand/num_positive"] == 2
  assert figures["entailment/hand/num_negative"] == 2


def test_euclidean_cosine_and_refusals():
  class EuclideanTexts(LorentzTexts):
    geometry, curv = "euclidean", None

  evaluator = evaluator_of([["a", "a red"], ["b", "b blue"]])
  figures = evaluator(EuclideanTexts())
  cos = lambda u, v: np.dot(u, v) / np.linalg.norm(u) / np.linalg.norm(v)  # noqa: E731
  # cos: (a, a red) 1, (a, b blue) .781, (b, b blue) .625, (b, a red) 0: the same order as above.
  assert cos(POINTS["a"], POINTS["b blue"]) > cos(POINTS["b"], POINTS["b blue"]) > 0
  assert figures["entailment/hand/auc_roc"] == 0.75
  assert "entailment/hand/positives_in_cone" not in figures

  class ProductTexts(LorentzTexts):
    geometry = "product"

  with pytest.raises(EvaluatorUnavailable, match="geometry is 'product'"):
    evaluator(ProductTexts())

  class PerFactorCurvatures(LorentzTexts):  # a Lorentz model with K curvatures
    curv = np.array([1.0, 0.5])

  with pytest.raises(EvaluatorUnavailable, match="geometry is 'product'"):
    evaluator(PerFactorCurvatures())
  evaluator.refuse_euclidean = True
  with pytest.raises(EvaluatorUnavailable, match="geometry is 'euclidean'"):
    evaluator(EuclideanTexts())


def test_sources_read_world_tiers_and_hierarcaps_csv():
  config = ml_collections.ConfigDict({"image_size": 8, "data": {}})
  world = registry.get("entailment").build(
    "w", registry.entry("entailment", source="world", num_examples=6), config
  )
  assert len(world.chains) == 6 and all(len(c) == 4 for c in world.chains)
  assert world.labels.sum() == 6 * 6  # 6 ordered tier pairs per chain
  csv = registry.get("entailment").build(
    "mini",
    registry.entry(
      "entailment", source="hierarcaps", path=str(HIERARCAPS_MINI / "hierarcaps_mini.csv")
    ),
    config,
  )
  assert csv.chains[0] == [
    "bird",
    "blue bird",
    "blue bird on a branch",
    "A blue bird sitting on a branch in autumn.",
  ]


def test_a_missing_csv_names_the_layout(tmp_path):
  with pytest.raises(EvaluatorUnavailable, match="4 tiers joined by ' => '"):
    registry.get("entailment").build(
      "x",
      registry.entry("entailment", source="hierarcaps", path=str(tmp_path / "none.csv")),
      ml_collections.ConfigDict({"image_size": 8, "data": {}}),
    )
