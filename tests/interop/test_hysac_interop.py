"""HySAC's released layout (`hysac_model.pth`) in and out.

A random-weight HySAC model is built here in PyTorch (Hugging Face CLIP's
module names and forward, written from torch ops since `transformers` and
`peft` are not dependencies; PEFT's LoRA wrappers on k, v, out, fc1, fc2
and the patch embedding), saved in both PEFT namings, converted with the
command line's converter (adapters kept as ours, or merged) and compared
with the PyTorch forward: float32, 1e-5 relative (of the largest output).
Float32 towers of depth 2 agree with PyTorch to ~1e-6; a layout error (a
transpose, the patch adapter's flatten order, a scalar's log space) gives
O(1) differences. Export writes the run back; re-import gives the same
params exactly."""

import json
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

import hyperbolic_vl  # noqa: E402
from configs import hysac as hysac_config  # noqa: E402
from hyperbolic_vl import export  # noqa: E402
from hyperbolic_vl.evaluators.metrics import safety  # noqa: E402
from hyperbolic_vl.interop import common, workdir  # noqa: E402
from hyperbolic_vl.models import vit  # noqa: E402

IMAGE, PATCH, WIDTH, HEADS, DEPTH, EMBED, RANK = 32, 8, 64, 2, 2, 32, 16
CONTEXT, VOCAB = 16, 49408
TOLERANCE = 1e-5


def quick_gelu(x):
  return x * torch.sigmoid(1.702 * x)


class LoraLinear(nn.Module):
  """PEFT's Linear wrapper (>= 0.7 names): base_layer, lora_A/B.default."""

  def __init__(self, fan_in, fan_out, bias=True):
    super().__init__()
    self.base_layer = nn.Linear(fan_in, fan_out, bias=bias)
    self.lora_A = nn.ModuleDict({"default": nn.Linear(fan_in, RANK, bias=False)})
    self.lora_B = nn.ModuleDict({"default": nn.Linear(RANK, fan_out, bias=False)})

  def forward(self, x):
    return self.base_layer(x) + self.lora_B["default"](self.lora_A["default"](x)) / RANK


class LoraPatch(nn.Module):
  """PEFT's Conv2d wrapper on the patch embedding."""

  def __init__(self):
    super().__init__()
    self.base_layer = nn.Conv2d(3, WIDTH, PATCH, stride=PATCH, bias=False)
    self.lora_A = nn.ModuleDict({"default": nn.Conv2d(3, RANK, PATCH, stride=PATCH, bias=False)})
    self.lora_B = nn.ModuleDict({"default": nn.Conv2d(RANK, WIDTH, 1, bias=False)})

  def forward(self, x):
    return self.base_layer(x) + self.lora_B["default"](self.lora_A["default"](x)) / RANK


class Attention(nn.Module):
  def __init__(self):
    super().__init__()
    self.q_proj = nn.Linear(WIDTH, WIDTH)  # not adapted in the release
    self.k_proj, self.v_proj = LoraLinear(WIDTH, WIDTH), LoraLinear(WIDTH, WIDTH)
    self.out_proj = LoraLinear(WIDTH, WIDTH)

  def forward(self, x, mask):
    b, n, _ = x.shape
    split = lambda t: t.view(b, n, HEADS, WIDTH // HEADS).transpose(1, 2)
    q = split(self.q_proj(x)) * (WIDTH // HEADS) ** -0.5
    weights = q @ split(self.k_proj(x)).transpose(-1, -2)
    if mask is not None:
      weights = weights + mask
    attended = torch.softmax(weights, dim=-1) @ split(self.v_proj(x))
    return self.out_proj(attended.transpose(1, 2).reshape(b, n, WIDTH))


class Layer(nn.Module):
  def __init__(self, mlp):
    super().__init__()
    self.layer_norm1, self.layer_norm2 = nn.LayerNorm(WIDTH), nn.LayerNorm(WIDTH)
    self.self_attn = Attention()
    self.mlp = nn.Module()
    self.mlp.fc1, self.mlp.fc2 = LoraLinear(WIDTH, mlp), LoraLinear(mlp, WIDTH)

  def forward(self, x, mask=None):
    x = x + self.self_attn(self.layer_norm1(x), mask)
    return x + self.mlp.fc2(quick_gelu(self.mlp.fc1(self.layer_norm2(x))))


class Encoder(nn.Module):
  def __init__(self, mlp):
    super().__init__()
    self.layers = nn.ModuleList([Layer(mlp) for _ in range(DEPTH)])


class VisionModel(nn.Module):
  """CLIPVisionModelWithProjection: vision_model.* and visual_projection."""

  def __init__(self):
    super().__init__()
    self.vision_model = nn.Module()
    m = self.vision_model
    m.embeddings = nn.Module()
    m.embeddings.patch_embedding = LoraPatch()
    m.embeddings.class_embedding = nn.Parameter(torch.randn(WIDTH))
    m.embeddings.position_embedding = nn.Embedding((IMAGE // PATCH) ** 2 + 1, WIDTH)
    m.pre_layrnorm, m.post_layernorm = nn.LayerNorm(WIDTH), nn.LayerNorm(WIDTH)
    m.encoder = Encoder(2 * WIDTH)
    self.visual_projection = nn.Linear(WIDTH, EMBED, bias=False)

  def forward(self, pixels):
    m = self.vision_model
    x = m.embeddings.patch_embedding(pixels).flatten(2).transpose(1, 2)
    cls = m.embeddings.class_embedding.expand(x.shape[0], 1, WIDTH)
    x = torch.cat([cls, x], dim=1) + m.embeddings.position_embedding.weight
    x = m.pre_layrnorm(x)
    for layer in m.encoder.layers:
      x = layer(x)
    return self.visual_projection(m.post_layernorm(x[:, 0]))


class TextModel(nn.Module):
  """CLIPTextModelWithProjection: text_model.* and text_projection."""

  def __init__(self):
    super().__init__()
    self.text_model = nn.Module()
    m = self.text_model
    m.embeddings = nn.Module()
    m.embeddings.token_embedding = nn.Embedding(VOCAB, WIDTH)
    m.embeddings.position_embedding = nn.Embedding(CONTEXT, WIDTH)
    m.encoder = Encoder(4 * WIDTH)
    m.final_layer_norm = nn.LayerNorm(WIDTH)
    self.text_projection = nn.Linear(WIDTH, EMBED, bias=False)

  def forward(self, ids):
    m = self.text_model
    x = m.embeddings.token_embedding(ids) + m.embeddings.position_embedding.weight
    mask = torch.full((CONTEXT, CONTEXT), float("-inf")).triu(1)
    for layer in m.encoder.layers:
      x = layer(x, mask)
    x = m.final_layer_norm(x)
    return self.text_projection(x[torch.arange(x.shape[0]), ids.argmax(-1)])


class HysacReference(nn.Module):
  """hysac/models.py's HySAC: alpha-scaled features lifted by exp_map0."""

  def __init__(self):
    super().__init__()
    self.visual, self.textual = VisionModel(), TextModel()
    self.logit_scale = nn.Parameter(torch.tensor(math.log(20.0)))
    self.curv = nn.Parameter(torch.tensor(math.log(0.8)))
    self.visual_alpha = nn.Parameter(torch.tensor(math.log(0.3)))
    self.textual_alpha = nn.Parameter(torch.tensor(math.log(0.2)))
    self.register_buffer("pixel_mean", torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1))
    self.register_buffer("pixel_std", torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1))

  def lift(self, feats, alpha):
    x = feats * alpha.exp()
    curv = self.curv.exp()
    norm = curv**0.5 * x.norm(dim=-1, keepdim=True)
    return torch.sinh(norm.clamp(1e-8, math.asinh(2**15))) * x / norm.clamp(min=1e-8)

  def encode_image(self, images):  # [0, 1] pixels; CLIPProcessor normalises with OpenAI's stats
    mean = torch.tensor(vit.OPENAI_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(vit.OPENAI_STD).view(1, 3, 1, 1)
    return self.lift(self.visual((images - mean) / std), self.visual_alpha)

  def encode_text(self, ids):
    return self.lift(self.textual(ids), self.textual_alpha)


def release_state_dict(model, naming):
  """The model's state dict under the release's keys, in one PEFT naming."""
  out = {}
  for name, value in model.state_dict().items():
    for tower in ("visual", "textual"):
      if name.startswith(tower + "."):
        name = f"{tower}.base_model.model.{name[len(tower) + 1 :]}"
    if naming == "plain":
      name = name.replace(".base_layer.", ".")
    out[name] = value.clone()
  return out


@pytest.fixture(scope="module")
def reference():
  torch.manual_seed(0)
  model = HysacReference()
  generator = torch.Generator().manual_seed(1)
  with torch.no_grad():  # every weight off its init, LayerNorm gains around 1
    for name, param in model.named_parameters():
      if param.ndim == 0:
        continue
      noise = torch.randn(param.shape, generator=generator)
      if "norm" in name and name.endswith("weight"):
        param.copy_(1.0 + 0.2 * noise)
      elif "lora_B" in name:
        param.copy_(0.3 * noise)  # PEFT starts B at 0: trained adapters are not
      else:
        param.add_(0.05 * noise)
  return model.eval()


def inputs():
  rng = np.random.default_rng(0)
  pixels = rng.uniform(size=(3, IMAGE, IMAGE, 3)).astype(np.float32)
  ids = np.zeros((3, CONTEXT), np.int32)
  for row, length in enumerate((5, 11, 15)):
    ids[row, 0] = VOCAB - 2
    ids[row, 1:length] = rng.integers(1, VOCAB - 2, size=length - 1)
    ids[row, length] = VOCAB - 1  # EOT: the largest id
  return pixels, ids


def tiny_config(lora: bool):
  config = hysac_config.get_config("vit_b32")
  with config.unlocked():
    config.input.image_size = IMAGE
    config.input.tokenizer.context_length = CONTEXT
    config.model.update(
      dict(image_variant=f"mu/{PATCH}", text_variant="mu", embed_dim=EMBED, image_num_heads=HEADS)
    )
    if not lora:
      config.model.lora.rank = 0
  return config


def relative_error(ours, theirs):
  ours, theirs = np.asarray(ours, np.float64), np.asarray(theirs, np.float64)
  return float(np.max(np.abs(ours - theirs)) / np.max(np.abs(theirs)))


@pytest.mark.parametrize("naming", ["base_layer", "plain"])
@pytest.mark.parametrize("lora", [True, False], ids=["adapters_kept", "adapters_merged"])
def test_release_checkpoint_matches_the_pytorch_forward(
  reference, naming, lora, tmp_path, monkeypatch
):
  _stub_tokenizer(monkeypatch)
  checkpoint = tmp_path / "hysac_model.pth"
  torch.save(release_state_dict(reference, naming), checkpoint)
  bounds = {k: {"up_95": 1.5, "low_05": 0.5, "avg": 1.0} for k in "VSGU"}
  (tmp_path / "hysac_bounds.json").write_text(json.dumps(bounds))
  out = tmp_path / "run"
  workdir.convert_checkpoint(
    "hysac",
    str(checkpoint),
    tiny_config(lora),
    str(out),
    bounds=str(tmp_path / "hysac_bounds.json"),
  )
  model = hyperbolic_vl.load(out)
  pixels, ids = inputs()
  with torch.no_grad():
    images = reference.encode_image(torch.from_numpy(pixels).permute(0, 3, 1, 2)).numpy()
    texts = reference.encode_text(torch.from_numpy(ids).long()).numpy()
  errors = (
    relative_error(model.encode_images(pixels), images),
    relative_error(model.encode_tokens(ids), texts),
  )
  assert max(errors) < TOLERANCE, errors
  np.testing.assert_allclose(model.curv, 0.8, rtol=1e-6)
  module = model.model_def.merge(model.params)
  np.testing.assert_allclose(float(module.logit_scale()), 20.0, rtol=1e-6)
  assert model.safety_bounds() == safety.check_bounds(bounds)


def test_export_writes_the_release_layout_and_reimports_exactly(reference, tmp_path, monkeypatch):
  _stub_tokenizer(monkeypatch)
  checkpoint = tmp_path / "hysac_model.pth"
  released = release_state_dict(reference, "base_layer")
  torch.save(released, checkpoint)
  first = tmp_path / "first"
  workdir.convert_checkpoint("hysac", str(checkpoint), tiny_config(True), str(first))
  (first / "hysac_bounds.json").write_text(
    json.dumps({k: {"up_95": 2.0, "low_05": 0.1, "avg": 1.0} for k in "VSGU"})
  )
  exported = tmp_path / "out" / "hysac_model.pth"
  export.export_run(str(first), "hysac", str(exported))
  tensors = torch.load(exported)
  # The release's keys exactly (PEFT >= 0.7 naming), values bit for bit.
  assert sorted(tensors) == sorted(released)
  for name, value in released.items():
    assert torch.equal(tensors[name], value), name
  assert (tmp_path / "out" / "hysac_bounds.json").is_file()
  second = tmp_path / "second"
  workdir.convert_checkpoint("hysac", str(exported), tiny_config(True), str(second))
  one, two = hyperbolic_vl.load(first), hyperbolic_vl.load(second)
  flat_one, flat_two = common.flatten(one.params), common.flatten(two.params)
  assert sorted(flat_one) == sorted(flat_two)
  for name in flat_one:
    np.testing.assert_array_equal(np.asarray(flat_one[name]), np.asarray(flat_two[name]), name)


def test_a_file_that_is_not_hysac_fails_naming_the_keys(tmp_path):
  checkpoint = tmp_path / "other.pth"
  torch.save({"model.weight": torch.zeros(2)}, checkpoint)
  with pytest.raises(common.ConversionError, match="not a HySAC state dict"):
    workdir.convert_checkpoint("hysac", str(checkpoint), tiny_config(True), str(tmp_path / "r"))


def _stub_tokenizer(monkeypatch):
  """The converted run names clip_bpe, which only sizes the model here."""
  import types

  from hyperbolic_vl.data import tokenizer as tokenizer_lib

  real = tokenizer_lib.get_tokenizer

  def get_tokenizer(tok_config):
    if tok_config.get("name") == "clip_bpe":
      return types.SimpleNamespace(
        vocab_size=int(tok_config["vocab_size"]), context_length=int(tok_config["context_length"])
      )
    return real(tok_config)

  monkeypatch.setattr(tokenizer_lib, "get_tokenizer", get_tokenizer)
