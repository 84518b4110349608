"""Converters: random-weight PyTorch references -> run directory -> same outputs.

Each reference gets non-trivial values everywhere (every weight perturbed,
LayerNorm gains/biases away from 1/0, learned scalars away from their
inits), is saved in its release's format, converted with the converter the
command line uses, restored the way every reader of a run restores it
(`loading.restore_run_params`), and run on the same images and token ids.

Tolerance: float32 towers of depth 2 agree with PyTorch's to a few ulps per
op; 1e-4 relative (of the largest output) leaves a 100x margin over the
~1e-6 differences seen, while any layout error (a missing transpose, q/k/v
order, wrong positions or LayerNorm) gives O(1) differences.

Skipped without the `interop` extra (torch, open_clip, timm).
"""

import json
import math
import types

import numpy as np
import pytest
from paths import REPO

torch = pytest.importorskip("torch")
open_clip = pytest.importorskip("open_clip")
timm = pytest.importorskip("timm")

import hyperbolic_vl  # noqa: E402
from configs import clip as clip_config  # noqa: E402
from configs import meru as meru_config  # noqa: E402
from hyperbolic_vl.data import tokenizer as tokenizer_lib  # noqa: E402
from hyperbolic_vl.interop import common, workdir  # noqa: E402
from hyperbolic_vl.models import vit  # noqa: E402

ROOT = REPO
SAMPLE = next(
  (
    base / "shared" / "data" / "hierarcaps_sample"
    for base in (ROOT.parent, ROOT.parents[1])
    if (base / "shared" / "data" / "hierarcaps_sample").is_dir()
  ),
  None,
)
IMAGE_SIZE = 32
CONTEXT = 16
RELATIVE_TOLERANCE = 1e-4
CAPTIONS = [
  "A blue bird sitting on the top of a branch with autumn leaves",
  "table with three plates",
  "a dog",
  "",
]


# ---------------------------------------------------------------------------
# Inputs.
# ---------------------------------------------------------------------------
def images(source: str, size: int = IMAGE_SIZE, count: int = 4) -> np.ndarray:
  """(count, size, size, 3) float32 in [0, 1]: real COCO images or generated ones."""
  if source == "real":
    if SAMPLE is None:
      pytest.skip("HierarCaps sample images absent")
    from PIL import Image

    paths = sorted((SAMPLE / "images").glob("*.jpg"))[:count]
    return np.stack(
      [
        np.asarray(
          Image.open(p).convert("RGB").resize((size, size), Image.BICUBIC),
          np.float32,
        )
        / 255.0
        for p in paths
      ]
    )
  rng = np.random.default_rng(0)
  grid = np.linspace(0, 1, size, dtype=np.float32)
  gradient = grid[None, :, None, None] * grid[None, None, :, None]
  return np.clip(gradient + 0.3 * rng.random((count, size, size, 3)), 0, 1).astype(np.float32)


def token_ids() -> np.ndarray:
  """open_clip's BPE ids of the captions, (4, CONTEXT) int32."""
  return open_clip.tokenize(CAPTIONS, context_length=CONTEXT).numpy().astype(np.int32)


def perturb(module: "torch.nn.Module", seed: int) -> None:
  """Every parameter moved off its init; LayerNorm gains around 1."""
  generator = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for name, param in module.named_parameters():
      noise = torch.randn(param.shape, generator=generator)
      if param.ndim == 1 and ("norm" in name or "ln" in name) and name.endswith("weight"):
        param.copy_(1.0 + 0.2 * noise)
      elif param.ndim == 0:
        continue  # learned scalars are set by the caller
      else:
        param.add_(0.05 * noise)


def relative_error(ours, reference) -> float:
  ours, reference = np.asarray(ours, np.float64), np.asarray(reference, np.float64)
  return float(np.max(np.abs(ours - reference)) / np.max(np.abs(reference)))


# ---------------------------------------------------------------------------
# MERU-layout reference (timm ViT + MERU's text-module names).
# ---------------------------------------------------------------------------
def sincos_table_torch(width: int, grid: int) -> "torch.Tensor":
  """MoCo-v3's table written directly in torch (independent of ours)."""
  rows, cols = torch.meshgrid(
    torch.arange(grid, dtype=torch.float64), torch.arange(grid, dtype=torch.float64), indexing="ij"
  )
  quarter = width // 4
  omega = 1.0 / 10000.0 ** (torch.arange(quarter, dtype=torch.float64) / quarter)
  a = rows.flatten()[:, None] * omega
  b = cols.flatten()[:, None] * omega
  table = torch.cat([a.sin(), a.cos(), b.sin(), b.cos()], dim=1)
  return torch.cat([torch.zeros(1, width, dtype=torch.float64), table]).float()[None]


class MeruTextBlock(torch.nn.Module):
  def __init__(self, width, heads):
    super().__init__()
    self.attn = torch.nn.MultiheadAttention(width, heads, batch_first=True)
    self.ln_1 = torch.nn.LayerNorm(width)
    self.mlp = torch.nn.Sequential()
    self.mlp.add_module("c_fc", torch.nn.Linear(width, 4 * width))
    self.mlp.add_module("gelu", torch.nn.GELU())
    self.mlp.add_module("c_proj", torch.nn.Linear(4 * width, width))
    self.ln_2 = torch.nn.LayerNorm(width)

  def forward(self, x, mask):
    h = self.ln_1(x)
    x = x + self.attn(h, h, h, need_weights=False, attn_mask=mask)[0]
    return x + self.mlp(self.ln_2(x))


class MeruText(torch.nn.Module):
  def __init__(self, vocab, context, width, depth, heads):
    super().__init__()
    self.token_embed = torch.nn.Embedding(vocab, width)
    self.posit_embed = torch.nn.Parameter(torch.zeros(context, width))
    self.resblocks = torch.nn.ModuleList([MeruTextBlock(width, heads) for _ in range(depth)])
    self.ln_final = torch.nn.LayerNorm(width)
    self.register_buffer("attn_mask", torch.ones(context, context).triu(1).bool())

  def forward(self, tokens):
    length = tokens.shape[1]
    x = self.token_embed(tokens) + self.posit_embed[:length]
    for block in self.resblocks:
      x = block(x, self.attn_mask[:length, :length])
    x = self.ln_final(x)
    return x[torch.arange(x.shape[0]), tokens.argmax(-1)]


# MERU's released ViT-S model at full size (MoCo-v3's ViT-S has 12 heads),
# for the full-size benchmarks (benchmarks/interop_parity.py, export_round_trip.py).
MERU_VIT_S_SIZES = dict(
  width=384,
  depth=12,
  heads=12,
  mlp_ratio=4,
  patch=16,
  embed_dim=512,
  vocab=49408,
  image_size=224,
  context=77,
  text=(512, 12, 8),
)


class MeruReference(torch.nn.Module):
  """MERU (hyperbolic=True) or MERU's CLIP baseline, MERU's key names."""

  def __init__(
    self,
    *,
    width,
    depth,
    heads,
    mlp_ratio,
    patch,
    embed_dim,
    vocab,
    hyperbolic,
    image_size=IMAGE_SIZE,
    context=CONTEXT,
    text=(64, 2, 2),  # width, depth, heads
  ):
    super().__init__()
    from timm.models.vision_transformer import VisionTransformer

    self.visual = VisionTransformer(
      img_size=image_size,
      patch_size=patch,
      embed_dim=width,
      depth=depth,
      num_heads=heads,
      mlp_ratio=mlp_ratio,
      num_classes=0,
      global_pool="token",
      norm_layer=torch.nn.LayerNorm,
    )
    self.textual = MeruText(vocab, context, *text)
    self.visual_proj = torch.nn.Linear(width, embed_dim, bias=False)
    self.textual_proj = torch.nn.Linear(text[0], embed_dim, bias=False)
    self.logit_scale = torch.nn.Parameter(torch.tensor(math.log(1 / 0.05)))
    self.hyperbolic = hyperbolic
    if hyperbolic:
      self.curv = torch.nn.Parameter(torch.tensor(math.log(0.7)))
      self.visual_alpha = torch.nn.Parameter(torch.tensor(math.log(0.3)))
      self.textual_alpha = torch.nn.Parameter(torch.tensor(math.log(0.45)))
    self.register_buffer("pixel_mean", torch.tensor(vit.IMAGENET_MEAN).view(-1, 1, 1))
    self.register_buffer("pixel_std", torch.tensor(vit.IMAGENET_STD).view(-1, 1, 1))
    perturb(self, seed=1)
    with torch.no_grad():  # MERU's frozen sin-cos positions, after the perturbation
      self.visual.pos_embed.copy_(sincos_table_torch(width, image_size // patch))

  def lift(self, x, alpha):
    if not self.hyperbolic:
      return x
    x = x * alpha.exp()
    curv = self.curv.exp()
    norm = curv.sqrt() * x.norm(dim=-1, keepdim=True)
    # MERU's exp map clamps the radius inside sinh at asinh(2^15) (float32
    # overflow guard); full-size random towers reach it on texts.
    return torch.sinh(norm.clamp(max=math.asinh(2**15))) * x / norm

  def encode_image(self, images):
    pixels = (images - self.pixel_mean) / self.pixel_std
    feats = self.visual_proj(self.visual(pixels))
    return self.lift(feats, getattr(self, "visual_alpha", None))

  def encode_text(self, tokens):
    feats = self.textual_proj(self.textual(tokens))
    return self.lift(feats, getattr(self, "textual_alpha", None))


def mu_config(module, variant, **model):
  """A paper-layout config shrunk to the reference's sizes, its compute
  dtype kept (the paper configs' bfloat16 towers): the documented convert
  command's config, smaller."""
  config = module.get_config(variant)
  with config.unlocked():
    config.input.image_size = IMAGE_SIZE
    config.input.tokenizer.context_length = CONTEXT
    config.model.update(dict(text_variant="mu", **model))
  return config


def stub_clip_bpe(monkeypatch):
  """restore_params builds the run's tokenizer; the released runs name
  clip_bpe, which only sizes the model here (ids come from open_clip)."""
  real = tokenizer_lib.get_tokenizer

  def get_tokenizer(tok_config):
    if tok_config.get("name") == "clip_bpe":
      return types.SimpleNamespace(
        vocab_size=int(tok_config["vocab_size"]),
        context_length=int(tok_config["context_length"]),
      )
    return real(tok_config)

  monkeypatch.setattr(tokenizer_lib, "get_tokenizer", get_tokenizer)


def convert_and_restore(tmp_path, monkeypatch, source, checkpoint, config, dtype="float32"):
  """The documented path: convert, then `hyperbolic_vl.load` (float32
  inference by default, whatever the config's towers train in). Returns the
  conversion summary and the loaded model."""
  stub_clip_bpe(monkeypatch)
  out = tmp_path / "converted"
  summary = workdir.convert_checkpoint(source, str(checkpoint), config, str(out))
  assert sorted(p.name for p in out.iterdir()) == ["checkpoints", "config.json"]
  loaded = hyperbolic_vl.load(out) if dtype == "float32" else hyperbolic_vl.load(out, dtype=dtype)
  assert loaded.config.input.tokenizer.name == "clip_bpe"
  assert loaded.config.model.dtype == config.model.dtype  # the run keeps its training dtype
  return summary, loaded


def module_of(loaded):
  """The loaded model's NNX module (its params), for checks of scalars."""
  return loaded.model_def.merge(loaded.params)


def compare(loaded, reference, pixels, tokens):
  with torch.no_grad():
    ref_images = reference.encode_image(torch.from_numpy(pixels).permute(0, 3, 1, 2)).numpy()
    ref_texts = reference.encode_text(torch.from_numpy(tokens).long()).numpy()
  errors = (
    relative_error(loaded.encode_images(pixels), ref_images),
    relative_error(loaded.encode_tokens(tokens), ref_texts),
  )
  return errors


@pytest.mark.parametrize("image_source", ["generated", "real"])
@pytest.mark.parametrize("hyperbolic", [True, False], ids=["meru", "meru_clip"])
def test_meru_checkpoint_matches_pytorch(tmp_path, monkeypatch, image_source, hyperbolic):
  pixels = images(image_source)
  torch.manual_seed(0)
  reference = MeruReference(
    width=64,
    depth=2,
    heads=4,
    mlp_ratio=2,
    patch=8,
    embed_dim=32,
    vocab=49408,
    hyperbolic=hyperbolic,
  ).eval()
  checkpoint = tmp_path / "meru.pth"
  torch.save({"model": reference.state_dict(), "optimizer": {}}, checkpoint)
  config = mu_config(
    meru_config if hyperbolic else clip_config,
    "vit_s",
    image_variant="mu/8",
    image_num_heads=4,
    embed_dim=32,
  )
  _, model = convert_and_restore(tmp_path, monkeypatch, "meru", checkpoint, config)
  if hyperbolic:
    np.testing.assert_allclose(model.curv, 0.7, rtol=1e-6)
  image_error, text_error = compare(model, reference, pixels, token_ids())
  assert image_error < RELATIVE_TOLERANCE and text_error < RELATIVE_TOLERANCE, (
    image_error,
    text_error,
  )


def open_clip_reference(embed_dim=32):
  """open_clip's CLIP class in the OpenAI layout (QuickGELU), depth 2."""
  model = open_clip.model.CLIP(
    embed_dim=embed_dim,
    vision_cfg=open_clip.model.CLIPVisionCfg(
      layers=2, width=64, head_width=32, mlp_ratio=2.0, patch_size=8, image_size=IMAGE_SIZE
    ),
    text_cfg=open_clip.model.CLIPTextCfg(
      context_length=CONTEXT, vocab_size=49408, width=64, heads=2, layers=2
    ),
    quick_gelu=True,
  )
  perturb(model, seed=2)
  with torch.no_grad():
    model.logit_scale.fill_(math.log(1 / 0.03))
  return model.eval()


class NormalisedOpenClip:
  """open_clip's encoders on [0, 1] pixels (its preprocessing normalises)."""

  def __init__(self, model):
    self.model = model
    self.mean = torch.tensor(vit.OPENAI_MEAN).view(1, 3, 1, 1)
    self.std = torch.tensor(vit.OPENAI_STD).view(1, 3, 1, 1)

  def encode_image(self, images):
    return self.model.encode_image((images - self.mean) / self.std)

  def encode_text(self, tokens):
    return self.model.encode_text(tokens)


def openai_mu_config(embed_dim=32):
  return mu_config(
    clip_config, "openai_vit_b32", image_variant="mu/8", embed_dim=embed_dim, image_num_heads=2
  )


@pytest.mark.parametrize("image_source", ["generated", "real"])
def test_open_clip_checkpoint_matches_pytorch(tmp_path, monkeypatch, image_source):
  pixels = images(image_source)
  torch.manual_seed(0)
  reference = open_clip_reference()
  checkpoint = tmp_path / "open_clip.pt"
  torch.save(reference.state_dict(), checkpoint)
  _, model = convert_and_restore(tmp_path, monkeypatch, "open_clip", checkpoint, openai_mu_config())
  np.testing.assert_allclose(float(module_of(model).logit_scale()), 1 / 0.03, rtol=1e-5)
  image_error, text_error = compare(model, NormalisedOpenClip(reference), pixels, token_ids())
  assert image_error < RELATIVE_TOLERANCE and text_error < RELATIVE_TOLERANCE, (
    image_error,
    text_error,
  )


def test_safetensors_file_converts_like_the_torch_file(tmp_path, monkeypatch):
  from safetensors.torch import save_file

  reference = open_clip_reference()
  checkpoint = tmp_path / "open_clip.safetensors"
  save_file({k: v.contiguous() for k, v in reference.state_dict().items()}, str(checkpoint))
  _, model = convert_and_restore(tmp_path, monkeypatch, "open_clip", checkpoint, openai_mu_config())
  image_error, text_error = compare(
    model, NormalisedOpenClip(reference), images("generated"), token_ids()
  )
  assert image_error < RELATIVE_TOLERANCE and text_error < RELATIVE_TOLERANCE


# ---------------------------------------------------------------------------
# Refusals: nothing is written.
# ---------------------------------------------------------------------------
def test_wrong_config_names_the_mismatching_tensors(tmp_path):
  reference = open_clip_reference()
  checkpoint = tmp_path / "open_clip.pt"
  torch.save(reference.state_dict(), checkpoint)
  config = openai_mu_config()
  with config.unlocked():
    config.model.image_variant = "Ti/8"  # width 192, depth 12: not this checkpoint
  out = tmp_path / "out"
  with pytest.raises(common.ConversionError) as info:
    workdir.convert_checkpoint("open_clip", str(checkpoint), config, str(out))
  message = str(info.value)
  assert "image_tower/patch_embed/kernel" in message and "(8, 8, 3, 64)" in message
  assert "config expects (8, 8, 3, 192)" in message
  assert "model parameters got no value" in message  # blocks 2..11
  assert not out.exists() and [p.name for p in tmp_path.iterdir()] == ["open_clip.pt"]


def test_unknown_tensor_fails_unless_ignored_and_then_is_reported(tmp_path, monkeypatch):
  state = open_clip_reference().state_dict()
  state["extra_head.weight"] = torch.ones(3)
  checkpoint = tmp_path / "extra.pt"
  torch.save(state, checkpoint)
  with pytest.raises(common.ConversionError, match=r"left unused: extra_head\.weight"):
    workdir.convert_checkpoint(
      "open_clip", str(checkpoint), openai_mu_config(), str(tmp_path / "a")
    )
  assert not (tmp_path / "a").exists()
  stub_clip_bpe(monkeypatch)
  summary = workdir.convert_checkpoint(
    "open_clip", str(checkpoint), openai_mu_config(), str(tmp_path / "b"), ignore=(r"extra_.*",)
  )
  assert summary["ignored"] == ["extra_head.weight"]


def test_truncated_file_fails_clearly(tmp_path):
  checkpoint = tmp_path / "open_clip.pt"
  torch.save(open_clip_reference().state_dict(), checkpoint)
  data = checkpoint.read_bytes()
  checkpoint.write_bytes(data[: len(data) // 2])
  out = tmp_path / "out"
  with pytest.raises(common.ConversionError, match="truncated or corrupt"):
    workdir.convert_checkpoint("open_clip", str(checkpoint), openai_mu_config(), str(out))
  assert not out.exists()


def test_learned_positions_in_a_meru_file_are_refused_for_a_sincos_config(tmp_path):
  torch.manual_seed(0)
  reference = MeruReference(
    width=64, depth=2, heads=4, mlp_ratio=2, patch=8, embed_dim=32, vocab=49408, hyperbolic=True
  )
  with torch.no_grad():
    reference.visual.pos_embed.add_(0.01)
  checkpoint = tmp_path / "meru.pth"
  torch.save({"model": reference.state_dict()}, checkpoint)
  config = mu_config(meru_config, "vit_s", image_variant="mu/8", embed_dim=32, image_num_heads=4)
  with pytest.raises(common.ConversionError, match="visual.pos_embed: not the frozen 2D sin-cos"):
    workdir.convert_checkpoint("meru", str(checkpoint), config, str(tmp_path / "out"))


# ---------------------------------------------------------------------------
# ATMG and HyCoCLIP releases: MERU's keys, in a training checkpoint.
# ---------------------------------------------------------------------------
def training_checkpoint(reference) -> dict:
  """MERU's, ATMG's and HyCoCLIP's checkpoint_*.pth: the weights under
  "model" beside the training state, which the converter must not read."""
  weights = reference.state_dict()
  return {
    "model": weights,
    "optimizer": {"state": {0: {"exp_avg": torch.ones(3)}}, "param_groups": [{"lr": 5e-4}]},
    "scheduler": {"last_epoch": 500000},
    "scaler": {"scale": 65536.0},
    "iteration": 500000,
  }


# A bfloat16 tower rounds every matmul input to 8 significant bits (unit
# roundoff 2^-9 ~ 2e-3); through depth-2 towers, LayerNorms and the exp map
# the outputs then differ from float32 PyTorch by a few of those units (6e-3
# seen): 2e-2 (10 units) bounds that, while a layout error stays O(1).
BFLOAT16_RELATIVE_TOLERANCE = 2e-2


def release_config(release: str):
  """The config each release is converted with (docs/interop.md), shrunk to
  the reference's sizes, its own compute dtype kept."""
  from configs import atmg as atmg_config
  from configs import hycoclip as hycoclip_config

  module = {"atmg": atmg_config, "hycoclip": hycoclip_config}[release]
  return mu_config(module, "vit_s", image_variant="mu/8", image_num_heads=4, embed_dim=32)


@pytest.mark.parametrize(
  "release, inference_dtype",
  [
    ("atmg", "float32"),
    # configs/hycoclip.py:vit_s as documented (bfloat16 towers for training),
    # loaded as documented: float32 inference by default, or bfloat16.
    ("hycoclip", "float32"),
    ("hycoclip", "bfloat16"),
  ],
)
def test_atmg_and_hycoclip_checkpoints_match_pytorch(
  tmp_path, monkeypatch, release, inference_dtype
):
  torch.manual_seed(0)
  reference = MeruReference(
    width=64, depth=2, heads=4, mlp_ratio=2, patch=8, embed_dim=32, vocab=49408, hyperbolic=True
  ).eval()
  if release == "atmg":  # fixed curvature 0.1, as released
    with torch.no_grad():
      reference.curv.fill_(math.log(0.1))
  checkpoint = tmp_path / f"{release}.pth"
  torch.save(training_checkpoint(reference), checkpoint)
  config = release_config(release)
  summary, model = convert_and_restore(
    tmp_path, monkeypatch, "meru", checkpoint, config, dtype=inference_dtype
  )
  written = json.loads((tmp_path / "converted" / "config.json").read_text())
  assert written["model"]["dtype"] == config.model.dtype  # the run trains as its config says
  # Every tensor of the state dict is used: no --ignore is needed.
  assert summary["ignored"] == [] and summary["source_tensors"] == len(reference.state_dict())
  np.testing.assert_allclose(model.curv, 0.1 if release == "atmg" else 0.7, rtol=1e-6)
  image_error, text_error = compare(model, reference, images("generated"), token_ids())
  print(
    f"{release} ({config.model.dtype}, {inference_dtype}): image {image_error:.2e}, text {text_error:.2e}"
  )
  tolerance = RELATIVE_TOLERANCE if inference_dtype == "float32" else BFLOAT16_RELATIVE_TOLERANCE
  assert image_error < tolerance and text_error < tolerance, (image_error, text_error)


def test_atmg_fixed_curvature_must_match_the_config(tmp_path):
  from configs import atmg as atmg_config

  torch.manual_seed(0)
  reference = MeruReference(
    width=64, depth=2, heads=4, mlp_ratio=2, patch=8, embed_dim=32, vocab=49408, hyperbolic=True
  )  # curvature 0.7; the ATMG config fixes 0.1
  checkpoint = tmp_path / "atmg.pth"
  torch.save(training_checkpoint(reference), checkpoint)
  config = mu_config(atmg_config, "vit_s", image_variant="mu/8", image_num_heads=4, embed_dim=32)
  with pytest.raises(common.ConversionError, match=r"curv: the checkpoint's curvature differs"):
    workdir.convert_checkpoint("meru", str(checkpoint), config, str(tmp_path / "out"))
  assert not (tmp_path / "out").exists()
