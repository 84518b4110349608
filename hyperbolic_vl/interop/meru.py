"""MERU-format checkpoints: MERU, MERU's CLIP baseline, ATMG, HyCoCLIP.

Layout (a `{"model": state_dict}` torch file): a timm ViT under `visual.`
(`patch_embed.proj`, `cls_token`, `pos_embed` (frozen 2D sin-cos, a buffer
we check rather than load), `blocks.N.{norm1,attn.qkv,attn.proj,norm2,
mlp.fc1,mlp.fc2}`, `norm`), MERU's text transformer under `textual.`
(`token_embed`, `posit_embed`, `resblocks.N.{ln_1,attn.in_proj_*,
attn.out_proj,ln_2,mlp.c_fc,mlp.c_proj}`, `ln_final`, buffer `attn_mask`),
bias-free `visual_proj` / `textual_proj`, and log-space scalars
`logit_scale`, `curv`, `visual_alpha`, `textual_alpha` (the last three only
for hyperbolic models) plus `pixel_mean` / `pixel_std` buffers (checked
against the config's pixel statistics).

ATMG's and HyCoCLIP's releases are this layout exactly: their model classes
subclass MERU's CLIP baseline (ATMG changes the loss and inference only;
HyCoCLIP adds box images and texts to the loss, not parameters), so their
state dicts hold MERU's keys and nothing else. Convert ATMG with
configs/atmg.py:vit_*, HyCoCLIP with configs/hycoclip.py:vit_* (its
encoders are MERU's), and the MERU / CLIP baselines trained with HyCoCLIP's
code with configs/meru.py:vit_* / configs/clip.py:vit_*.
ATMG fixes the curvature (learn_curv=False): its `curv` is still stored, and
is checked against the config's `model.curv_init` instead of being loaded.
Their training checkpoints (`checkpoint_*.pth`) nest the weights under
"model" beside "optimizer", "scheduler", "scaler" and "iteration"; only
"model" is read.

Keys outside this layout are never dropped silently: pass regular
expressions in `extra_ignored` (the CLI's --ignore) to skip them, and they
are listed in the converter's output.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from hyperbolic_vl.interop import common
from hyperbolic_vl.models import vit


def convert(
  source: Mapping[str, np.ndarray],
  target_shapes: Mapping[str, tuple[int, ...]],
  *,
  pixel_stats: str,
  fixed_curv: float | None = None,
  extra_ignored: tuple[str, ...] = (),
) -> common.Conversion:
  """`fixed_curv`: the config's curvature when it is not learned (ATMG); a
  checkpoint's `curv` must then equal log(fixed_curv)."""
  conv = common.Conversion(source, target_shapes, ignorable=extra_ignored)

  # -- image tower (timm ViT) --
  conv.put("image_tower/patch_embed/kernel", "visual.patch_embed.proj.weight", common.conv_kernel)
  if "image_tower/patch_embed/bias" in target_shapes or conv.has("visual.patch_embed.proj.bias"):
    conv.put("image_tower/patch_embed/bias", "visual.patch_embed.proj.bias")
  conv.put("image_tower/cls_token", "visual.cls_token")
  if "image_tower/learned_position" in target_shapes:
    conv.put("image_tower/learned_position", "visual.pos_embed", lambda p: p.reshape(p.shape[-2:]))
  else:
    cls_shape = target_shapes.get("image_tower/cls_token", (1, 1, 0))
    width = cls_shape[-1]

    def is_sincos(table: np.ndarray) -> bool:
      grid = int(round((table.shape[-2] - 1) ** 0.5))
      if table.shape[-1] != width or grid * grid + 1 != table.shape[-2]:
        return False
      expected = vit.sincos_2d_position_embedding(width, grid)
      return np.allclose(table.reshape(expected.shape), expected, atol=1e-5)

    conv.check(
      "visual.pos_embed",
      is_sincos,
      "not the frozen 2D sin-cos table of this width/grid (a learned position embedding? "
      "set --config.model.image_position_embedding=learned)",
    )
  source_blocks = common.count_blocks(source, "visual.blocks")
  target_blocks = common.count_target_blocks(target_shapes, "image_tower")
  for i in range(max(source_blocks, target_blocks)):
    common.fill_block(
      conv,
      f"image_tower/encoder/blocks/{i}",
      f"visual.blocks.{i}",
      dict(
        norm1="norm1", norm2="norm2", qkv="attn.qkv.", out="attn.proj", fc1="mlp.fc1", fc2="mlp.fc2"
      ),
    )
  conv.put("image_tower/norm/scale", "visual.norm.weight")
  conv.put("image_tower/norm/bias", "visual.norm.bias")

  # -- text tower --
  conv.put("text_tower/token_embedding/embedding", "textual.token_embed.weight")
  conv.put("text_tower/positional_embedding", "textual.posit_embed")
  source_blocks = common.count_blocks(source, "textual.resblocks")
  target_blocks = common.count_target_blocks(target_shapes, "text_tower")
  for i in range(max(source_blocks, target_blocks)):
    common.fill_block(
      conv,
      f"text_tower/encoder/blocks/{i}",
      f"textual.resblocks.{i}",
      dict(
        norm1="ln_1",
        norm2="ln_2",
        qkv="attn.in_proj_",
        out="attn.out_proj",
        fc1="mlp.c_fc",
        fc2="mlp.c_proj",
      ),
    )
  conv.put("text_tower/norm/scale", "textual.ln_final.weight")
  conv.put("text_tower/norm/bias", "textual.ln_final.bias")
  if conv.has("textual.attn_mask"):
    conv.check(
      "textual.attn_mask",
      lambda mask: np.array_equal(mask.astype(bool), np.triu(np.ones(mask.shape, bool), k=1)),
      "not a causal mask",
    )

  # -- projections and learned scalars (all stored in log space) --
  conv.put("image_proj/kernel", "visual_proj.weight", common.linear_kernel)
  conv.put("text_proj/kernel", "textual_proj.weight", common.linear_kernel)
  conv.put("log_logit_scale", "logit_scale", common.scalar)
  if "log_curv" not in target_shapes and fixed_curv is not None and conv.has("curv"):
    conv.check(
      "curv",
      lambda log_c: np.isclose(float(np.asarray(log_c)), np.log(fixed_curv), rtol=0, atol=1e-6),
      f"the checkpoint's curvature differs from the config's fixed model.curv_init={fixed_curv} "
      "(set --config.model.curv_init to exp(curv), or --config.model.learn_curv=True)",
    )
  for ours, theirs in (
    ("log_curv", "curv"),
    ("log_alpha_img", "visual_alpha"),
    ("log_alpha_txt", "textual_alpha"),
  ):
    if ours in target_shapes or (conv.has(theirs) and theirs not in conv.used):
      conv.put(ours, theirs, common.scalar)
  mean, std = vit.PIXEL_STATS[pixel_stats]
  for name, expected in (("pixel_mean", mean), ("pixel_std", std)):
    if conv.has(name):
      conv.check(
        name,
        lambda v, e=expected: np.allclose(v.reshape(-1), e, atol=1e-6),
        f"differs from the config's pixel_stats={pixel_stats!r} {expected}",
      )
  return conv
