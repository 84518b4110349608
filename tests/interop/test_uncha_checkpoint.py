"""UNCHA's released checkpoints (MERU's layout plus three logit scales, MERU's
unused scale and an unused min-radius head): a random-weight reference in
the release's key layout converts with `--source=uncha` and embeds like a
PyTorch forward of the same weights (float32, 1e-5 relative).

Skipped without the `interop` extra (torch, timm)."""

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("timm")

import test_interop as refs  # noqa: E402

from configs import uncha as uncha_config  # noqa: E402
from hyperbolic_vl.interop import common, workdir  # noqa: E402

# Depth-2 float32 towers agree with PyTorch's to ~1e-6 relative (test_interop
# sees the same for MERU); 1e-5 leaves a 10x margin while a layout error
# gives O(1) differences.
RELATIVE_TOLERANCE = 1e-5
SCALES = {"global": 1 / 0.09, "local": 1 / 0.04, "global_local": 1 / 0.065}


class UnchaReference(refs.MeruReference):
  """MERU's reference plus UNCHA's extra state: three learned log-scales,
  the unused `logit_scale` (kept from MERU) and the text encoder's unused
  `min_radius_head` (Linear(width, 1) + Softplus)."""

  def __init__(self, **sizes):
    super().__init__(**sizes, hyperbolic=True)
    for name, value in SCALES.items():
      self.register_parameter(
        f"{name}_logit_scale", torch.nn.Parameter(torch.tensor(math.log(value)))
      )
    width = self.textual_proj.in_features
    self.textual.min_radius_head = torch.nn.Sequential(
      torch.nn.Linear(width, 1), torch.nn.Softplus()
    )


def uncha_checkpoint(tmp_path):
  torch.manual_seed(0)
  reference = UnchaReference(
    width=64, depth=2, heads=4, mlp_ratio=2, patch=8, embed_dim=32, vocab=49408
  ).eval()
  path = tmp_path / "uncha.pth"
  torch.save(refs.training_checkpoint(reference), path)
  return reference, path


def small_config():
  return refs.mu_config(
    uncha_config, "vit_s", image_variant="mu/8", image_num_heads=4, embed_dim=32
  )


def test_uncha_checkpoint_converts_and_embeds_like_pytorch(tmp_path, monkeypatch):
  reference, path = uncha_checkpoint(tmp_path)
  summary, model = refs.convert_and_restore(tmp_path, monkeypatch, "uncha", path, small_config())
  # Every tensor is accounted for; the unused scale and head are reported.
  assert summary["source_tensors"] == len(reference.state_dict())
  assert summary["ignored"] == [
    "logit_scale",
    "textual.min_radius_head.0.bias",
    "textual.min_radius_head.0.weight",
  ]
  params = refs.module_of(model)
  for ours, value in (
    ("log_logit_scale", SCALES["global"]),
    ("log_logit_scale_local", SCALES["local"]),
    ("log_logit_scale_global_local", SCALES["global_local"]),
  ):
    np.testing.assert_allclose(float(getattr(params, ours)[...]), math.log(value), rtol=1e-6)
  np.testing.assert_allclose(model.curv, 0.7, rtol=1e-6)
  image_error, text_error = refs.compare(
    model, reference, refs.images("generated"), refs.token_ids()
  )
  print(f"uncha: image {image_error:.2e}, text {text_error:.2e}")
  assert image_error < RELATIVE_TOLERANCE and text_error < RELATIVE_TOLERANCE, (
    image_error,
    text_error,
  )


def test_a_meru_file_is_not_an_uncha_checkpoint(tmp_path):
  torch.manual_seed(0)
  meru = refs.MeruReference(
    width=64, depth=2, heads=4, mlp_ratio=2, patch=8, embed_dim=32, vocab=49408, hyperbolic=True
  )
  path = tmp_path / "meru.pth"
  torch.save({"model": meru.state_dict()}, path)
  with pytest.raises(common.ConversionError, match="global_logit_scale"):
    workdir.convert_checkpoint("uncha", str(path), small_config(), str(tmp_path / "out"))
  assert not (tmp_path / "out").exists()


def test_a_run_exported_as_uncha_converts_back_and_safetensors_are_refused(tmp_path, monkeypatch):
  """release -> convert -> `export --format=uncha`: every tensor comes back
  bit for bit but the three the converter drops (written as an untrained
  release holds them: MERU's scale log(1/0.07), the head at zero) and the
  recomputed sin-cos table (float32 rounding of values in [-1, 1], as
  test_export's MERU round trip: 1e-6); `--source=uncha` reads the export.
  The run's own safetensors export is refused by the converter in one line
  that says what to pass instead."""
  from hyperbolic_vl import export

  reference, path = uncha_checkpoint(tmp_path)
  original = reference.state_dict()
  refs.stub_clip_bpe(monkeypatch)
  run = tmp_path / "converted"
  workdir.convert_checkpoint("uncha", str(path), small_config(), str(run))
  export.export_run(str(run), "uncha", str(tmp_path / "exported.pth"))
  exported = torch.load(tmp_path / "exported.pth", weights_only=True)["model"]
  assert set(exported) == set(original)
  dropped = {"logit_scale", "textual.min_radius_head.0.weight", "textual.min_radius_head.0.bias"}
  for name, value in original.items():
    if name == "visual.pos_embed":
      torch.testing.assert_close(exported[name], value, rtol=0, atol=1e-6)
    elif name not in dropped:
      assert torch.equal(exported[name], value), name
  assert exported["logit_scale"].item() == np.float32(math.log(1 / 0.07))
  assert not exported["textual.min_radius_head.0.weight"].any()
  summary = workdir.convert_checkpoint(
    "uncha", str(tmp_path / "exported.pth"), small_config(), str(tmp_path / "again")
  )
  assert summary["ignored"] == sorted(dropped)

  export.export_run(str(run), "safetensors", str(tmp_path / "run.safetensors"))
  with pytest.raises(common.ConversionError) as refused:
    workdir.convert_checkpoint(
      "uncha", str(tmp_path / "run.safetensors"), small_config(), str(tmp_path / "out")
    )
  assert "this package's own safetensors export" in str(refused.value)
  assert "--format=meru, uncha, open_clip or hysac" in str(refused.value)
  assert common.OWN_SAFETENSORS_FORMAT == export.SAFETENSORS_FORMAT
  assert not (tmp_path / "out").exists()
