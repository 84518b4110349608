"""HierarCaps loaders, metrics with known answers, and the evaluation command."""

import json
import os
import subprocess
import sys

import cheap_codegen
import numpy as np
import pytest
from paths import REPO, SHARED_DATA

from hyperbolic_vl.data import registry as data_registry
from hyperbolic_vl.data.readers import hierarcaps
from hyperbolic_vl.evaluators.metrics import hierarchy

SAMPLE = SHARED_DATA / "hierarcaps_sample"
SAMPLE_CSV = SAMPLE / "hierarcaps_test_sample.csv"
needs_sample = pytest.mark.skipif(not SAMPLE_CSV.is_file(), reason="HierarCaps sample absent")


# ---------------------------------------------------------------------------
# Loaders.
# ---------------------------------------------------------------------------
@needs_sample
def test_sample_parses_into_four_tiers_and_every_image_resolves():
  split = hierarcaps.load_test(SAMPLE_CSV, SAMPLE / "images", strict=True)
  assert len(split) == 200 and not split.problems
  assert all(len(t) == 4 and all(t) for t in split.tiers)
  assert all(p.is_file() for p in split.image_paths)
  assert split.tiers[1][0] == "bird" and split.tiers[1][1] == "blue bird"
  assert split.image_paths[1].name == "COCO_val2014_000000100489.jpg"
  image = hierarcaps.load_image(split.image_paths[0], 16)
  assert image.shape == (16, 16, 3) and 0 <= image.min() and image.max() <= 1


def test_broken_rows_are_reported_by_number_and_skipped(tmp_path):
  images = tmp_path / "images"
  images.mkdir()
  for name in ("a.jpg", "b.jpg", "c.jpg"):
    (images / name).write_bytes(b"")
  (tmp_path / "test.csv").write_text(
    "id,captions,image_url\n"
    "0,t1 => t2 => t3 => t4,http://x/val/a.jpg\n"
    "1,t1 => t2 => t3,http://x/val/b.jpg\n"  # 3 tiers
    "2,t1 => t2 => t3 => t4,http://x/val/missing.jpg\n"  # no image
    "3,t1 =>  => t3 => t4,http://x/val/c.jpg\n"  # empty tier
    "4,u1 => u2 => u3 => u4 => u5,http://x/val/c.jpg\n"  # 5 tiers
    "5,v1 => v2 => v3 => v4,c.jpg\n"
  )
  split = hierarcaps.load_test(tmp_path / "test.csv", images)
  assert [p.row for p in split.problems] == [2, 3, 4, 5]
  assert "3" in split.problems[0].reason and "missing.jpg" in split.problems[1].reason
  assert split.rows == [1, 6] and split.tiers[1] == ["v1", "v2", "v3", "v4"]
  with pytest.raises(ValueError, match="row 2"):
    hierarcaps.load_test(tmp_path / "test.csv", images, strict=True)


def test_train_file_with_negatives(tmp_path):
  import gzip

  path = tmp_path / "train.csv.gz"
  with gzip.open(path, "wt") as f:
    f.write(
      "positive,negative,image_url\n"
      "a => b => c => d,w => x => y => z,http://h/1.jpg\n"
      "a => b => c => d,w => x => y,http://h/2.jpg\n"
    )
  split = hierarcaps.load_train(path)
  assert len(split) == 1 and split.negatives == [["w", "x", "y", "z"]]
  assert [p.row for p in split.problems] == [2]


def test_world_tier_iterator_is_resumable():
  from configs import radial as radial_config
  from hyperbolic_vl.data import tokenizer as tokenizer_lib

  config = radial_config.get_config()
  tokenizer = tokenizer_lib.get_tokenizer(config.input.tokenizer)
  it = data_registry.make_train_iterator(
    config.input, tokenizer, seed=0, process_index=0, process_count=1
  )
  next(it)
  state = it.get_state()
  expected = next(it)
  again = data_registry.make_train_iterator(
    config.input, tokenizer, seed=0, process_index=0, process_count=1
  )
  again.set_state(state)
  got = next(again)
  assert got["tier_tokens"].shape == (config.input.batch_size, 4, 32)
  np.testing.assert_array_equal(got["tier_tokens"], expected["tier_tokens"])
  np.testing.assert_array_equal(got["neg_tier_tokens"], expected["neg_tier_tokens"])


def test_tier_batches_of_two_processes_concatenate_to_one():
  from configs import radial as radial_config
  from hyperbolic_vl.data import tokenizer as tokenizer_lib

  config = radial_config.get_config()
  tokenizer = tokenizer_lib.get_tokenizer(config.input.tokenizer)
  make = lambda i, n: data_registry.make_train_iterator(
    config.input, tokenizer, seed=0, process_index=i, process_count=n
  )
  single, halves = make(0, 1), [make(0, 2), make(1, 2)]
  for _ in range(3):
    whole, parts = next(single), [next(h) for h in halves]
    for key in whole:
      np.testing.assert_array_equal(whole[key], np.concatenate([p[key] for p in parts]))


# ---------------------------------------------------------------------------
# Metrics on hand-built embeddings.
# ---------------------------------------------------------------------------
def test_kendall_tau_perfect_and_reversed():
  assert hierarchy.tau_d(np.array([[1.0, 2, 3, 4], [0.1, 0.2, 0.5, 0.9]])) == 1.0
  assert hierarchy.tau_d(np.array([[4.0, 3, 2, 1]])) == -1.0
  assert hierarchy.tau_d(np.array([[1.0, 3, 2, 4]])) == pytest.approx(4 / 6)


def _meridian(polar_deg, azimuth_deg):
  p, a = np.deg2rad(polar_deg), np.deg2rad(azimuth_deg)
  return np.array([np.sin(p) * np.cos(a), np.sin(p) * np.sin(a), np.cos(p)])


def test_euclidean_hierarchical_retrieval_known_answer():
  # Root at the north pole; each image's hierarchy lies on its own meridian,
  # tiers at growing polar angle (= growing distance from the root).
  root = np.array([0.0, 0.0, 1.0])
  texts = [_meridian(a, az) for az in (0, 120) for a in (20, 45, 70, 90)]
  texts.append(_meridian(55, 0))  # a distractor on image 0's meridian
  texts = np.stack(texts)
  images = np.stack([_meridian(100, 0), _meridian(100, 120)])
  tiers = np.array([[0, 1, 2, 3], [4, 5, 6, 7]])
  predictions = hierarchy.hierarchical_retrieval(
    images, texts, geometry="euclidean", root=root, method="interpolation"
  )
  assert predictions[0] == [0, 1, 8, 2, 3] and predictions[1] == [4, 5, 6, 7]
  metrics = hierarchy.hierarchy_metrics(
    images, texts, tiers, geometry="euclidean", root=root, method="interpolation"
  )
  assert metrics["precision"] == pytest.approx((4 / 5 + 1) / 2)
  assert metrics["recall"] == 1.0 and metrics["tau_d"] == 1.0
  reversed_metrics = hierarchy.hierarchy_metrics(
    images, texts, tiers[:, ::-1], geometry="euclidean", root=root, method="interpolation"
  )
  assert reversed_metrics["tau_d"] == -1.0


def test_lorentz_hierarchical_retrieval_follows_the_geodesic():
  u, v = np.array([1.0, 0, 0]), np.array([0, 1.0, 0])
  curv = 1.0
  at = lambda direction, dist: np.sinh(dist) * direction  # space components, c = 1
  texts = np.stack(
    [at(u, d) for d in (0.5, 1.0, 1.5, 2.0)] + [at(v, d) for d in (0.5, 1.0, 1.5, 2.0)]
  )
  images = np.stack([at(u, 2.6), at(v, 2.6)])
  tiers = np.array([[0, 1, 2, 3], [4, 5, 6, 7]])
  metrics = hierarchy.hierarchy_metrics(
    images, texts, tiers, geometry="lorentz", curv=curv, method="interpolation"
  )
  assert metrics["precision"] == 1.0 and metrics["recall"] == 1.0 and metrics["tau_d"] == 1.0
  # Only the nearest text's geodesic is walked: an image nearest to tier 2
  # retrieves tiers 1-2 only (recall 1/2, precision 1).
  short = hierarchy.hierarchy_metrics(
    np.stack([at(u, 1.0)]), texts, tiers[:1], geometry="lorentz", curv=curv, method="interpolation"
  )
  assert short["precision"] == 1.0 and short["recall"] == 0.5


# ---------------------------------------------------------------------------
# The command on the real sample with a checkpoint of this codebase.
# ---------------------------------------------------------------------------
@pytest.mark.slow  # an end-to-end run of the command line
@needs_sample
def test_evaluation_command_on_the_real_sample(tmp_path):
  from configs import clip as clip_config
  from hyperbolic_vl.training import loop

  config = clip_config.get_config()
  with config.unlocked():
    config.input.batch_size = 16
    config.input.image_size = 16
    config.total_steps = 2
    config.optim.warmup_steps = 1
  loop.train(config, str(tmp_path / "run"))
  output = tmp_path / "out" / "metrics.json"
  env = dict(os.environ, XLA_FLAGS=cheap_codegen.XLA_FLAG, JAX_PLATFORMS="cpu")
  run = subprocess.run(
    [
      sys.executable,
      "-m",
      "hyperbolic_vl.evaluate",
      f"--workdir={tmp_path / 'run'}",
      "--eval=hierarchy",
      f"--dataset=csv:{SAMPLE_CSV}",
      f"--images={SAMPLE / 'images'}",
      f"--output={output}",
    ],
    cwd=REPO,
    env=env,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert run.returncode == 0, run.stderr[-3000:]
  figures = json.loads(output.read_text())["figures"]
  metrics = {key.rpartition("/")[2]: value for key, value in figures.items()}
  assert "tau_d" in run.stdout, run.stdout
  for key in ("precision", "recall", "tau_d"):
    assert np.isfinite(metrics[key])
  assert -1 <= metrics["tau_d"] <= 1 and 0 <= metrics["precision"] <= 1
