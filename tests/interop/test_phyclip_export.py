"""A PHyCLIP run (a product of K Lorentz spaces) in the release's checkpoint
layout: MERU's keys with the per-factor scalars in `curvs.{k}`,
`visual_concept_alphas.{k}`, `textual_concept_alphas.{k}` and MERU's unused
`curv` / `visual_alpha` / `textual_alpha` at their init. Round trips, in
memory through interop/meru.py's table and on disk through
`hyperbolic_vl.export --format=meru` and back through the converter, give
every param back bit for bit."""

import math
import types

import jax
import numpy as np
import pytest

from configs import phyclip as phyclip_config
from hyperbolic_vl import export
from hyperbolic_vl.interop import common, meru, workdir
from hyperbolic_vl.models import registry as models_registry
from hyperbolic_vl.runs import loading

K = 4  # embed 32 in four factors of eight


def product_config():
  """configs/phyclip.py:vit_s shrunk to a 2-layer, 32-px model with K = 4."""
  config = phyclip_config.get_config("vit_s")
  with config.unlocked():
    config.input.image_size = 32
    config.input.tokenizer.context_length = 16
    config.model.update(
      dict(image_variant="mu/8", text_variant="mu", image_num_heads=4, embed_dim=32, factor_dim=8)
    )
  return config


def product_params(config, seed=0):
  tokenizer = types.SimpleNamespace(
    vocab_size=config.input.tokenizer.vocab_size,
    context_length=config.input.tokenizer.context_length,
  )
  _, params = models_registry.build_model_def(config, tokenizer, seed)
  rng = np.random.default_rng(seed)
  # Every param moved off its init, the per-factor scalars to distinct values.
  params = jax.tree.map(
    lambda v: np.asarray(v, np.float32) + 0.05 * rng.standard_normal(np.shape(v)), params
  )
  params = jax.tree.map(lambda v: np.asarray(v, np.float32), params)
  params["log_curv"] = np.log(np.asarray([0.5, 1.0, 2.0, 4.0], np.float32))
  params["log_alpha_img"] = np.log(np.asarray([0.2, 0.3, 0.4, 0.5], np.float32))
  params["log_alpha_txt"] = np.log(np.asarray([0.25, 0.35, 0.45, 0.55], np.float32))
  return params


def test_the_table_writes_the_released_names_and_reads_them_back():
  config = product_config()
  flat = common.flatten(product_params(config))
  state = meru.export(flat, pixel_stats="imagenet", image_size=32)
  for ours, theirs in (
    ("log_curv", "curvs"),
    ("log_alpha_img", "visual_concept_alphas"),
    ("log_alpha_txt", "textual_concept_alphas"),
  ):
    for k in range(K):
      assert state[f"{theirs}.{k}"].shape == ()
      assert state[f"{theirs}.{k}"] == flat[ours][k]
    assert f"{theirs}.{K}" not in state
  # MERU's scalars, unused by PHyCLIP's model, at their init.
  assert state["curv"] == 0.0
  np.testing.assert_allclose(state["visual_alpha"], math.log(32**-0.5), rtol=1e-6)
  np.testing.assert_allclose(state["textual_alpha"], math.log(32**-0.5), rtol=1e-6)
  # Everything else is MERU's layout: the names of a one-space model's export.
  plain = {k: v for k, v in flat.items() if not k.startswith(("log_curv", "log_alpha"))}
  for name in ("log_curv", "log_alpha_img", "log_alpha_txt"):
    plain[name] = np.float32(0.0)
  merus = set(meru.export(plain, pixel_stats="imagenet", image_size=32))
  factor_names = {n for n in state if n.split(".")[0].endswith(("curvs", "concept_alphas"))}
  assert set(state) - factor_names == merus

  shapes = {name: tuple(np.shape(value)) for name, value in flat.items()}
  conversion = meru.convert(state, shapes, pixel_stats="imagenet")
  back, ignored = conversion.finish()
  assert ignored == [] and set(back) == set(flat)
  for name, value in flat.items():
    np.testing.assert_array_equal(back[name], value, err_msg=name)


def test_export_to_a_file_and_convert_back_is_exact(tmp_path, monkeypatch):
  torch = pytest.importorskip("torch")
  import test_interop as refs

  refs.stub_clip_bpe(monkeypatch)
  config = workdir.release_config(product_config())
  params = product_params(config, seed=1)
  run = tmp_path / "phyclip_run"
  workdir.write_workdir(params, config, str(run))
  summary = export.export_run(str(run), "meru", str(tmp_path / "phyclip.pth"))
  state = torch.load(tmp_path / "phyclip.pth", weights_only=True)["model"]
  assert summary["tensors"] == len(state)
  assert torch.equal(state["curvs.3"], torch.tensor(math.log(4.0), dtype=torch.float32))

  back_run = tmp_path / "converted"
  workdir.convert_checkpoint("meru", str(tmp_path / "phyclip.pth"), config, str(back_run))
  _, _, back, _ = loading.restore_run_params(str(back_run))
  flat, flat_back = common.flatten(params), common.flatten(jax.device_get(back))
  assert set(flat_back) == set(flat)
  for name, value in flat.items():
    np.testing.assert_array_equal(np.asarray(flat_back[name]), value, err_msg=name)


def test_a_fixed_curvature_product_run_is_refused(tmp_path):
  config = product_config()
  with config.unlocked():
    config.model.learn_curv = False
  reason = export._unsupported("meru", config)
  assert reason == (
    "model.learn_curv=False with model.factor_dim=8 (PHyCLIP's release stores "
    "learned per-factor curvatures)"
  )
