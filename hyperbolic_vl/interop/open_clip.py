"""open_clip / OpenAI CLIP state dicts (ViT image tower).

Layout: `visual.conv1` (bias-free patch embedding), `visual.class_embedding`
(D,), `visual.positional_embedding` (1 + N, D), `visual.ln_pre`,
`visual.transformer.resblocks.N.{ln_1,attn.in_proj_*,attn.out_proj,ln_2,
mlp.c_fc,mlp.c_proj}`, `visual.ln_post`, `visual.proj` (D, E) applied as
`x @ proj` (so no transpose), then the text tower `token_embedding`,
`positional_embedding`, `transformer.resblocks.N.*`, `ln_final`,
`text_projection` (D, E), and `logit_scale` (log space).

OpenAI's original files also store the integers `input_resolution`,
`context_length` and `vocab_size`; they are checked against the config,
and not written by `export` (open_clip's models hold no such entries).

`table` is the one description of this layout: `convert` reads a state dict
through it and `export` (hyperbolic_vl.export's `--format=open_clip`) writes
one, which `open_clip.create_model(name, pretrained=FILE)` loads.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

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
# open_clip's class embedding is (D,); ours (1, 1, D).
CLASS_EMBEDDING = common.Layout(lambda c: c.reshape(1, 1, -1), lambda ours: ours.reshape(-1))


def table(
  target_shapes: Mapping[str, tuple[int, ...]],
  *,
  image_size: int,
  source: Collection[str] = (),
) -> list[common.Entry]:
  """open_clip's layout for a model of `target_shapes`; `source`: the
  names of the state dict being converted (empty when exporting)."""
  entries: list[common.Entry] = [
    common.Param("image_tower/patch_embed/kernel", "visual.conv1.weight", common.CONV),
    common.Param("image_tower/cls_token", "visual.class_embedding", CLASS_EMBEDDING),
    common.Param("image_tower/learned_position", "visual.positional_embedding"),
    common.Param("image_tower/ln_pre/scale", "visual.ln_pre.weight"),
    common.Param("image_tower/ln_pre/bias", "visual.ln_pre.bias"),
  ]
  blocks = max(
    common.count_blocks(source, "visual.transformer.resblocks"),
    common.count_target_blocks(target_shapes, "image_tower"),
  )
  for i in range(blocks):
    entries += common.block_entries(
      f"image_tower/encoder/blocks/{i}", f"visual.transformer.resblocks.{i}", BLOCK_NAMES
    )
  entries += [
    common.Param("image_tower/norm/scale", "visual.ln_post.weight"),
    common.Param("image_tower/norm/bias", "visual.ln_post.bias"),
    common.Param("image_proj/kernel", "visual.proj"),
    common.Param("text_tower/token_embedding/embedding", "token_embedding.weight"),
    common.Param("text_tower/positional_embedding", "positional_embedding"),
  ]
  blocks = max(
    common.count_blocks(source, "transformer.resblocks"),
    common.count_target_blocks(target_shapes, "text_tower"),
  )
  for i in range(blocks):
    entries += common.block_entries(
      f"text_tower/encoder/blocks/{i}", f"transformer.resblocks.{i}", BLOCK_NAMES
    )
  entries += [
    common.Param("text_tower/norm/scale", "ln_final.weight"),
    common.Param("text_tower/norm/bias", "ln_final.bias"),
    common.Param("text_proj/kernel", "text_projection"),
    common.Param("log_logit_scale", "logit_scale", common.SCALAR),
  ]
  vocab, _ = target_shapes.get("text_tower/token_embedding/embedding", (None, None))
  context = target_shapes.get("text_tower/positional_embedding", (None,))[0]
  for name, expected in (
    ("input_resolution", image_size),
    ("context_length", context),
    ("vocab_size", vocab),
  ):
    entries.append(
      common.Buffer(
        name, lambda v, e=expected: int(np.asarray(v)) == e, f"config implies {expected}"
      )
    )
  return entries


def convert(
  source: Mapping[str, np.ndarray],
  target_shapes: Mapping[str, tuple[int, ...]],
  *,
  image_size: int,
  extra_ignored: tuple[str, ...] = (),
) -> common.Conversion:
  conv = common.Conversion(source, target_shapes, ignorable=extra_ignored)
  conv.apply(table(target_shapes, image_size=image_size, source=source))
  return conv


def export(flat_params: Mapping[str, np.ndarray], *, image_size: int) -> dict[str, np.ndarray]:
  """open_clip's state dict ({name: array}) of our flat params."""
  shapes = {name: tuple(np.shape(value)) for name, value in flat_params.items()}
  return common.export_tensors(table(shapes, image_size=image_size), flat_params)
