"""A PHyCLIP run end to end: configs/phyclip.py's tiny variant (the
session's shared run, fixtures/shared_runs.py) trains on world_boxes,
evaluates with the world and world_boxes evaluators, and
`hyperbolic_vl.load` embeds like the model and scores by the sum of
per-factor inner products."""

import json
import os

import jax
import numpy as np
import shared_runs

import hyperbolic_vl
from hyperbolic_vl.geometry import product
from hyperbolic_vl.runs import loading

pytestmark = shared_runs.ON_ONE_WORKER


def test_tiny_phyclip_trains_evaluates_and_loads():
  workdir = shared_runs.trained_run("phyclip")
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    rows = [json.loads(line) for line in f]
  logged = {k: v for row in rows for k, v in row.items()}
  assert logged["train/curv/min"] <= logged["train/curv/mean"] <= logged["train/curv/max"]
  # A product model names its cone share per factor (origin_distance.cone_share_name).
  per_factor = "eval/inside_cone_fraction_per_factor"
  for key in ("eval/i2t_recall@5", per_factor, "eval/boxes/mean_dist_origin/box"):
    assert np.isfinite(logged[key]), key

  m = hyperbolic_vl.load(workdir, batch_size=8)
  assert m.num_factors == 8 and m.curv.shape == (8,)
  _, model_def, params, _ = loading.restore_run_params(workdir)
  model = model_def.merge(params)
  images = np.random.default_rng(0).integers(0, 256, size=(5, 16, 16, 3), dtype=np.uint8)
  texts = ["a red circle", "a shape", "two green triangles"]
  expected_images = np.asarray(jax.jit(model.encode_image)(images.astype(np.float32) / 255))
  expected_texts = np.asarray(jax.jit(model.encode_text)(m.tokenize(texts)))
  # float32 towers; batching and sharding only change reduction order.
  image_emb, text_emb = m.encode_images(images), m.encode_texts(texts)
  np.testing.assert_allclose(image_emb, expected_images, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(text_emb, expected_texts, rtol=1e-5, atol=1e-6)
  expected_scores = np.asarray(product.pairwise_score(image_emb, text_emb, model.curv()))
  np.testing.assert_allclose(m.similarity(image_emb, text_emb), expected_scores, rtol=1e-5)
