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

PHyCLIP's release (a product of K Lorentz spaces, `model.factor_dim`) is
this layout too, with the K per-factor scalars in ParameterLists:
`curvs.{k}`, `visual_concept_alphas.{k}`, `textual_concept_alphas.{k}`
(0-d tensors, log space) hold our (K,) `log_curv`, `log_alpha_img`,
`log_alpha_txt`. Its model also creates MERU's `curv`, `visual_alpha` and
`textual_alpha` and never uses them: an export writes their init (log 1 and
log(embed_dim^-0.5), where an untrained release keeps them), a conversion
accepts any value. PHyCLIP has released no weights; the table lets a run
trained here load into the release's model (`--format=meru`).
Their training checkpoints (`checkpoint_*.pth`) nest the weights under
"model" beside "optimizer", "scheduler", "scaler" and "iteration"; only
"model" is read.

Keys outside this layout are never dropped silently: pass regular
expressions in `extra_ignored` (the CLI's --ignore) to skip them, and they
are listed in the converter's output.

`table` is the one description of this layout: `convert` reads a release
through it and `export` (hyperbolic_vl.export's `--format=meru`) writes a
run's params through it, with the buffers MERU's model holds (the sin-cos
table or learned positions, the causal mask, pixel statistics, a fixed
curvature) recomputed from the config, so MERU's `load_state_dict` finds
every key it expects.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping

import numpy as np

from hyperbolic_vl.interop import common
from hyperbolic_vl.models import vit

TIMM_BLOCK = dict(
  norm1="norm1", norm2="norm2", qkv="attn.qkv.", out="attn.proj", fc1="mlp.fc1", fc2="mlp.fc2"
)
TEXT_BLOCK = dict(
  norm1="ln_1",
  norm2="ln_2",
  qkv="attn.in_proj_",
  out="attn.out_proj",
  fc1="mlp.c_fc",
  fc2="mlp.c_proj",
)
# timm stores the position table as (1, 1 + N, D); ours is (1 + N, D).
POSITIONS = common.Layout(lambda p: p.reshape(p.shape[-2:]), lambda ours: ours[None])
# PHyCLIP's per-factor scalars: (K,) here, K 0-d tensors in an nn.ParameterList there.
PER_FACTOR = common.Layout(
  lambda *scalars: np.stack([common.scalar(s) for s in scalars]),
  lambda ours: tuple(np.asarray(ours[k], np.float32).reshape(()) for k in range(len(ours))),
)
FACTOR_LISTS = (
  ("log_curv", "curvs", "curv"),
  ("log_alpha_img", "visual_concept_alphas", "visual_alpha"),
  ("log_alpha_txt", "textual_concept_alphas", "textual_alpha"),
)


def num_factors(target_shapes: Mapping[str, tuple[int, ...]], source: Collection[str]) -> int:
  """K of a PHyCLIP layout (the per-factor curvatures' count), 0 for MERU's."""
  shape = target_shapes.get("log_curv", ())
  if len(shape) == 1:
    return shape[0]
  return common.count_blocks({name: None for name in source}, "curvs")


def _per_factor_entries(target_shapes, source, factors: int) -> list[common.Entry]:
  """PHyCLIP's per-factor scalars, and MERU's scalars its model keeps unused."""
  width = target_shapes.get("image_proj/kernel", (0, 0))[-1]
  unused_init = dict(curv=0.0, visual_alpha=-0.5 * math.log(max(width, 1)))
  unused_init["textual_alpha"] = unused_init["visual_alpha"]
  entries: list[common.Entry] = []
  for ours, theirs, unused in FACTOR_LISTS:
    names = tuple(f"{theirs}.{k}" for k in range(factors))
    entries.append(common.Param(ours, names, PER_FACTOR))
    entries.append(
      common.Buffer(
        unused,
        lambda value: np.asarray(value).size == 1,
        "not a scalar",
        value=lambda v=unused_init[unused]: np.asarray(v, np.float32),
      )
    )
  return entries


def table(
  target_shapes: Mapping[str, tuple[int, ...]],
  *,
  pixel_stats: str,
  fixed_curv: float | None = None,
  image_size: int | None = None,
  source: Collection[str] = (),
) -> list[common.Entry]:
  """MERU's layout for a model of `target_shapes` ({flat param name: shape}).

  `source`: the names of the release being converted (a layout detail such
  as the patch bias follows the file too, so that a mismatch is reported
  rather than skipped); empty when exporting. `image_size` sizes the
  sin-cos table an export writes."""
  entries: list[common.Entry] = []
  add = entries.append

  # -- image tower (timm ViT) --
  add(common.Param("image_tower/patch_embed/kernel", "visual.patch_embed.proj.weight", common.CONV))
  if "image_tower/patch_embed/bias" in target_shapes or "visual.patch_embed.proj.bias" in source:
    add(common.Param("image_tower/patch_embed/bias", "visual.patch_embed.proj.bias"))
  add(common.Param("image_tower/cls_token", "visual.cls_token"))
  if "image_tower/learned_position" in target_shapes:
    add(common.Param("image_tower/learned_position", "visual.pos_embed", POSITIONS))
  else:
    width = target_shapes.get("image_tower/cls_token", (1, 1, 0))[-1]
    patch = target_shapes.get("image_tower/patch_embed/kernel", (0,))[0]

    def is_sincos(table: np.ndarray) -> bool:
      grid = int(round((table.shape[-2] - 1) ** 0.5))
      if table.shape[-1] != width or grid * grid + 1 != table.shape[-2]:
        return False
      expected = vit.sincos_2d_position_embedding(width, grid)
      return np.allclose(table.reshape(expected.shape), expected, atol=1e-5)

    add(
      common.Buffer(
        "visual.pos_embed",
        is_sincos,
        "not the frozen 2D sin-cos table of this width/grid (a learned position embedding? "
        "set --config.model.image_position_embedding=learned)",
        value=None
        if image_size is None
        else lambda: vit.sincos_2d_position_embedding(width, image_size // patch)[None],
        required=True,
      )
    )
  blocks = max(
    common.count_blocks(source, "visual.blocks"),
    common.count_target_blocks(target_shapes, "image_tower"),
  )
  for i in range(blocks):
    entries += common.block_entries(
      f"image_tower/encoder/blocks/{i}", f"visual.blocks.{i}", TIMM_BLOCK
    )
  add(common.Param("image_tower/norm/scale", "visual.norm.weight"))
  add(common.Param("image_tower/norm/bias", "visual.norm.bias"))

  # -- text tower --
  add(common.Param("text_tower/token_embedding/embedding", "textual.token_embed.weight"))
  add(common.Param("text_tower/positional_embedding", "textual.posit_embed"))
  blocks = max(
    common.count_blocks(source, "textual.resblocks"),
    common.count_target_blocks(target_shapes, "text_tower"),
  )
  for i in range(blocks):
    entries += common.block_entries(
      f"text_tower/encoder/blocks/{i}", f"textual.resblocks.{i}", TEXT_BLOCK
    )
  add(common.Param("text_tower/norm/scale", "textual.ln_final.weight"))
  add(common.Param("text_tower/norm/bias", "textual.ln_final.bias"))
  context = target_shapes.get("text_tower/positional_embedding", (0,))[0]
  add(
    common.Buffer(
      "textual.attn_mask",
      lambda mask: np.array_equal(mask.astype(bool), np.triu(np.ones(mask.shape, bool), k=1)),
      "not a causal mask",
      value=lambda: np.triu(np.ones((context, context), bool), k=1),
    )
  )

  # -- projections and learned scalars (all stored in log space) --
  add(common.Param("image_proj/kernel", "visual_proj.weight", common.LINEAR))
  add(common.Param("text_proj/kernel", "textual_proj.weight", common.LINEAR))
  add(common.Param("log_logit_scale", "logit_scale", common.SCALAR))
  factors = num_factors(target_shapes, source)
  if factors:
    entries += _per_factor_entries(target_shapes, source, factors)
  # A fixed curvature (ATMG) is no param here, but MERU's model stores it.
  curv_is_fixed = "log_curv" not in target_shapes and fixed_curv is not None
  if curv_is_fixed:
    add(
      common.Buffer(
        "curv",
        lambda log_c: np.isclose(float(np.asarray(log_c)), np.log(fixed_curv), rtol=0, atol=1e-6),
        f"the checkpoint's curvature differs from the config's fixed model.curv_init={fixed_curv} "
        "(set --config.model.curv_init to exp(curv), or --config.model.learn_curv=True)",
        value=lambda: np.asarray(math.log(fixed_curv), np.float32),
      )
    )
  for ours, theirs in (
    ("log_curv", "curv"),
    ("log_alpha_img", "visual_alpha"),
    ("log_alpha_txt", "textual_alpha"),
  ):
    if factors:
      continue  # PHyCLIP's per-factor lists above
    if ours in target_shapes or (theirs in source and not (theirs == "curv" and curv_is_fixed)):
      add(common.Param(ours, theirs, common.SCALAR))
  mean, std = vit.PIXEL_STATS[pixel_stats]
  for name, expected in (("pixel_mean", mean), ("pixel_std", std)):
    add(
      common.Buffer(
        name,
        lambda v, e=expected: np.allclose(v.reshape(-1), e, atol=1e-6),
        f"differs from the config's pixel_stats={pixel_stats!r} {expected}",
        value=lambda e=expected: np.asarray(e, np.float32).reshape(-1, 1, 1),
      )
    )
  return entries


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
  conv.apply(table(target_shapes, pixel_stats=pixel_stats, fixed_curv=fixed_curv, source=source))
  return conv


def export(
  flat_params: Mapping[str, np.ndarray],
  *,
  pixel_stats: str,
  image_size: int,
  fixed_curv: float | None = None,
) -> dict[str, np.ndarray]:
  """MERU's state dict ({name: array}, buffers included) of our flat params."""
  shapes = {name: tuple(np.shape(value)) for name, value in flat_params.items()}
  entries = table(shapes, pixel_stats=pixel_stats, fixed_curv=fixed_curv, image_size=image_size)
  return common.export_tensors(entries, flat_params)
