"""open_clip / OpenAI CLIP state dicts (ViT image tower).

Layout: `visual.conv1` (bias-free patch embedding), `visual.class_embedding`
(D,), `visual.positional_embedding` (1 + N, D), `visual.ln_pre`,
`visual.transformer.resblocks.N.{ln_1,attn.in_proj_*,attn.out_proj,ln_2,
mlp.c_fc,mlp.c_proj}`, `visual.ln_post`, `visual.proj` (D, E) applied as
`x @ proj` (so no transpose), then the text tower `token_embedding`,
`positional_embedding`, `transformer.resblocks.N.*`, `ln_final`,
`text_projection` (D, E), and `logit_scale` (log space).

OpenAI's original files also store the integers `input_resolution`,
`context_length` and `vocab_size`; they are checked against the config.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from hyperbolic_vl.interop import common

BLOCK_NAMES = dict(
  norm1="ln_1",
  norm2="ln_2",
  qkv="attn.in_proj_",
  out="attn.out_proj",
  fc1="mlp.c_fc",
  fc2="mlp.c_proj",
)


def convert(
  source: Mapping[str, np.ndarray],
  target_shapes: Mapping[str, tuple[int, ...]],
  *,
  image_size: int,
  extra_ignored: tuple[str, ...] = (),
) -> common.Conversion:
  conv = common.Conversion(source, target_shapes, ignorable=extra_ignored)
  conv.put("image_tower/patch_embed/kernel", "visual.conv1.weight", common.conv_kernel)
  conv.put("image_tower/cls_token", "visual.class_embedding", lambda c: c.reshape(1, 1, -1))
  conv.put("image_tower/learned_position", "visual.positional_embedding")
  conv.put("image_tower/ln_pre/scale", "visual.ln_pre.weight")
  conv.put("image_tower/ln_pre/bias", "visual.ln_pre.bias")
  blocks = max(
    common.count_blocks(source, "visual.transformer.resblocks"),
    common.count_target_blocks(target_shapes, "image_tower"),
  )
  for i in range(blocks):
    common.fill_block(
      conv, f"image_tower/encoder/blocks/{i}", f"visual.transformer.resblocks.{i}", BLOCK_NAMES
    )
  conv.put("image_tower/norm/scale", "visual.ln_post.weight")
  conv.put("image_tower/norm/bias", "visual.ln_post.bias")
  conv.put("image_proj/kernel", "visual.proj")

  conv.put("text_tower/token_embedding/embedding", "token_embedding.weight")
  conv.put("text_tower/positional_embedding", "positional_embedding")
  blocks = max(
    common.count_blocks(source, "transformer.resblocks"),
    common.count_target_blocks(target_shapes, "text_tower"),
  )
  for i in range(blocks):
    common.fill_block(
      conv, f"text_tower/encoder/blocks/{i}", f"transformer.resblocks.{i}", BLOCK_NAMES
    )
  conv.put("text_tower/norm/scale", "ln_final.weight")
  conv.put("text_tower/norm/bias", "ln_final.bias")
  conv.put("text_proj/kernel", "text_projection")
  conv.put("log_logit_scale", "logit_scale", common.scalar)

  vocab, width = target_shapes.get("text_tower/token_embedding/embedding", (None, None))
  context = target_shapes.get("text_tower/positional_embedding", (None,))[0]
  for name, expected in (
    ("input_resolution", image_size),
    ("context_length", context),
    ("vocab_size", vocab),
  ):
    if conv.has(name):
      conv.check(name, lambda v, e=expected: int(np.asarray(v)) == e, f"config implies {expected}")
  return conv
