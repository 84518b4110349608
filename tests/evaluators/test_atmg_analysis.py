"""ATMG's analyses (evaluators/atmg_analysis.py, metrics/chain_order.py,
metrics/spectrum.py): hierarchy accuracies and
the covariance spectrum against float64 NumPy references written from the
equations, the world's region crops, and the evaluator end to end on tiny
untrained ATMG (Lorentz) and CLIP (Euclidean) models."""

import json
import math

import jax
import numpy as np
import pytest
from paths import HIERARCAPS_MINI

from configs import atmg as atmg_config
from configs import clip as clip_config
from hyperbolic_vl import objectives as objectives_lib
from hyperbolic_vl import predictor as predictor_lib
from hyperbolic_vl.data import synthetic_world as world
from hyperbolic_vl.data import tokenizer as tokenizer_lib
from hyperbolic_vl.evaluators import registry
from hyperbolic_vl.evaluators.datasets import world_scenes
from hyperbolic_vl.evaluators.metrics import chain_order, origin_distance, spectrum
from hyperbolic_vl.training import setup

MINI_CSV = str(HIERARCAPS_MINI / "hierarcaps_mini.csv")
MINI_IMAGES = str(HIERARCAPS_MINI / "images")


# -- float64 references, from the equations ---------------------------------------
def ref_lorentz_dist_to_origin(x, c):
  """d(O, x) = acosh(-c <O, x>_L) / sqrt(c), O = (0, 1/sqrt(c)): acosh(sqrt(c) x_time) / sqrt(c)."""
  x_time = np.sqrt(1.0 / c + np.sum(x * x, -1))
  return np.arccosh(np.sqrt(c) * x_time) / np.sqrt(c)


def ref_chain_accuracy(d):
  """Loops over chains, window starts and depths: a window is right when
  every level is strictly farther from the origin than the one before."""
  n, levels = d.shape
  out = {}
  for depth in range(1, levels):
    right = total = 0
    for chain in range(n):
      for start in range(levels - depth):
        total += 1
        right += all(d[chain, j] < d[chain, j + 1] for j in range(start, start + depth))
    out[f"depth{depth}"] = right / total
  pairs = [sum(d[c, i] < d[c, i + 1] for c in range(n)) / n for i in range(levels - 1)]
  return out, pairs


def ref_spectrum(x):
  """Covariance eigenvalues as squared singular values of the centred data / sqrt(N-1)."""
  centred = (x - x.mean(0)) / math.sqrt(len(x) - 1)
  s = np.linalg.svd(centred, compute_uv=False)
  values = np.zeros(x.shape[1])
  values[: len(s)] = s**2
  return np.sort(values)[::-1]


# -- metric functions ----------------------------------------------------------------
@pytest.mark.parametrize("curv", [0.1, 1.7])
def test_lorentz_distance_to_origin_matches_reference(curv):
  rng = np.random.default_rng(0)
  # Norms from 0.05 to ~10: the acosh reference is accurate away from 0.
  x = rng.normal(size=(64, 12)) * rng.uniform(0.02, 3.0, size=(64, 1))
  with jax.enable_x64(True):
    got = origin_distance.distance_to_origin(x, "lorentz", curv)
  np.testing.assert_allclose(got, ref_lorentz_dist_to_origin(x, curv), rtol=1e-10)
  # Euclidean models: the norm of the unnormalised feature.
  np.testing.assert_allclose(
    origin_distance.distance_to_origin(x, "euclidean", None), np.sqrt((x * x).sum(-1)), rtol=1e-12
  )


@pytest.mark.parametrize("levels", [2, 3, 4])
def test_chain_accuracy_matches_reference(levels):
  rng = np.random.default_rng(levels)
  # Increasing on average, with noise and (rounded) ties: every outcome occurs.
  d = np.round(np.arange(levels)[None] * 0.3 + rng.normal(size=(200, levels)) * 0.4, 1)
  names = [f"l{i}" for i in range(levels)]
  got = chain_order.chain_order_accuracy(d, names)
  depths, pairs = ref_chain_accuracy(d)
  for key, value in depths.items():
    assert got[key] == pytest.approx(value, abs=1e-12), key
  assert got["chain"] == pytest.approx(depths[f"depth{levels - 1}"], abs=1e-12)
  for i, value in enumerate(pairs):
    assert got[f"pair/l{i}_l{i + 1}"] == pytest.approx(value, abs=1e-12)
  for i in range(levels):
    assert got[f"mean_dist/l{i}"] == pytest.approx(d[:, i].mean(), abs=1e-12)
  assert 0.0 < got["depth1"] < 1.0


def test_chain_accuracy_reversed_and_tied_chains_are_wrong():
  ordered = np.array([[0.1, 0.5, 0.9]])
  assert chain_order.chain_order_accuracy(ordered, "abc")["chain"] == 1.0
  assert chain_order.chain_order_accuracy(ordered[:, ::-1], "abc")["depth1"] == 0.0
  tied = chain_order.chain_order_accuracy(np.array([[0.1, 0.1, 0.9]]), "abc")
  assert tied["depth1"] == 0.5 and tied["chain"] == 0.0


def test_spectrum_matches_reference():
  rng = np.random.default_rng(1)
  # Anisotropic data: a few dominant directions, and N < D to include zeros.
  for n, dim in [(300, 16), (10, 24)]:
    x = rng.normal(size=(n, dim)) * np.geomspace(10.0, 0.01, dim) + rng.normal(size=dim)
    got = spectrum.covariance_spectrum(x)
    want = ref_spectrum(x)
    np.testing.assert_allclose(got, want, rtol=1e-8, atol=1e-10 * want[0])
    np.testing.assert_allclose(got.sum(), np.trace(np.cov(x, rowvar=False)), rtol=1e-10)
    figures = spectrum.spectrum_figures(got, 3)
    p = want[want > 1e-10 * want[0]] / want.sum()
    assert figures["effective_rank"] == pytest.approx(np.exp(-np.sum(p * np.log(p))), rel=1e-6)
    assert figures["top1_share"] == pytest.approx(want[0] / want.sum(), rel=1e-8)
    assert [figures[f"lambda_0{i}"] for i in (1, 2, 3)] == pytest.approx(want[:3], rel=1e-8)
    assert "lambda_04" not in figures


def test_region_box_nests_between_object_and_scene():
  for index in range(200):
    scene = world.sample_scene(0, "test", index)
    obj = scene.main.box
    for fraction in (0.1, 0.5, 0.9):
      region = world_scenes.region_box(obj, fraction)
      assert region[0] >= -1e-12 and region[1] >= -1e-12
      assert region[2] <= 1 + 1e-12 and region[3] <= 1 + 1e-12
      assert region[0] <= obj[0] and region[1] <= obj[1]
      assert region[2] >= obj[2] and region[3] >= obj[3]
      side, object_side = region[2] - region[0], obj[2] - obj[0]
      assert object_side < side < 1.0
      assert side == pytest.approx(object_side + fraction * (1.0 - object_side))
  with pytest.raises(ValueError):
    world_scenes.region_box(obj, 1.0)


# -- the evaluator end to end --------------------------------------------------------
def tiny_predictor(get_config):
  config = get_config()
  with config.unlocked():
    config.input.image_size = 16
  objective = objectives_lib.get(config.objective)
  tokenizer = tokenizer_lib.get_tokenizer(config.input.tokenizer)
  model_def, params = setup.build_model(config, objective, tokenizer, seed=0)
  predictor = predictor_lib.Predictor(
    model_def, objective, params, tokenizer=tokenizer, image_size=16, batch_size=64
  )
  return config, predictor


@pytest.mark.parametrize("get_config", [atmg_config.get_config, clip_config.get_config])
def test_evaluator_on_a_tiny_model(tmp_path, get_config):
  config, predictor = tiny_predictor(get_config)
  with config.unlocked():
    config.evals = {
      "world_chains": registry.entry("atmg_analysis", num_examples=12, num_eigenvalues=4),
      "csv_chains": registry.entry(
        "atmg_analysis", source="hierarcaps", path=MINI_CSV, image_root=MINI_IMAGES
      ),
    }
  built = registry.build_all(config, predictor.tokenizer, workdir=str(tmp_path))
  figures = registry.run_all(built, predictor)
  assert len(built) == 2

  # Recomputed from the predictor's own embeddings with the references above.
  def distances(emb):
    if predictor.geometry == "lorentz":
      return ref_lorentz_dist_to_origin(emb.astype(np.float64), predictor.curv)
    return np.linalg.norm(emb.astype(np.float64), axis=-1)

  images, tiers = world_scenes.world_chains(0, "test", 12, 16, 0.5)
  image_emb = predictor.encode_images(images.reshape(-1, 16, 16, 3)).reshape(12, 3, -1)
  text_emb = predictor.encode_texts([t for row in tiers for t in row]).reshape(12, 4, -1)
  for kind, emb in (("image", image_emb), ("text", text_emb)):
    depths, pairs = ref_chain_accuracy(distances(emb))
    for key, value in depths.items():
      assert figures[f"eval/world_chains/{kind}_hierarchy/{key}"] == pytest.approx(value), key
  pair_key = "eval/world_chains/image_hierarchy/pair/region_object"
  assert figures[pair_key] == pytest.approx(ref_chain_accuracy(distances(image_emb))[1][1])
  want_image = ref_spectrum(image_emb[:, 0].astype(np.float64))
  assert figures["eval/world_chains/eigen/image/lambda_01"] == pytest.approx(
    want_image[0], rel=1e-5
  )
  want_text = ref_spectrum(text_emb[:, -1].astype(np.float64))
  assert figures["eval/world_chains/eigen/text/lambda_04"] == pytest.approx(
    want_text[3], rel=1e-4, abs=1e-9 * want_text[0]
  )

  # The CSV: text chains and the image spectrum; no image chains.
  assert "eval/csv_chains/text_hierarchy/depth3" in figures
  assert "eval/csv_chains/eigen/image/top1_share" in figures
  assert not any(k.startswith("eval/csv_chains/image_hierarchy") for k in figures)

  # The spectrum files under <workdir>/eval/<name>/.
  out = tmp_path / "eval" / "world_chains"
  saved = json.loads((out / "eigenvalues.json").read_text())
  np.testing.assert_allclose(saved["image"], want_image, rtol=1e-4, atol=1e-9 * want_image[0])
  try:
    import matplotlib  # noqa: F401  (the optional "plots" extra)
  except ImportError:
    return
  assert (out / "eigenvalues.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_tiny_atmg_config_runs_the_analysis_on_the_world():
  config = atmg_config.get_config()
  entry = registry.validate("atmg_analysis", config.evals.atmg_analysis)
  assert entry.type == "atmg_analysis" and entry.source == "world"
  # Paper-scale runs train on real data: the world analysis is not listed.
  assert "atmg_analysis" not in atmg_config.get_config("vit_s").evals
