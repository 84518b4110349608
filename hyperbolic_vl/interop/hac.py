"""HAC's released weights (`hac_vit_b_lora.pth`, Hugging Face fdibiton/HAC)
in and out.

The file is what the release's `CheckpointManager` saves
(hac/utils/checkpointing.py:67-81, read back by scripts/evaluate.py:95):
`{"model": state_dict, ...}` of its `AdaptedCLIP` after training
(scripts/train.py:211-253) replaced both towers' attention with split
projections (hac/utils/plain_mha.py: timm's `attn.qkv` and PyTorch's
`attn.in_proj_*` become `q_proj`, `k_proj`, `v_proj`; the output projection
is `attn.proj` in both towers) and wrapped each tower in PEFT
(`get_peft_model`), so that

  visual.base_model.model.<MERU's timm ViT keys, attention split>
  textual.base_model.model.<MERU's text keys, attention split>
  visual_proj.weight, textual_proj.weight, logit_scale, curv,
  visual_alpha, textual_alpha, pixel_mean, pixel_std        (MERU's)

An adapted projection (q, k, v, out of visual blocks 8-11 and text blocks
4-11 in the release) holds `<module>.base_layer.weight/bias` beside
`<module>.lora_A.default.weight` (r, in) and `lora_B.default.weight`
(out, r); the others keep `<module>.weight/bias`. The adapters are stored
unmerged; the update is (lora_alpha / sqrt(r)) B A (`use_rslora`,
lora_alpha 128, r 128).

Import unwraps PEFT, fuses the split projections back into MERU's layout
and converts through interop/meru.py's table; the adapters are kept as this
project's LoRA parameters (`down` = A^T, `up` = B^T) for a config with
HAC's LoRA (configs/hac.py), or merged into the base weights for a config
without LoRA. Export is the inverse: MERU's state dict of the base weights,
split and wrapped, the adapters as lora_A / lora_B.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import numpy as np

from hyperbolic_vl.interop import common, meru

PEFT_PREFIXES = {"visual.": "visual.base_model.model.", "textual.": "textual.base_model.model."}
RELEASE_LORA_ALPHA = 128.0  # LoraConfig(lora_alpha=128, use_rslora=True) in the release
_LORA = re.compile(r"^(?P<module>.+)\.lora_(?P<which>[AB])\.default\.weight$")
# (tower prefix, block list, MERU's fused name of q/k/v, MERU's output name, our tower)
_TOWERS = (
  ("visual.", "blocks", "attn.qkv.", "attn.proj", "image_tower"),
  ("textual.", "resblocks", "attn.in_proj_", "attn.out_proj", "text_tower"),
)
_TARGETS = {"q_proj": "q", "k_proj": "k", "v_proj": "v", "proj": "out"}
_SPLIT = re.compile(
  r"^(?P<tower>visual\.|textual\.)(?P<blocks>blocks|resblocks)\.(?P<i>\d+)\."
  r"attn\.(?P<proj>q_proj|k_proj|v_proj|proj)$"
)


def unwrap(tensors: Mapping[str, np.ndarray]):
  """(plain state dict with split attention, {module: (A, B)}, unknown
  names) of a HAC state dict: PEFT's prefixes and `base_layer` removed."""
  plain, halves, unknown = {}, {}, []
  for name, value in tensors.items():
    value = np.asarray(value)
    wrapped = next((p for p in PEFT_PREFIXES.items() if name.startswith(p[1])), None)
    if wrapped is None:
      if name.startswith(tuple(PEFT_PREFIXES)):
        unknown.append(name)  # a tower outside PEFT's wrapper: not HAC's file
      else:
        plain[name] = value
      continue
    name = wrapped[0] + name[len(wrapped[1]) :]
    match = _LORA.match(name)
    if match:
      halves.setdefault(match["module"], {})[match["which"]] = value
      continue
    plain[name.replace(".base_layer.", ".")] = value
  adapters = {}
  for module, pair in halves.items():
    if set(pair) != {"A", "B"}:
      unknown.append(f"{module}: lora_{'A' if 'A' not in pair else 'B'} missing")
    else:
      adapters[module] = (pair["A"], pair["B"])
  return plain, adapters, unknown


def fuse_attention(plain: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
  """Split q/k/v (and `proj`) -> MERU's fused names (`attn.qkv`,
  `attn.in_proj_*`, `attn.out_proj` in the text tower)."""
  fused, parts = {}, {}
  for name, value in plain.items():
    module, _, leaf = name.rpartition(".")
    match = _SPLIT.match(module)
    if not match:
      fused[name] = value
      continue
    tower = next(t for t in _TOWERS if t[0] == match["tower"])
    block = f"{match['tower']}{match['blocks']}.{match['i']}."
    if match["proj"] == "proj":
      fused[f"{block}{tower[3]}.{leaf}"] = value
    else:
      parts.setdefault((block + tower[2], leaf), {})[match["proj"]] = value
  for (prefix, leaf), split in parts.items():
    if set(split) != {"q_proj", "k_proj", "v_proj"}:
      raise common.ConversionError(f"{prefix}{leaf}: q, k and v are not all in the file")
    # "attn.qkv." + "weight" (timm), "attn.in_proj_" + "weight" (PyTorch).
    fused[f"{prefix}{leaf}"] = np.concatenate([split["q_proj"], split["k_proj"], split["v_proj"]])
  return fused


def split_attention(meru_tensors: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
  """MERU's fused attention names -> HAC's split ones (inverse of fuse_attention)."""
  out = {}
  for name, value in meru_tensors.items():
    for prefix, blocks, fused, output, _ in _TOWERS:
      match = re.match(rf"^{re.escape(prefix)}{blocks}\.(\d+)\.(.+)$", name)
      if not match:
        continue
      block, rest = f"{prefix}{blocks}.{match[1]}.", match[2]
      if rest.startswith(fused):
        leaf = rest[len(fused) :].lstrip(".")
        for proj, chunk in zip(("q_proj", "k_proj", "v_proj"), np.split(value, 3), strict=True):
          out[f"{block}attn.{proj}.{leaf}"] = chunk
        break
      if rest.startswith(output + "."):
        out[f"{block}attn.proj.{rest[len(output) + 1 :]}"] = value
        break
    else:
      out[name] = value
  return out


def adapter_path(module: str) -> str:
  """HAC's module name ("visual.blocks.8.attn.q_proj") -> our adapter's path."""
  match = _SPLIT.match(module)
  if not match:
    raise common.ConversionError(f"LoRA on {module}: no adapter of this project adapts it")
  tower = next(t for t in _TOWERS if t[0] == match["tower"])[4]
  return f"{tower}/encoder/blocks/{match['i']}/attn/lora_{_TARGETS[match['proj']]}"


def hac_module(path: str) -> str:
  """Our adapter path -> HAC's module name (inverse of adapter_path)."""
  match = re.match(r"^(image_tower|text_tower)/encoder/blocks/(\d+)/attn/lora_(q|k|v|out)$", path)
  if not match:
    raise common.ExportError(f"adapter {path} has no place in HAC's layout")
  prefix, blocks = ("visual.", "blocks") if match[1] == "image_tower" else ("textual.", "resblocks")
  proj = {ours: theirs for theirs, ours in _TARGETS.items()}[match[3]]
  return f"{prefix}{blocks}.{match[2]}.attn.{proj}"


def convert(
  tensors: Mapping[str, np.ndarray],
  target_shapes: Mapping[str, tuple[int, ...]],
  *,
  pixel_stats: str,
  lora_alpha: float = RELEASE_LORA_ALPHA,
  extra_ignored: tuple[str, ...] = (),
) -> common.Conversion:
  """A HAC state dict -> our flat params of `target_shapes`: adapters kept
  where the target has them, merged (alpha / sqrt(r)) where not."""
  plain, adapters, unknown = unwrap(tensors)
  if unknown:
    raise common.ConversionError(f"not a HAC state dict: {unknown[:5]}")
  keep = any("/lora_" in name for name in target_shapes)
  kept = {}
  for module, (a, b) in adapters.items():
    if keep:
      kept[adapter_path(module)] = (a.T, b.T)
      continue
    weight = f"{module}.weight"
    # PEFT's use_rslora: alpha / sqrt(r), where plain LoRA scales by alpha / r.
    delta = common.lora_delta(a, b, lora_alpha / np.sqrt(a.shape[0]))
    merged = plain[weight].astype(np.float64) + delta
    plain[weight] = merged.astype(np.float32)
  base_shapes = {k: v for k, v in target_shapes.items() if "/lora_" not in k}
  conv = meru.convert(
    fuse_attention(plain), base_shapes, pixel_stats=pixel_stats, extra_ignored=extra_ignored
  )
  if keep:
    common.place_adapters(conv, kept, target_shapes)
  return conv


def export(
  flat_params: Mapping[str, np.ndarray], *, pixel_stats: str, image_size: int
) -> dict[str, np.ndarray]:
  """Our flat params (adapters kept) -> HAC's state dict (PEFT >= 0.7 names)."""
  base = {k: v for k, v in flat_params.items() if "/lora_" not in k}
  adapters = sorted({k.rsplit("/", 1)[0] for k in flat_params if "/lora_" in k})
  plain = split_attention(meru.export(base, pixel_stats=pixel_stats, image_size=image_size))
  adapted = {hac_module(path): path for path in adapters}
  out = {}
  for name, value in plain.items():
    module, _, leaf = name.rpartition(".")
    if module in adapted:
      name = f"{module}.base_layer.{leaf}"
    prefix = next((p for p in PEFT_PREFIXES if name.startswith(p)), None)
    out[name if prefix is None else PEFT_PREFIXES[prefix] + name[len(prefix) :]] = value
  for module, path in adapted.items():
    prefix = next(p for p in PEFT_PREFIXES if module.startswith(p))
    wrapped = PEFT_PREFIXES[prefix] + module[len(prefix) :]
    down, up = np.asarray(flat_params[f"{path}/down"]), np.asarray(flat_params[f"{path}/up"])
    out[f"{wrapped}.lora_A.default.weight"] = np.ascontiguousarray(down.T)
    out[f"{wrapped}.lora_B.default.weight"] = np.ascontiguousarray(up.T)
  return out
