"""hyperbolic_vl.load: a trained run's embeddings through the public handle."""

import os
import subprocess
import sys

import jax
import numpy as np
import pytest

import hyperbolic_vl
from configs import meru as meru_config
from hyperbolic_vl import train
from hyperbolic_vl.data import pipeline

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def meru_run(tmp_path_factory):
  config = meru_config.get_config()
  with config.unlocked():
    config.input.batch_size = 16
    config.input.image_size = 16
    config.total_steps = 2
    config.ckpt_steps = 2
    config.log_training_steps = 1
    config.optim.warmup_steps = 1
    config.eval_steps = 0
  workdir = str(tmp_path_factory.mktemp("meru_run"))
  result = train.train(config, workdir)
  return workdir, result


@pytest.mark.slow
def test_load_matches_the_trained_state_and_scores_like_meru(meru_run):
  workdir, result = meru_run
  m = hyperbolic_vl.load(workdir, batch_size=8)
  assert m.geometry == "lorentz" and m.image_size == 16 and m.curv > 0
  data = pipeline.load_eval_split(m.config.input, result.tokenizer, split="test", num_examples=13)
  # 13 rows: one full 8-row batch sharded over 8 devices plus a padded one.
  images_u8 = np.round(data["image"] * 255).astype(np.uint8)
  img = m.encode_images(images_u8)
  texts = ["a red circle.", "two blue squares.", "a scene."]
  txt = m.encode_texts(texts)
  module = result.model_def.merge(result.state["params"])
  ref_img = np.asarray(module.encode_image(images_u8.astype(np.float32) / 255.0))
  ref_txt = np.asarray(module.encode_text(m.tokenize(texts)))
  # float32 towers on 1 vs 8 devices differ only in reduction order: ~1e-6
  # relative; 1e-4 leaves room for the tiny ViT's layer norms.
  np.testing.assert_allclose(img, ref_img, rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(txt, ref_txt, rtol=1e-4, atol=1e-5)
  assert img.shape == (13, txt.shape[1]) and img.dtype == np.float32
  # MERU's score: the Lorentzian inner product, float64 reference.
  x, y, c = img.astype(np.float64), txt.astype(np.float64), float(m.curv)
  time = lambda v: np.sqrt(1 / c + np.sum(v * v, -1))
  inner = x @ y.T - time(x)[:, None] * time(y)[None, :]
  np.testing.assert_allclose(m.similarity(img, txt), inner, rtol=1e-4)
  assert m.tokenize(texts).shape == (3, m.config.input.tokenizer.context_length)
  assert jax.local_device_count() == m.mesh.size


def test_load_names_a_missing_or_wrong_workdir(tmp_path):
  with pytest.raises(FileNotFoundError, match="does not exist"):
    hyperbolic_vl.load(str(tmp_path / "nope"))
  with pytest.raises(FileNotFoundError, match="not a hyperbolic_vl workdir"):
    hyperbolic_vl.load(str(tmp_path))


def test_import_is_light():
  code = "import sys, hyperbolic_vl; print('tensorflow' in sys.modules, 'jax' in sys.modules)"
  out = subprocess.run(
    [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True
  )
  assert out.stdout.split() == ["False", "False"]
