"""HAC's released layout (`hac_vit_b_lora.pth`) in and out.

A random-weight state dict in HAC's layout (hyperbolic_vl/interop/hac.py's
docstring: PEFT-wrapped MERU towers with split q/k/v/proj attention, LoRA on
block 1 of each tower, block 0 excluded, rank-stabilised scale) is written
as the release's `{"model": ...}` file, converted with the command line's
converter (adapters kept for configs/hac.py; merged for a config without
LoRA, which the push tier checks as the kept params folded, the slow tier
by its forward) and compared with a float64 PyTorch forward written from the release
(timm's ViT with PlainTimmAttention, hac/utils/plain_mha.py:10-59; the text
tower hac/encoders/text_encoders.py:207-238 in eval mode, no NEFTune; PEFT's
LoRA Linear base(x) + (alpha / sqrt(r)) B A x; AdaptedCLIP.encode_* and
project_*, hac/models.py:650-723). Our float32 towers of depth 2 agree to
~1e-6 relative; 1e-4 leaves a 100x margin while a layout error (q/k/v order,
a transpose, an adapter on the wrong block, alpha/r for alpha/sqrt(r)) gives
O(1e-2) or more. Export writes the run back: the same keys and shapes as
the release's file (what a strict load_state_dict checks), the same values.
"""

import math

import jax
import numpy as np
import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

import hyperbolic_vl  # noqa: E402
from configs import hac as hac_config  # noqa: E402
from hyperbolic_vl import export  # noqa: E402
from hyperbolic_vl.interop import common, workdir  # noqa: E402
from hyperbolic_vl.models import lora, vit  # noqa: E402

IMAGE, PATCH, WIDTH, HEADS, DEPTH, EMBED, RANK, ALPHA = 32, 8, 64, 4, 2, 32, 4, 128.0
TEXT_HEADS, CONTEXT, VOCAB = 2, 16, 49408
TOLERANCE = 1e-4
SCALE = ALPHA / math.sqrt(RANK)  # use_rslora


def _attention_names(prefix, adapted):
  names = {}
  for proj in ("q_proj", "k_proj", "v_proj", "proj"):
    base = f"{prefix}attn.{proj}." + ("base_layer." if adapted else "")
    names[base + "weight"] = (WIDTH, WIDTH)
    names[base + "bias"] = (WIDTH,)
    if adapted:
      names[f"{prefix}attn.{proj}.lora_A.default.weight"] = (RANK, WIDTH)
      names[f"{prefix}attn.{proj}.lora_B.default.weight"] = (WIDTH, RANK)
  return names


def release_shapes():
  """{name: shape} of HAC's state dict at the test's size."""
  visual, textual = "visual.base_model.model.", "textual.base_model.model."
  shapes = {
    f"{visual}cls_token": (1, 1, WIDTH),
    f"{visual}pos_embed": (1, 1 + (IMAGE // PATCH) ** 2, WIDTH),
    f"{visual}patch_embed.proj.weight": (WIDTH, 3, PATCH, PATCH),
    f"{visual}patch_embed.proj.bias": (WIDTH,),
    f"{visual}norm.weight": (WIDTH,),
    f"{visual}norm.bias": (WIDTH,),
    f"{textual}token_embed.weight": (VOCAB, WIDTH),
    f"{textual}posit_embed": (CONTEXT, WIDTH),
    f"{textual}ln_final.weight": (WIDTH,),
    f"{textual}ln_final.bias": (WIDTH,),
    f"{textual}attn_mask": (CONTEXT, CONTEXT),
    "visual_proj.weight": (EMBED, WIDTH),
    "textual_proj.weight": (EMBED, WIDTH),
    "logit_scale": (),
    "curv": (),
    "visual_alpha": (),
    "textual_alpha": (),
    "pixel_mean": (3, 1, 1),
    "pixel_std": (3, 1, 1),
  }
  for i in range(DEPTH):
    for prefix, norms, mlp in (
      (f"{visual}blocks.{i}.", ("norm1", "norm2"), ("mlp.fc1", "mlp.fc2")),
      (f"{textual}resblocks.{i}.", ("ln_1", "ln_2"), ("mlp.c_fc", "mlp.c_proj")),
    ):
      shapes.update(_attention_names(prefix, adapted=i >= 1))
      for norm in norms:
        shapes[f"{prefix}{norm}.weight"] = shapes[f"{prefix}{norm}.bias"] = (WIDTH,)
      # MLP widths: "mu/8"'s ViT 2 D, the text tower always 4 D.
      hidden = 2 * WIDTH if prefix.startswith("visual") else 4 * WIDTH
      shapes[f"{prefix}{mlp[0]}.weight"] = (hidden, WIDTH)
      shapes[f"{prefix}{mlp[0]}.bias"] = (hidden,)
      shapes[f"{prefix}{mlp[1]}.weight"] = (WIDTH, hidden)
      shapes[f"{prefix}{mlp[1]}.bias"] = (WIDTH,)
  return shapes


def release_state_dict(seed=0):
  """Random float64 values in every slot (LayerNorm gains near 1, the
  scalars away from their inits), the buffers as HAC's model holds them."""
  rng = np.random.default_rng(seed)
  state = {}
  for name, shape in release_shapes().items():
    fan_in = shape[-1] if shape else 1
    std = 0.02 if "token_embed" in name or "lora_B" in name else 0.3 / math.sqrt(fan_in)
    value = rng.normal(0.0, std, size=shape)
    if name.endswith(("norm1.weight", "norm2.weight", "ln_1.weight", "ln_2.weight")) or (
      name.endswith(("norm.weight", "ln_final.weight"))
    ):
      value = 1.0 + 0.1 * rng.normal(size=shape)
    state[name] = value
  state["visual.base_model.model.pos_embed"] = vit.sincos_2d_position_embedding(
    WIDTH, IMAGE // PATCH
  )[None].astype(np.float64)
  state["textual.base_model.model.attn_mask"] = np.triu(np.ones((CONTEXT, CONTEXT), bool), k=1)
  state.update(
    logit_scale=np.asarray(math.log(20.0)),
    curv=np.asarray(math.log(0.8)),
    visual_alpha=np.asarray(math.log(0.2)),
    textual_alpha=np.asarray(math.log(0.3)),
    pixel_mean=np.asarray(vit.IMAGENET_MEAN).reshape(3, 1, 1),
    pixel_std=np.asarray(vit.IMAGENET_STD).reshape(3, 1, 1),
  )
  return state


def _linear(state, module, x):
  """PEFT's LoRA Linear (rank-stabilised), or a plain Linear."""
  t = lambda name: torch.from_numpy(np.asarray(state[name], np.float64))
  if f"{module}.lora_A.default.weight" in state:
    out = F.linear(x, t(f"{module}.base_layer.weight"), t(f"{module}.base_layer.bias"))
    a, b = t(f"{module}.lora_A.default.weight"), t(f"{module}.lora_B.default.weight")
    return out + SCALE * (x @ a.T @ b.T)
  return F.linear(x, t(f"{module}.weight"), t(f"{module}.bias"))


def _block(state, prefix, x, heads, norms, mlp, causal):
  t = lambda name: torch.from_numpy(np.asarray(state[name], np.float64))
  ln = lambda name, v: F.layer_norm(v, (WIDTH,), t(f"{name}.weight"), t(f"{name}.bias"), 1e-5)
  h = ln(prefix + norms[0], x)
  b, n, _ = h.shape
  split = lambda v: v.view(b, n, heads, WIDTH // heads).transpose(1, 2)
  q, k, v = (split(_linear(state, f"{prefix}attn.{p}", h)) for p in ("q_proj", "k_proj", "v_proj"))
  attended = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
  x = x + _linear(state, f"{prefix}attn.proj", attended.transpose(1, 2).reshape(b, n, WIDTH))
  h = F.gelu(_linear(state, prefix + mlp[0], ln(prefix + norms[1], x)))
  return x + _linear(state, prefix + mlp[1], h)


def _lift(state, feats, alpha):
  curv = math.exp(float(state["curv"]))
  x = feats * math.exp(float(state[alpha]))
  norm = math.sqrt(curv) * x.norm(dim=-1, keepdim=True)
  return torch.sinh(norm) * x / norm


def release_encode_image(state, pixels):
  """AdaptedCLIP.encode_image(project=True) in float64; pixels (B, H, W, 3) in [0, 1]."""
  t = lambda name: torch.from_numpy(np.asarray(state[name], np.float64))
  v = "visual.base_model.model."
  x = (torch.from_numpy(pixels).permute(0, 3, 1, 2).double() - t("pixel_mean")) / t("pixel_std")
  x = F.conv2d(x, t(f"{v}patch_embed.proj.weight"), t(f"{v}patch_embed.proj.bias"), stride=PATCH)
  x = x.flatten(2).transpose(1, 2)
  x = torch.cat([t(f"{v}cls_token").expand(x.shape[0], -1, -1), x], 1) + t(f"{v}pos_embed")
  for i in range(DEPTH):
    x = _block(
      state, f"{v}blocks.{i}.", x, HEADS, ("norm1", "norm2"), ("mlp.fc1", "mlp.fc2"), False
    )
  x = F.layer_norm(x, (WIDTH,), t(f"{v}norm.weight"), t(f"{v}norm.bias"), 1e-5)[:, 0]
  return _lift(state, x @ t("visual_proj.weight").T, "visual_alpha").numpy()


def release_encode_text(state, tokens):
  t = lambda name: torch.from_numpy(np.asarray(state[name], np.float64))
  p = "textual.base_model.model."
  ids = torch.from_numpy(tokens).long()
  x = t(f"{p}token_embed.weight")[ids] + t(f"{p}posit_embed")[: ids.shape[1]]
  for i in range(DEPTH):
    x = _block(
      state, f"{p}resblocks.{i}.", x, TEXT_HEADS, ("ln_1", "ln_2"), ("mlp.c_fc", "mlp.c_proj"), True
    )
  x = F.layer_norm(x, (WIDTH,), t(f"{p}ln_final.weight"), t(f"{p}ln_final.bias"), 1e-5)
  x = x[torch.arange(x.shape[0]), ids.argmax(-1)]
  return _lift(state, x @ t("textual_proj.weight").T, "textual_alpha").numpy()


def small_hac_config(lora: bool):
  """configs/hac.py:vit_b at the test's sizes (block 0 excluded, rank 4)."""
  config = hac_config.get_config("vit_b")
  with config.unlocked():
    config.input.image_size = IMAGE
    config.input.tokenizer.context_length = CONTEXT
    config.model.update(
      dict(image_variant="mu/8", image_num_heads=HEADS, text_variant="mu", embed_dim=EMBED)
    )
    config.model.lora.update(
      dict(rank=RANK if lora else 0, image_excluded_blocks=(0,), text_excluded_blocks=(0,))
    )
  return config


def _save(tmp_path, state):
  path = tmp_path / "hac_vit_b_lora.pth"
  tensors = {name: torch.from_numpy(np.asarray(value)) for name, value in state.items()}
  torch.save({"model": tensors, "iteration": 30000}, path)
  return path


def _relative_error(ours, reference):
  ours, reference = np.asarray(ours, np.float64), np.asarray(reference, np.float64)
  return float(np.max(np.abs(ours - reference)) / np.max(np.abs(reference)))


def _convert_and_compare_embeddings(tmp_path, monkeypatch, keep_adapters):
  """(the release's state, the converted run's folder) after checking that
  the converted run embeds as the float64 forward of the release."""
  from test_interop import stub_clip_bpe

  stub_clip_bpe(monkeypatch)
  state = release_state_dict()
  config = small_hac_config(lora=keep_adapters)
  out = tmp_path / "converted"
  workdir.convert_checkpoint("hac", str(_save(tmp_path, state)), config, str(out))
  loaded = hyperbolic_vl.load(out)
  rng = np.random.default_rng(1)
  pixels = rng.uniform(size=(3, IMAGE, IMAGE, 3)).astype(np.float32)
  tokens = np.asarray([[1, 5, 9, 300, 0, 0], [2, 7, 300, 0, 0, 0], [3, 4, 8, 6, 11, 300]])
  image_error = _relative_error(loaded.encode_images(pixels), release_encode_image(state, pixels))
  text_error = _relative_error(loaded.encode_tokens(tokens), release_encode_text(state, tokens))
  assert image_error < TOLERANCE and text_error < TOLERANCE, (image_error, text_error)
  np.testing.assert_allclose(loaded.curv, 0.8, rtol=1e-6)
  return state, out


def test_hac_checkpoint_with_adapters_kept_embeds_as_the_release_and_exports_back(
  tmp_path, monkeypatch
):
  state, out = _convert_and_compare_embeddings(tmp_path, monkeypatch, keep_adapters=True)
  # Export: the release's keys and shapes (a strict load_state_dict's check)
  # and the file's values back, in float32.
  exported = tmp_path / "export.pth"
  export.export_run(str(out), "hac", str(exported))
  written = torch.load(exported, weights_only=True)["model"]
  assert {k: tuple(v.shape) for k, v in written.items()} == {
    k: tuple(np.shape(v)) for k, v in state.items()
  }
  for name, value in state.items():
    got, want = written[name].numpy(), np.asarray(value).astype(written[name].numpy().dtype)
    if name.endswith(("pos_embed", "attn_mask")) or name.startswith("pixel_"):
      # Buffers the export recomputes (the sin-cos table in float32): ulps.
      np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7, err_msg=name)
    else:
      np.testing.assert_array_equal(got, want, err_msg=name)  # params: float32 of the file


def test_merged_conversion_is_the_kept_one_with_its_adapters_folded_in():
  """The merged conversion (a config without LoRA) holds the kept one's
  params with (alpha / sqrt(r)) B A folded into the adapted kernels: since
  the kept conversion embeds as the release (the test above), so does the
  merged one, and this needs no compiled forward (the slow tier runs that).

  The converter folds in float64 from the file and rounds once; lora's
  merge_adapters folds the kept run's float32 W, A and B. Each entry thus
  sees at most four float32 roundings (W, A, B, the fold's cast), each
  within 2^-24 of the entry's magnitude: 4 ulps of the tensor's largest
  entry bound the difference (measured: 1.2 ulps). alpha / r for
  alpha / sqrt(r) would differ by the whole delta (~0.1 here).
  """
  state = release_state_dict()
  kept_config = small_hac_config(lora=True)
  kept, _ = workdir.convert_state_dict("hac", state, kept_config)
  merged, _ = workdir.convert_state_dict("hac", state, small_hac_config(lora=False))
  folded = lora.merge_adapters(kept, kept_config.model)
  folded_leaves = {
    jax.tree_util.keystr(k): v for k, v in jax.tree_util.tree_leaves_with_path(folded)
  }
  merged_leaves = {
    jax.tree_util.keystr(k): v for k, v in jax.tree_util.tree_leaves_with_path(merged)
  }
  assert sorted(folded_leaves) == sorted(merged_leaves)
  adapted = [name for name in merged_leaves if "[1]['attn']" in name and "kernel" in name]
  assert len(adapted) == 4, adapted  # qkv and out of block 1 in each tower
  for name, want in merged_leaves.items():
    got = np.asarray(folded_leaves[name])
    if name in adapted:
      ulp = 2.0**-24 * float(np.max(np.abs(want)))
      np.testing.assert_allclose(got, want, rtol=0, atol=4 * ulp, err_msg=name)
    else:
      np.testing.assert_array_equal(got, want, err_msg=name)


@pytest.mark.slow
def test_hac_checkpoint_with_adapters_merged_embeds_as_the_release(tmp_path, monkeypatch):
  _convert_and_compare_embeddings(tmp_path, monkeypatch, keep_adapters=False)


def test_a_file_that_is_not_hacs_fails_in_one_line():
  state = release_state_dict()
  state["visual.blocks.0.attn.qkv.weight"] = np.zeros((3 * WIDTH, WIDTH))
  config = small_hac_config(lora=True)
  with pytest.raises(common.ConversionError, match="not a HAC state dict"):
    workdir.convert_state_dict("hac", state, config)
