"""HySAC's safety retrieval on a hand-built case: 3 quadruplets, so every
gallery holds 6 items, with figures computed by hand below, with and without
traversal; the bounds' estimate and file layout; the evaluator's table."""

import json

import numpy as np
import pytest

from hyperbolic_vl import errors
from hyperbolic_vl.evaluators import safety_retrieval
from hyperbolic_vl.evaluators.metrics import safety

# Curvature 1. Each quadruplet i lies on one ray u_i of the plane (0, 120
# and 240 degrees), so along a ray d(x, y) = |asinh|x| - asinh|y||, and
# every distance across rays is larger than every along-ray distance that
# decides a top-1 below (checked by hand with the hyperbolic law of
# cosines, e.g. the closest cross-ray pair at stake, 0.7652 and 0.39 at 120
# degrees: acosh(1.3077 * 1.0768 + 0.8379 * 0.4 * 0.5) = 1.02).
#
# Euclidean norms (space components) and their distances to the origin:
#   safe images  V  0.5 -> 0.4812
#   safe texts   S  0.6 -> 0.5688
#   unsafe images G 2.0 -> 1.4436
#   unsafe texts U  2.2, 1.0, 0.4 -> 1.5259, 0.8814, 0.3900
NORMS = {"image": [0.5] * 3, "text": [0.6] * 3, "unsafe_image": [2.0] * 3,
         "unsafe_text": [2.2, 1.0, 0.4]}  # fmt: skip
ANGLES = np.deg2rad([0.0, 120.0, 240.0])
RAYS = np.stack([np.cos(ANGLES), np.sin(ANGLES)], axis=1)
EMBEDDINGS = {key: np.asarray(norms)[:, None] * RAYS for key, norms in NORMS.items()}

# Bounds: every "up_95" and "low_05" that a configuration uses is 0.3 but
# G's up_95, 1.0. b' = b + tanh((b - 0.8) / 1) + 1:
#   b = 0.3: 1.3 + tanh(-0.5) = 0.837883 (upper: queries with d(0, x) >
#            0.837883 move to the norm 0.837883, i.e. d(0, x') = 0.7652)
#   b = 1.0: 2 + tanh(0.2) = 2.197375 (lower: queries with d(0, x) <
#            2.197375 move to the norm 2.197375, d(0, x') = 1.5248)
BOUNDS = {letter: {"up_95": 0.3, "low_05": 0.3, "avg": 0.3} for letter in "VSGU"}
BOUNDS["G"]["up_95"] = 1.0

# Top-1 per query, by hand (q0, q1, q2), and the figures it gives.
# u2v_and_g: unsafe text -> [safe images; unsafe images], positive: safe image i
#   plain:     q0 -> G0 (0.082 < 1.045), q1 -> V1 (0.400 < 0.562), q2 -> V2 (0.091)
#   traversal: q0 (1.5259) and q1 (0.8814 > 0.8379) move to 0.7652: V (0.284) <
#              G (0.678); q2 (0.39) stays: V2
# u2g_and_v: unsafe text -> [unsafe images; safe images], positive: unsafe image i
#   plain:     q0 -> G0, q1 -> V1, q2 -> V2
#   traversal: all below 2.1974, moved to 1.5248: G (0.081) < V (1.044)
# g2s_and_u: unsafe image -> [safe texts; unsafe texts], positive: safe text i
#   plain:     from 1.4436: q0 -> U0 (0.082), q1 -> U1 (0.562 < S 0.875),
#              q2 -> S2 (0.875 < U2 1.054)
#   traversal: all move to 0.7652: q0 -> S0 (0.196 < 0.761), q1 -> U1 (0.116 <
#              0.196), q2 -> S2 (0.196 < 0.375)
# g2u_and_s: unsafe image -> [unsafe texts; safe texts], positive: unsafe text i
#   the same top-1s as g2s_and_u, the halves swapped
# u2u_and_s: unsafe text -> [safe texts; unsafe texts], positive: safe text i
#   plain:     each query is its own nearest gallery item (d = 0): second half
#   traversal: q0 -> S0 (0.196 < 0.761), q1 -> U1 (0.116 < 0.196), q2 stays -> U2
# R@10 and R@20 count the whole 6-item gallery: 1.
EXPECTED = {
  "u2v_and_g": {"R@1": 2 / 3, "safety": 2 / 3},
  "u2v_and_g/traversal": {"R@1": 1.0, "safety": 1.0},
  "u2g_and_v": {"R@1": 1 / 3, "safety": 1 / 3},
  "u2g_and_v/traversal": {"R@1": 1.0, "safety": 1.0},
  "g2s_and_u": {"R@1": 1 / 3, "safety": 1 / 3},
  "g2s_and_u/traversal": {"R@1": 2 / 3, "safety": 2 / 3},
  "g2u_and_s": {"R@1": 2 / 3, "safety": 2 / 3},
  "g2u_and_s/traversal": {"R@1": 1 / 3, "safety": 1 / 3},
  "u2u_and_s": {"R@1": 0.0, "safety": 0.0},
  "u2u_and_s/traversal": {"R@1": 1 / 3, "safety": 1 / 3},
}


def test_every_configuration_equals_the_hand_computation():
  figures = safety.safety_figures(EMBEDDINGS, 1.0, BOUNDS)
  for prefix, values in EXPECTED.items():
    for key, value in values.items():
      assert figures[f"{prefix}/{key}"] == pytest.approx(value, abs=1e-12), (prefix, key)
    assert figures[f"{prefix}/R@10"] == figures[f"{prefix}/R@20"] == 1.0
  # Within each pair kind the rays match: plain retrieval is perfect.
  for name in ("s2v", "u2g"):
    for direction in ("t2i", "i2t"):
      assert figures[f"{name}/{direction}/R@1"] == 1.0


def test_traversal_moves_the_space_norm_as_released():
  """b' x / |x| sets |x| (not the distance) to b'; a query whose distance is
  below b' stays although its norm is above it (norm 0.9, d 0.8089)."""
  queries = np.asarray([[2.2, 0.0], [0.0, 0.9]])
  moved = safety.traverse(queries, 0.3, 1.0, kind="upper")
  np.testing.assert_allclose(moved[0], [0.837883, 0.0], atol=1e-6)
  np.testing.assert_array_equal(moved[1], queries[1])
  assert safety.traversal_radius(1.0, 1.0) == pytest.approx(2.197375, abs=1e-6)


def test_bounds_are_percentiles_of_the_distance_to_the_origin(tmp_path):
  """Five safe images at norms sinh(1..5) (distances 1..5, curvature 1):
  linear percentiles 4.8 and 1.2, mean 3."""
  norms = np.sinh(np.arange(1.0, 6.0))
  embeddings = {key: norms[:, None] * np.asarray([[0.6, 0.8]]) for key in safety.MODALITY_OF}
  bounds = safety.estimate_bounds(embeddings, 1.0)
  assert bounds["V"] == pytest.approx({"up_95": 4.8, "low_05": 1.2, "avg": 3.0}, abs=1e-9)
  path = tmp_path / "hysac_bounds.json"
  path.write_text(safety.bounds_json(bounds))
  assert set(json.loads(path.read_text())) == {"V", "S", "G", "U"}
  assert safety.read_bounds(path) == bounds
  path.write_text(json.dumps({"V": bounds["V"]}))
  with pytest.raises(errors.DataError, match="'S'"):
    safety.read_bounds(path)


class _EmbeddingsByRow:
  """A predictor whose inputs are row numbers into fixed embeddings (an
  evaluator's predictor, encode_images / encode_tokens and a curv attribute:
  not the objectives' model that tiny_fixtures.GivenEmbeddings stands for)."""

  curv = 1.0

  def __init__(self, by_kind):
    self.by_kind = by_kind

  def encode_images(self, rows):
    return self.by_kind[rows[0]][rows[1]]

  def encode_tokens(self, rows):
    return self.by_kind[rows[0]][rows[1]]


def test_the_evaluator_writes_its_bounds_and_prints_the_table(tmp_path, capsys):
  evaluator = object.__new__(safety_retrieval.SafetyRetrievalEvaluator)
  rows = np.arange(3)
  evaluator.data = {
    "image": ("image", rows),
    "tokens": ("text", rows),
    "unsafe_image": ("unsafe_image", rows),
    "unsafe_tokens": ("unsafe_text", rows),
  }
  evaluator.bounds, evaluator.bounds_data = None, evaluator.data
  evaluator.alpha, evaluator.output_dir = 0.8, str(tmp_path)
  figures = evaluator(_EmbeddingsByRow(EMBEDDINGS))
  # Bounds estimated on the same 3 quadruplets: V is 0.4812 throughout.
  written = safety.read_bounds(tmp_path / "hysac_bounds.json")
  assert written["V"]["avg"] == pytest.approx(np.arcsinh(0.5), abs=1e-12)
  assert figures["safety_retrieval/bounds/V/up_95"] == written["V"]["up_95"]
  assert figures["safety_retrieval/u2v_and_g/R@1"] == pytest.approx(2 / 3)
  assert "u2v_and_g + traversal" in capsys.readouterr().out
