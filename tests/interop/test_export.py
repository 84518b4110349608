"""Export: runs out of JAX in MERU's, open_clip's and a safetensors layout.

Round trips: test_interop's 2-layer references (random non-trivial weights)
saved in their release's layout, converted by the documented path
(`interop.workdir.convert_checkpoint` with the paper configs of
docs/interop.md), exported with `hyperbolic_vl.export`, must give back every
tensor bit for bit under the same names. Then the other direction: runs
whose params were made here (never seen by torch) are exported and loaded
by the other code's own classes (MERU's layout into the MERU reference
module, open_clip's through `open_clip.create_model(name, pretrained=FILE)`),
which must embed like `hyperbolic_vl.load` of the run (MERU's own classes
and loader, from a MERU checkout, are checked at full size by
benchmarks/export_round_trip.py --meru_repo). safetensors exports rebuild
params, running statistics and inference aux exactly; runs a format cannot
hold and bad paths are refused with one line before anything is written.

Skipped without the `interop` extra (torch, open_clip, timm).
"""

import json
import math
import types

import jax
import numpy as np
import pytest

torch = pytest.importorskip("torch")
open_clip = pytest.importorskip("open_clip")
pytest.importorskip("timm")

import test_interop as refs  # noqa: E402

import hyperbolic_vl  # noqa: E402
from configs import atmg as atmg_config  # noqa: E402
from configs import clip as clip_config  # noqa: E402
from configs import meru as meru_config  # noqa: E402
from hyperbolic_vl import errors, export  # noqa: E402
from hyperbolic_vl import objectives as objectives_lib  # noqa: E402
from hyperbolic_vl.interop import workdir  # noqa: E402
from hyperbolic_vl.models import lora  # noqa: E402
from hyperbolic_vl.models import registry as models_registry  # noqa: E402
from hyperbolic_vl.runs import checkpointing, loading  # noqa: E402

MERU_SIZES = dict(width=64, depth=2, heads=4, mlp_ratio=2, patch=8, embed_dim=32, vocab=49408)
# MERU's state dict holds tensors that are no param of ours: export writes
# them from the config. All but the sin-cos table come back bit for bit (a
# bool mask, the config's pixel statistics and fixed curvature, rounded to
# float32 the way torch rounds them). The table is recomputed in float64 and
# rounded to float32 (MoCo-v3's formula); the reference builds it in torch's
# float64 the same way, so the two agree to float32 rounding of sin/cos
# values in [-1, 1]: 1e-6 absolute.
MERU_RECOMPUTED = {"visual.pos_embed": 1e-6}


def meru_mu_config(module, variant="vit_s"):
  return refs.mu_config(module, variant, image_variant="mu/8", image_num_heads=4, embed_dim=32)


def meru_reference(hyperbolic: bool, curv: float | None = None):
  torch.manual_seed(0)
  reference = refs.MeruReference(**MERU_SIZES, hyperbolic=hyperbolic)
  if curv is not None:
    with torch.no_grad():
      reference.curv.fill_(math.log(curv))
  return reference.eval()


def export_file(run, format_name, tmp_path, name):
  summary = export.export_run(str(run), format_name, str(tmp_path / name))
  return summary, tmp_path / name


# ---------------------------------------------------------------------------
# Round trips: release -> convert -> export == release.
# ---------------------------------------------------------------------------
@pytest.mark.parametrize(
  "release, config_module, curv",
  [("meru", meru_config, None), ("meru_clip", clip_config, None), ("atmg", atmg_config, 0.1)],
)
def test_meru_layout_round_trip_is_exact(tmp_path, monkeypatch, release, config_module, curv):
  reference = meru_reference(hyperbolic=release != "meru_clip", curv=curv)
  original = reference.state_dict()
  checkpoint = tmp_path / f"{release}.pth"
  torch.save({"model": original}, checkpoint)
  refs.stub_clip_bpe(monkeypatch)
  run = tmp_path / "converted"
  workdir.convert_checkpoint("meru", str(checkpoint), meru_mu_config(config_module), str(run))

  summary, path = export_file(run, "meru", tmp_path, "exported.pth")
  exported = torch.load(path, weights_only=True)["model"]
  assert set(exported) == set(original)
  for name, value in original.items():
    assert exported[name].dtype == value.dtype, name
    if name in MERU_RECOMPUTED:
      torch.testing.assert_close(exported[name], value, rtol=0, atol=MERU_RECOMPUTED[name])
    else:
      assert torch.equal(exported[name], value), name
  assert summary["tensors"] == len(original)


def test_open_clip_layout_round_trip_is_exact(tmp_path, monkeypatch):
  torch.manual_seed(0)
  original = refs.open_clip_reference().state_dict()  # open_clip keeps no buffers in it
  checkpoint = tmp_path / "open_clip.pt"
  torch.save(original, checkpoint)
  refs.stub_clip_bpe(monkeypatch)
  run = tmp_path / "converted"
  workdir.convert_checkpoint("open_clip", str(checkpoint), refs.openai_mu_config(), str(run))

  _, path = export_file(run, "open_clip", tmp_path, "exported.pt")
  exported = torch.load(path, weights_only=True)
  assert set(exported) == set(original)
  for name, value in original.items():
    assert exported[name].dtype == value.dtype and torch.equal(exported[name], value), name


# ---------------------------------------------------------------------------
# Runs made here, loaded by the other code's classes.
# ---------------------------------------------------------------------------
def own_run(tmp_path, config, seed=3):
  """A run directory whose params come from this codebase's own init, every
  one moved off it (LayerNorm gains around 1, learned scalars set), written
  as the converter writes runs. The run names CLIP's tokenizer (stubbed)."""
  config = workdir.release_config(config)
  tokenizer = types.SimpleNamespace(
    vocab_size=config.input.tokenizer.vocab_size,
    context_length=config.input.tokenizer.context_length,
  )
  _, params = models_registry.build_model_def(config, tokenizer, seed)
  rng = np.random.default_rng(seed)
  scalars = dict(
    log_logit_scale=math.log(1 / 0.04),
    log_curv=math.log(0.6),
    log_alpha_img=math.log(0.35),
    log_alpha_txt=math.log(0.4),
  )

  def moved(path, value):
    name = "/".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path)
    if name in scalars:
      return np.asarray(scalars[name], np.float32)
    noise = rng.standard_normal(np.shape(value)).astype(np.float32)
    if name.endswith("/scale"):  # LayerNorm gains
      return 1.0 + 0.2 * noise
    return np.asarray(value, np.float32) + 0.05 * noise

  params = jax.tree_util.tree_map_with_path(moved, params)
  run = tmp_path / "own_run"  # written with its parents
  workdir.write_workdir(params, config, str(run))
  return run


# The float32 towers of depth 2 agree with PyTorch's to a few ulps per op
# (~1e-6 of the largest output seen, as in test_interop); 1e-4 relative to
# the largest output leaves a 100x margin, while a layout error (a missing
# transpose, q/k/v order, a swapped LayerNorm) gives O(1) differences.
RELATIVE_TOLERANCE = 1e-4


@pytest.mark.parametrize("hyperbolic", [True, False], ids=["meru", "meru_clip"])
def test_meru_export_loads_into_meru_and_embeds_alike(tmp_path, monkeypatch, hyperbolic):
  refs.stub_clip_bpe(monkeypatch)
  config = meru_mu_config(meru_config if hyperbolic else clip_config)
  run = own_run(tmp_path, config)
  _, path = export_file(run, "meru", tmp_path, "meru.pth")

  reference = meru_reference(hyperbolic)  # its own random weights, all replaced
  reference.load_state_dict(torch.load(path, weights_only=True)["model"], strict=True)
  if hyperbolic:
    np.testing.assert_allclose(float(reference.curv.detach().exp()), 0.6, rtol=1e-6)
  loaded = hyperbolic_vl.load(run)
  pixels, tokens = refs.images("generated"), refs.token_ids()
  image_error, text_error = refs.compare(loaded, reference, pixels, tokens)
  print(
    f"meru export ({'lorentz' if hyperbolic else 'euclidean'}): {image_error:.2e} {text_error:.2e}"
  )
  assert image_error < RELATIVE_TOLERANCE and text_error < RELATIVE_TOLERANCE


def test_open_clip_export_loads_with_create_model_and_embeds_alike(tmp_path, monkeypatch):
  refs.stub_clip_bpe(monkeypatch)
  run = own_run(tmp_path, refs.openai_mu_config())
  summary, path = export_file(run, "open_clip", tmp_path, "open_clip.pt")
  assert any("quickgelu" in note for note in summary["notes"])
  # The 2-layer architecture as an open_clip model config, so that the file
  # loads the documented way: create_model(name, pretrained=FILE) (strict).
  architecture = tmp_path / "hvl-export-test-mu.json"
  architecture.write_text(
    json.dumps(
      dict(
        embed_dim=32,
        quick_gelu=True,
        vision_cfg=dict(
          image_size=refs.IMAGE_SIZE, layers=2, width=64, head_width=32, mlp_ratio=2.0, patch_size=8
        ),
        text_cfg=dict(context_length=refs.CONTEXT, vocab_size=49408, width=64, heads=2, layers=2),
      )
    )
  )
  open_clip.add_model_config(architecture)
  model = open_clip.create_model("hvl-export-test-mu", pretrained=str(path)).eval()
  np.testing.assert_allclose(float(model.logit_scale.detach().exp()), 1 / 0.04, rtol=1e-5)
  loaded = hyperbolic_vl.load(run)
  image_error, text_error = refs.compare(
    loaded, refs.NormalisedOpenClip(model), refs.images("generated"), refs.token_ids()
  )
  print(f"open_clip export: {image_error:.2e} {text_error:.2e}")
  assert image_error < RELATIVE_TOLERANCE and text_error < RELATIVE_TOLERANCE


# ---------------------------------------------------------------------------
# safetensors: any run, rebuilt exactly.
# ---------------------------------------------------------------------------
def assert_trees_equal(a, b):
  assert jax.tree.structure(a) == jax.tree.structure(b)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_safetensors_rebuilds_the_params_exactly(tmp_path, monkeypatch):
  refs.stub_clip_bpe(monkeypatch)
  run = own_run(tmp_path, meru_mu_config(atmg_config))
  summary, path = export_file(run, "safetensors", tmp_path, "atmg.safetensors")
  assert summary["config"] == str(tmp_path / "atmg.json")

  back = export.read_safetensors(str(path))
  run_config, _, params, _ = loading.restore_run_params(str(run))
  assert_trees_equal(back.params, jax.device_get(params))
  assert back.batch_stats == {} and back.aux == {}
  assert back.config["model"] == run_config.model.to_dict()
  assert back.config["image_size"] == refs.IMAGE_SIZE
  assert back.config["tokenizer"]["vocab_size"] == 49408
  assert back.config["tokenizer"]["context_length"] == refs.CONTEXT
  # The same config travels inside the file, for a reader given the file alone.
  from safetensors import safe_open

  with safe_open(str(path), framework="numpy") as f:
    assert json.loads(f.metadata()["config"]) == back.config


def test_resnet_run_exports_to_safetensors_with_its_running_statistics(tmp_path):
  """A run with a ResNet image tower: its running statistics (random, away
  from their init) travel with the params; the release layouts refuse it."""
  from tiny_runs import small_config

  config = small_config(**{"model.image_variant": "RN-mu"})
  # Shapes from the abstract model (an eager ResNet init costs seconds).
  model_def, template = models_registry.ModelDef.from_module(models_registry.abstract_model(config))
  rng = np.random.default_rng(0)
  draw = lambda x: rng.uniform(0.5, 2.0, x.shape).astype(np.float32)
  params = jax.tree.map(draw, template)
  batch_stats = jax.tree.map(draw, model_def.initial_batch_stats())
  run = tmp_path / "run"
  workdir.write_workdir(params, config, str(run), batch_stats=batch_stats)
  _, path = export_file(run, "safetensors", tmp_path, "rn.safetensors")
  back = export.read_safetensors(str(path))
  assert_trees_equal(back.params, params)
  assert_trees_equal(back.batch_stats, batch_stats)
  for format_name in ("meru", "open_clip"):
    with pytest.raises(export.ExportError, match="'RN-mu' is a ResNet"):
      export.export_run(str(run), format_name, str(tmp_path / "x.pt"))
  assert not (tmp_path / "x.pt").exists()


def test_radial_root_travels_in_safetensors_and_is_noted_elsewhere(tmp_path):
  """What inference needs beyond the params (Radial's root tokens, int32)
  is written under aux/ with its dtype; the MERU layout has no place for it
  and says so."""
  from configs import radial as radial_config

  config = radial_config.get_config()  # Euclidean, root "auto": empty-caption tokens
  with config.unlocked():
    config.input.image_size = 16
  model_def, template = models_registry.ModelDef.from_module(models_registry.abstract_model(config))
  rng = np.random.default_rng(0)
  params = jax.tree.map(lambda x: rng.standard_normal(x.shape).astype(np.float32), template)
  aux_template = objectives_lib.get(config.objective).inference_aux_template(model_def.module)
  aux = {"root_tokens": rng.integers(0, 256, aux_template["root_tokens"].shape).astype(np.int32)}
  run = tmp_path / "run"
  workdir.write_workdir(params, config, str(run), aux=aux)

  _, path = export_file(run, "safetensors", tmp_path, "radial.safetensors")
  back = export.read_safetensors(str(path))
  assert_trees_equal(back.params, params)
  assert back.aux["root_tokens"].dtype == np.int32
  np.testing.assert_array_equal(back.aux["root_tokens"], aux["root_tokens"])
  summary, _ = export_file(run, "meru", tmp_path, "radial.pth")
  assert summary["notes"] == ["not in this format: inference state ['root_tokens']"]


# ---------------------------------------------------------------------------
# Refusals: one line, nothing written.
# ---------------------------------------------------------------------------
def config_only_run(tmp_path, config):
  """A workdir holding only config.json: the format checks read no more."""
  run = tmp_path / "run"
  run.mkdir()
  (run / "config.json").write_text(json.dumps(checkpointing.json_config(config)))
  return run


@pytest.mark.parametrize(
  "format_name, config, message",
  [
    (
      "open_clip",
      meru_mu_config(meru_config),
      "--format=open_clip cannot hold this run: model.geometry='lorentz'",
    ),
    (
      "meru",
      refs.openai_mu_config(),
      "--format=meru cannot hold this run: model.image_ln_pre=True",
    ),
    (
      "open_clip",
      meru_mu_config(clip_config),
      "--format=open_clip cannot hold this run: model.image_ln_pre=False",
    ),
  ],
  ids=["lorentz_to_open_clip", "openai_layout_to_meru", "meru_clip_to_open_clip"],
)
def test_a_run_the_format_cannot_hold_is_refused(tmp_path, format_name, config, message):
  run = config_only_run(tmp_path, config)
  with pytest.raises(export.ExportError) as info:
    export.export_run(str(run), format_name, str(tmp_path / "out.pt"))
  assert str(info.value).startswith(message) and "\n" not in str(info.value)
  assert not (tmp_path / "out.pt").exists()


def test_hcl_run_is_refused_by_the_release_layouts(tmp_path):
  from configs import hcl as hcl_config

  run = config_only_run(tmp_path, hcl_config.get_config())
  with pytest.raises(export.ExportError, match=r"model.name='hcl'"):
    export.export_run(str(run), "meru", str(tmp_path / "out.pth"))


def test_bad_workdir_format_and_output_are_one_line_errors(tmp_path):
  run = config_only_run(tmp_path, meru_mu_config(meru_config))
  (tmp_path / "a_file").write_text("")
  cases = [
    (str(tmp_path / "missing"), "meru", str(tmp_path / "o.pth"), errors.WorkdirError, "missing"),
    (str(run), "torchscript", str(tmp_path / "o.pth"), export.ExportError, "'torchscript'"),
    (str(run), "meru", str(tmp_path / "a_file" / "o.pth"), export.ExportError, "not a folder"),
    (str(run), "meru", str(tmp_path), export.ExportError, "is a folder"),
    (str(run), "meru", "/sys/hyperbolic_vl_export.pth", export.ExportError, "cannot write in /sys"),
  ]
  for workdir_, format_name, output, kind, message in cases:
    with pytest.raises(kind) as info:
      export.export_run(workdir_, format_name, output)
    assert message in str(info.value) and "\n" not in str(info.value), str(info.value)
    assert errors.is_user_error(info.value)
  assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file", "run"]


def test_a_lora_run_exports_with_its_adapters_merged(tmp_path, monkeypatch):
  refs.stub_clip_bpe(monkeypatch)
  config = meru_mu_config(meru_config)
  with config.unlocked():
    config.model.lora.rank = 2
    config.model.lora.alpha = 3.0
    config.model.lora.targets = ("q", "k", "v", "out", "fc1", "fc2", "patch")
  run = own_run(tmp_path, config)  # every adapter moved off zero
  _, path = export_file(run, "meru", tmp_path, "meru.pth")
  reference = meru_reference(True)
  # MERU's strict load: the file holds base weights only.
  reference.load_state_dict(torch.load(path, weights_only=True)["model"], strict=True)
  loaded = hyperbolic_vl.load(run)  # the adapted model, adapters unmerged
  image_error, text_error = refs.compare(
    loaded, reference, refs.images("generated"), refs.token_ids()
  )
  assert image_error < RELATIVE_TOLERANCE and text_error < RELATIVE_TOLERANCE

  _, safetensors_path = export_file(run, "safetensors", tmp_path, "run.safetensors")
  back = export.read_safetensors(str(safetensors_path))
  with open(export.config_path_for(str(safetensors_path))) as f:
    assert json.load(f)["model"]["lora"]["rank"] == 0
  _, _, params, _ = loading.restore_run_params(str(run), dtype="float32")
  assert_trees_equal(back.params, lora.merge_adapters(jax.device_get(params), config.model))


def test_a_learned_entailment_weight_is_left_out_of_the_release_layout(tmp_path, monkeypatch):
  """objective.entail_weight_learned adds one param, log_entail_weight, that
  weights the training loss only: MERU's layout has no place for it, so
  the export drops it with a note and writes exactly the file of the same
  run without it, which MERU's strict load reads."""
  refs.stub_clip_bpe(monkeypatch)
  config = meru_mu_config(meru_config)
  plain = own_run(tmp_path, config)
  _, _, params, _ = loading.restore_run_params(str(plain), dtype="float32")
  params = {**jax.device_get(params), "log_entail_weight": np.float32(1.25)}
  learned_config = workdir.release_config(config)
  with learned_config.unlocked():
    learned_config.objective.entail_weight_learned = True
    learned_config.model.learned_entail_weight = True
  learned = tmp_path / "learned_run"
  workdir.write_workdir(params, learned_config, str(learned))

  plain_summary, plain_path = export_file(plain, "meru", tmp_path, "plain.pth")
  summary, path = export_file(learned, "meru", tmp_path, "learned.pth")
  assert summary["notes"] == [
    "not in this format: log_entail_weight = 1.25 (the learned entailment weight's log factor; "
    "it weights the training loss only, no embedding reads it): dropped"
  ]
  assert summary["params"] == plain_summary["params"]
  assert summary["tensors"] == plain_summary["tensors"]
  expected = torch.load(plain_path, weights_only=True)["model"]
  exported = torch.load(path, weights_only=True)["model"]
  assert set(exported) == set(expected)
  for name, value in expected.items():
    assert torch.equal(exported[name], value), name
  meru_reference(True).load_state_dict(exported, strict=True)
  # safetensors holds every param: the weight travels there.
  _, safetensors_path = export_file(learned, "safetensors", tmp_path, "learned.safetensors")
  assert float(export.read_safetensors(str(safetensors_path)).params["log_entail_weight"]) == 1.25
