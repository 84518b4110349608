"""`hyperbolic_vl.load`: embeddings equal the model's own, scores equal the
objective's, inputs in either pixel convention, clear errors."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import shared_runs
from tiny_runs import small_config

import hyperbolic_vl
from hyperbolic_vl import objectives as objectives_lib
from hyperbolic_vl.runs import loading
from hyperbolic_vl.training import loop, setup

pytestmark = shared_runs.ON_ONE_WORKER


@pytest.fixture(scope="module", params=["meru", "clip"])
def run(request):
  """(config, workdir) of the session's shared tiny run."""
  return shared_runs.CONFIGS[request.param](), shared_runs.trained_run(request.param)


@pytest.fixture(scope="module")
def loaded(run):
  """`hyperbolic_vl.load` of the run with its defaults, shared by the tests
  that only read it (each load compiles its Predictor's functions anew)."""
  return hyperbolic_vl.load(run[1])


def test_load_embeds_like_the_model_and_scores_like_the_objective(run):
  config, workdir = run
  m = hyperbolic_vl.load(workdir, batch_size=8)
  assert m.image_size == 16 and m.geometry == config.model.geometry
  _, model_def, params, _ = loading.restore_run_params(workdir)
  objective = objectives_lib.get(config.objective)

  # The model's own embeddings, scores and curvature as one compiled
  # computation (eagerly each op of the towers would compile on its own).
  @jax.jit
  def expected_of(params, pixels, tokens):
    model = model_def.merge(params)
    image_emb, text_emb = model.encode_image(pixels), model.encode_text(tokens)
    curv = model.curv() if model.geometry == "lorentz" else jnp.nan
    return image_emb, text_emb, objective.score(model, image_emb, text_emb), curv

  rng = np.random.default_rng(0)
  images = rng.integers(0, 256, size=(11, 16, 16, 3), dtype=np.uint8)  # 11: padded batches
  texts = ["a red circle", "a blue square", "a shape", "", "two green triangles"]
  expected = expected_of(params, images.astype(np.float32) / 255, m.tokenize(texts))
  expected_images, expected_texts, expected_scores, curv = map(np.asarray, expected)
  # float32 towers; batching and sharding only change reduction order.
  np.testing.assert_allclose(m.encode_images(images), expected_images, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(
    m.encode_images(images.astype(np.float32) / 255), expected_images, rtol=1e-5, atol=1e-6
  )
  text_emb = m.encode_texts(texts)
  np.testing.assert_allclose(text_emb, expected_texts, rtol=1e-5, atol=1e-6)
  scores = m.similarity(m.encode_images(images), text_emb)
  assert scores.shape == (11, 5)
  np.testing.assert_allclose(scores, expected_scores, rtol=1e-4, atol=1e-5)
  if m.geometry == "lorentz":
    assert m.curv == pytest.approx(float(curv))
  else:
    assert m.curv is None


def test_images_of_another_size_are_resized_as_evaluation_does(loaded):
  """A user's photos come in every size: a 23 x 37 image is embedded as its
  centred 23 x 23 square resized bicubic to the model's 16 px, by hand here
  with PIL, which is how `evaluate` prepares a benchmark's images."""
  from PIL import Image

  from hyperbolic_vl.evaluators.datasets import images as benchmark_images

  m = loaded
  rng = np.random.default_rng(1)
  photos = rng.integers(0, 256, size=(5, 23, 37, 3), dtype=np.uint8)  # H 23, W 37
  by_hand = np.stack(
    [
      np.asarray(Image.fromarray(photo).crop((7, 0, 30, 23)).resize((16, 16), Image.BICUBIC))
      for photo in photos
    ]
  )
  evaluation = np.stack([benchmark_images.resize_image(p, 16, "crop") for p in photos])
  np.testing.assert_array_equal(evaluation, by_hand)
  expected = m.encode_images(by_hand)
  np.testing.assert_allclose(m.encode_images(photos), expected, rtol=1e-6, atol=1e-6)
  # A tall photo: the centred square is taken along the height.
  tall = np.ascontiguousarray(photos.transpose(0, 2, 1, 3))  # H 37, W 23
  tall_by_hand = np.stack(
    [
      np.asarray(Image.fromarray(photo).crop((0, 7, 23, 30)).resize((16, 16), Image.BICUBIC))
      for photo in tall
    ]
  )
  np.testing.assert_allclose(
    m.encode_images(tall), m.encode_images(tall_by_hand), rtol=1e-6, atol=1e-6
  )
  # Float photos are resized in float: on a smooth picture (a gradient, no
  # overshoot for bicubic to clip) they agree with the uint8 path to its
  # roundings (the input's and the output's, half a level of 255 each).
  ramp = np.linspace(0, 1, 37, dtype=np.float32)[None, None, :, None] * np.ones((2, 23, 1, 3))
  from_float = m.images_as_float(ramp.astype(np.float32))
  from_uint8 = m.images_as_float(np.round(ramp * 255).astype(np.uint8))
  assert from_float.shape == (2, 16, 16, 3)
  assert np.abs(from_float - from_uint8).max() <= 1.5 / 255


def test_load_rejects_bad_inputs(loaded, tmp_path):
  m = loaded
  with pytest.raises(ValueError, match=r"must be \(N, H, W, 3\) RGB, got shape \(2, 16, 16, 4\)"):
    m.encode_images(np.zeros((2, 16, 16, 4), np.uint8))
  pixels = np.full((3, 16, 16, 3), 0.5, np.float32)
  m.encode_images(pixels)  # in [0, 1]: accepted
  with pytest.raises(ValueError, match=r"must lie in \[0, 1\], got values in \[0.5, 255\]"):
    m.encode_images(np.where(np.arange(3)[:, None, None, None] == 1, 255.0, pixels))
  pixels[2, 4, 4, 1] = np.nan
  with pytest.raises(ValueError, match=r"NaN or infinite values \(rows \[2\]\)"):
    m.encode_images(pixels)
  with pytest.raises(TypeError, match="list of strings"):
    m.tokenize("one string")
  with pytest.raises(FileNotFoundError, match="does not exist"):
    hyperbolic_vl.load(tmp_path / "missing")
  (tmp_path / "empty").mkdir()
  with pytest.raises(FileNotFoundError, match="not a hyperbolic_vl workdir"):
    hyperbolic_vl.load(tmp_path / "empty")


def test_plot_command_writes_every_view_of_a_run(run, tmp_path):
  """`python -m hyperbolic_vl.plot --workdir=RUN`'s work on a trained run:
  the curves and every view as whole PNGs; the cone only for Lorentz runs."""
  pytest.importorskip("matplotlib")
  from hyperbolic_vl import plot

  config, workdir = run
  written = plot.write_plots(workdir, str(tmp_path), num_examples=24)
  expected = {"training_curves", "disk_view", "distance_histograms", "traversals", "interpolation"}
  if config.model.geometry == "lorentz":
    expected.add("cone")
  assert set(written) == expected
  for path in written.values():
    data = open(path, "rb").read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000, path


def bf16_run(tmp_path_factory):
  """(config, workdir, TrainResult) of a 2-step run with bfloat16 towers (the
  tiny run's shape, stopped early: its step is the shared runs' compiled one
  in another dtype)."""
  config = small_config(**{"model.dtype": "bfloat16", "ckpt_steps": 100})
  workdir = str(tmp_path_factory.mktemp("bf16_run"))
  return config, workdir, loop.train(config, workdir, stop_at_step=2)


def test_a_bf16_run_embeds_in_float32_when_loaded_and_when_evaluated(tmp_path_factory):
  """One bfloat16 run (trained once, on one worker) read both ways."""
  run = bf16_run(tmp_path_factory)
  load_embeds_in_float32_whatever_the_run_trained_in(run)
  evaluation_of_a_bf16_run_embeds_in_float32(run)


def load_embeds_in_float32_whatever_the_run_trained_in(bf16_run):
  """A run trained with bfloat16 towers (as the paper configs) embeds in
  float32 through `load` unless bfloat16 is asked for: the default equals
  the run's params in a float32 model, and differs from the bfloat16 one by
  far more than float32 rounding (so the test would notice the dtype being
  ignored)."""
  from hyperbolic_vl.models import registry as models_registry

  _, workdir, _ = bf16_run
  run_config, model_def16, params, tokenizer = loading.restore_run_params(workdir)
  float32_config = run_config.copy_and_resolve_references()
  float32_config.model.dtype = "float32"
  # Only its graph is needed (the params are the run's): built abstractly,
  # not initialised op by op.
  model_def32, _ = models_registry.ModelDef.from_module(
    models_registry.abstract_model(float32_config, tokenizer.vocab_size, tokenizer.context_length)
  )
  rng = np.random.default_rng(1)
  images = rng.integers(0, 256, size=(8, 16, 16, 3), dtype=np.uint8)
  pixels = images.astype(np.float32) / 255
  expected32 = np.asarray(_compiled_image_tower(model_def32)(params, pixels))
  expected16 = np.asarray(_compiled_image_tower(model_def16)(params, pixels), np.float32)
  default = hyperbolic_vl.load(workdir)
  assert default.dtype == "float32" and default.config.model.dtype == "bfloat16"
  np.testing.assert_allclose(default.encode_images(images), expected32, rtol=1e-5, atol=1e-6)
  # bfloat16 keeps 8 bits of mantissa (relative rounding 2^-9 ~ 2e-3 per
  # operation): the bfloat16 towers land ~1e-2 (relative to the largest
  # entry) from float32, and two bfloat16 programs that fuse and round
  # differently (eager against the Predictor's sharded jit: 4e-3 apart) land
  # as far from each other. This jit of the tower and the Predictor's land
  # closer still (equal on the 2-core AMD EPYC CPU, gap 4.5e-3), but any
  # bfloat16 program must stay within the bound.
  scale = np.abs(expected32).max()
  gap = np.abs(expected16 - expected32).max() / scale
  assert gap > 1e-3, gap
  fast = hyperbolic_vl.load(workdir, dtype="bfloat16").encode_images(images)
  assert np.abs(fast - expected32).max() / scale > 1e-3  # bfloat16 was used
  assert np.abs(fast - expected16).max() / scale < 4 * gap


def evaluation_of_a_bf16_run_embeds_in_float32(bf16_run):
  config, _, result = bf16_run
  images = np.random.default_rng(0).integers(0, 256, (4, 16, 16, 3), dtype=np.uint8)
  evaluated = result.predictor().encode_images(images)
  # The run's final params in a float32 model, computed directly.
  float32_def = setup.eval_model_def(config, result.model_def, result.tokenizer)
  assert float32_def is not result.model_def
  expected = _compiled_image_tower(float32_def)(result.state["params"], images)
  # Same function, same dtype: only batching differs (float32 rounding).
  np.testing.assert_allclose(evaluated, expected, rtol=1e-5, atol=1e-6)
  bf16 = _compiled_image_tower(result.model_def)(result.state["params"], images)
  # bf16 towers (8-bit mantissa) land about 1e-2 relative away.
  assert float(jnp.max(jnp.abs(bf16 - expected))) > 1e-4


def _compiled_image_tower(model_def):
  """model_def's image embedding as one compiled computation: run eagerly,
  each op of the tower compiles on its own, for each dtype again."""
  return jax.jit(lambda params, images: model_def.merge(params).encode_image(jnp.asarray(images)))


def test_plot_of_a_product_run_writes_the_curves_and_loads_no_model(tmp_path, capsys, monkeypatch):
  """A product of 8 Lorentz spaces (factor_dim 8 of 64) has no one disk to
  draw: told from config.json alone (the workdir holds no checkpoint, and
  loading a model would fail the test), the curves are written and one line
  says why the views are not."""
  pytest.importorskip("matplotlib")
  from hyperbolic_vl import inference, plot

  workdir = tmp_path / "phyclip_run"
  workdir.mkdir()
  (workdir / "config.json").write_text(
    json.dumps({"model": {"geometry": "lorentz", "factor_dim": 8, "embed_dim": 64}})
  )
  (workdir / "metrics.jsonl").write_text(
    "".join(json.dumps({"step": s, "train/loss": 4.0 - s}) + "\n" for s in (1, 2, 3))
  )
  monkeypatch.setattr(inference, "load", lambda *a, **k: pytest.fail("a model was loaded"))
  written = plot.write_plots(str(workdir), str(tmp_path / "plots"))
  assert set(written) == {"training_curves"}
  assert capsys.readouterr().out.splitlines()[-1] == (
    "views skipped: the plots draw one Lorentz space on the Poincare disk; this run's model "
    "is a product of 8 spaces (model.factor_dim=8); training curves only"
  )


def test_curves_only_writes_the_curves_and_loads_no_model(tmp_path, monkeypatch):
  """`plot --curves_only` on a single-space run (which would otherwise
  load its model for the views): the curves from metrics.jsonl alone."""
  pytest.importorskip("matplotlib")
  from hyperbolic_vl import inference, plot

  workdir = tmp_path / "meru_run"
  workdir.mkdir()
  (workdir / "config.json").write_text(json.dumps({"model": {"geometry": "lorentz"}}))
  (workdir / "metrics.jsonl").write_text(
    "".join(json.dumps({"step": s, "train/loss": 4.0 - s}) + "\n" for s in (1, 2, 3))
  )
  monkeypatch.setattr(inference, "load", lambda *a, **k: pytest.fail("a model was loaded"))
  written = plot.write_plots(str(workdir), str(tmp_path / "plots"), curves_only=True)
  assert written == {"training_curves": str(tmp_path / "plots" / "training_curves.png")}
  assert (tmp_path / "plots" / "training_curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
