"""Hugging Face `CLIPModel` weights (`model.safetensors` / `pytorch_model.bin`).

Layout: `vision_model.embeddings.{patch_embedding,class_embedding,
position_embedding}`, `vision_model.pre_layrnorm` (sic),
`vision_model.encoder.layers.N.{layer_norm1,self_attn.{q,k,v,out}_proj,
layer_norm2,mlp.fc1,mlp.fc2}`, `vision_model.post_layernorm`,
`visual_projection` (nn.Linear, transposed here), the same under
`text_model.` with `embeddings.token_embedding`, `final_layer_norm`, and
`text_projection`, `logit_scale`. Separate q, k, v projections are
concatenated into our fused qkv. Older files also hold the integer buffers
`*.embeddings.position_ids` (0, 1, 2, ...): checked, not loaded.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

import numpy as np

from hyperbolic_vl.interop import common

BLOCK_NAMES = dict(
  norm1="layer_norm1",
  norm2="layer_norm2",
  qkv=("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
  out="self_attn.out_proj",
  fc1="mlp.fc1",
  fc2="mlp.fc2",
)
CLASS_EMBEDDING = common.Layout(lambda c: c.reshape(1, 1, -1), lambda ours: ours.reshape(-1))


def table(
  target_shapes: Mapping[str, tuple[int, ...]], *, source: Collection[str] = ()
) -> list[common.Entry]:
  """Hugging Face's layout for a model of `target_shapes`; `source`: the
  names of the file being converted."""
  vision, text = "vision_model", "text_model"
  entries: list[common.Entry] = [
    common.Param(
      "image_tower/patch_embed/kernel", f"{vision}.embeddings.patch_embedding.weight", common.CONV
    ),
    common.Param("image_tower/cls_token", f"{vision}.embeddings.class_embedding", CLASS_EMBEDDING),
    common.Param("image_tower/learned_position", f"{vision}.embeddings.position_embedding.weight"),
    common.Param("image_tower/ln_pre/scale", f"{vision}.pre_layrnorm.weight"),
    common.Param("image_tower/ln_pre/bias", f"{vision}.pre_layrnorm.bias"),
  ]
  blocks = max(
    common.count_blocks(source, f"{vision}.encoder.layers"),
    common.count_target_blocks(target_shapes, "image_tower"),
  )
  for i in range(blocks):
    entries += common.block_entries(
      f"image_tower/encoder/blocks/{i}", f"{vision}.encoder.layers.{i}", BLOCK_NAMES
    )
  entries += [
    common.Param("image_tower/norm/scale", f"{vision}.post_layernorm.weight"),
    common.Param("image_tower/norm/bias", f"{vision}.post_layernorm.bias"),
    common.Param("image_proj/kernel", "visual_projection.weight", common.LINEAR),
    common.Param(
      "text_tower/token_embedding/embedding", f"{text}.embeddings.token_embedding.weight"
    ),
    common.Param("text_tower/positional_embedding", f"{text}.embeddings.position_embedding.weight"),
  ]
  blocks = max(
    common.count_blocks(source, f"{text}.encoder.layers"),
    common.count_target_blocks(target_shapes, "text_tower"),
  )
  for i in range(blocks):
    entries += common.block_entries(
      f"text_tower/encoder/blocks/{i}", f"{text}.encoder.layers.{i}", BLOCK_NAMES
    )
  entries += [
    common.Param("text_tower/norm/scale", f"{text}.final_layer_norm.weight"),
    common.Param("text_tower/norm/bias", f"{text}.final_layer_norm.bias"),
    common.Param("text_proj/kernel", "text_projection.weight", common.LINEAR),
    common.Param("log_logit_scale", "logit_scale", common.SCALAR),
  ]
  for tower in (vision, text):
    entries.append(
      common.Buffer(
        f"{tower}.embeddings.position_ids",
        lambda ids: np.array_equal(ids.reshape(-1), np.arange(ids.size)),
        "not 0, 1, 2, ...",
      )
    )
  return entries


def convert(
  source: Mapping[str, np.ndarray],
  target_shapes: Mapping[str, tuple[int, ...]],
  *,
  extra_ignored: tuple[str, ...] = (),
) -> common.Conversion:
  conv = common.Conversion(source, target_shapes, ignorable=extra_ignored)
  conv.apply(table(target_shapes, source=source))
  return conv
