"""HySAC's released weights (`hysac_model.pth`, Hugging Face aimagelab/HySAC)
in and out.

The file is the state dict of the release's `HySAC` module: two PEFT-wrapped
Hugging Face towers and four log-space scalars,

  visual.base_model.model.<CLIPVisionModelWithProjection's keys>
  textual.base_model.model.<CLIPTextModelWithProjection's keys>
  logit_scale, curv, visual_alpha, textual_alpha      (log-space, as ours)
  pixel_mean, pixel_std                               (ImageNet buffers the
                                                      release never applies)

An adapted module (k_proj, v_proj, out_proj, fc1, fc2 and the vision
patch_embedding) holds its base weight as `<module>.weight` (PEFT < 0.7) or
`<module>.base_layer.weight` (PEFT >= 0.7) beside `<module>.lora_A.default.weight`
(r, in) and `lora_B.default.weight` (out, r) (for the patch convolution
(r, 3, p, p) and (out, r, 1, 1)); both namings are read. The update is
(lora_alpha / r) B A with lora_alpha = 1.

Import keeps the adapters as this project's LoRA parameters (`down` = A^T,
`up` = B^T; the patch's A reordered to our p x p x 3 flatten), for a config
with the release's LoRA (configs/hysac.py:vit_l14), or merges them into the
base weights (W + B A / r) for a config without LoRA. Export writes a run
back in the PEFT >= 0.7 naming (or the older one), its adapters as lora_A/B.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import numpy as np

from hyperbolic_vl.interop import common, hf_clip

TOWER_PREFIXES = {"visual": "visual.base_model.model.", "textual": "textual.base_model.model."}
SCALARS = {
  "logit_scale": "log_logit_scale",
  "curv": "log_curv",
  "visual_alpha": "log_alpha_img",
  "textual_alpha": "log_alpha_txt",
}
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
PIXEL_BUFFERS = {"pixel_mean": IMAGENET_MEAN, "pixel_std": IMAGENET_STD}
RELEASE_LORA_ALPHA = 1.0  # LoraConfig(lora_alpha=1) in the release
NAMINGS = ("base_layer", "plain")  # PEFT >= 0.7, PEFT < 0.7
_LORA = re.compile(r"^(?P<module>.+)\.lora_(?P<which>[AB])\.default\.weight$")
_BLOCK = re.compile(r"^(?P<tower>vision|text)_model\.encoder\.layers\.(?P<i>\d+)\.(?P<rest>.+)$")
_ADAPTED = {
  "self_attn.k_proj": "attn/lora_k",
  "self_attn.v_proj": "attn/lora_v",
  "self_attn.q_proj": "attn/lora_q",
  "self_attn.out_proj": "attn/lora_out",
  "mlp.fc1": "mlp/lora_fc1",
  "mlp.fc2": "mlp/lora_fc2",
}
_PATCH = "vision_model.embeddings.patch_embedding"
_TOWERS = {"vision": "image_tower", "text": "text_tower"}


def adapter_path(module: str) -> str:
  """A Hugging Face module name -> our adapter's path (no /down, /up)."""
  if module == _PATCH:
    return "image_tower/lora_patch"
  match = _BLOCK.match(module)
  if match and match["rest"] in _ADAPTED:
    return f"{_TOWERS[match['tower']]}/encoder/blocks/{match['i']}/{_ADAPTED[match['rest']]}"
  raise common.ConversionError(f"LoRA on {module}: no adapter of this project adapts it")


def hf_module(path: str) -> str:
  """Our adapter path -> its Hugging Face module name (inverse of adapter_path)."""
  if path == "image_tower/lora_patch":
    return _PATCH
  match = re.match(r"^(image_tower|text_tower)/encoder/blocks/(\d+)/(.+)$", path)
  inverse = {ours: theirs for theirs, ours in _ADAPTED.items()}
  if not match or match[3] not in inverse:
    raise common.ExportError(f"adapter {path} has no place in HySAC's layout")
  tower = {v: k for k, v in _TOWERS.items()}[match[1]]
  return f"{tower}_model.encoder.layers.{match[2]}.{inverse[match[3]]}"


def split_release(tensors: Mapping[str, np.ndarray]):
  """(Hugging Face CLIP tensors with the scalars under hf_clip's and our
  names, {module: (A, B)}, unknown names) of a HySAC state dict."""
  base, halves, unknown = {}, {}, []
  for name, value in tensors.items():
    value = np.asarray(value)
    if name in SCALARS:
      base[name] = value
      continue
    if name in PIXEL_BUFFERS:
      if not np.allclose(value.reshape(-1), PIXEL_BUFFERS[name], atol=1e-6):
        unknown.append(f"{name} (not ImageNet's {PIXEL_BUFFERS[name]})")
      continue
    prefix = next((p for p in TOWER_PREFIXES.values() if name.startswith(p)), None)
    if prefix is None:
      unknown.append(name)
      continue
    inner = name[len(prefix) :]
    match = _LORA.match(inner)
    if match:
      halves.setdefault(match["module"], {})[match["which"]] = value
      continue
    base[inner.replace(".base_layer.", ".")] = value
  adapters = {}
  for module, pair in halves.items():
    if set(pair) != {"A", "B"}:
      unknown.append(f"{module}: lora_{'A' if 'A' not in pair else 'B'} missing")
      continue
    adapters[module] = (pair["A"], pair["B"])
  return base, adapters, unknown


def adapter_params(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """(down, up) of our adapter from PEFT's (A, B)."""
  rank = a.shape[0]
  if a.ndim == 4:  # the patch conv: (r, 3, p, p) reads patches flattened (row, col, channel)
    down = a.transpose(2, 3, 1, 0).reshape(-1, rank)
  else:
    down = a.T
  return down, b.reshape(b.shape[0], rank).T


def release_lora(down: np.ndarray, up: np.ndarray, base_weight_shape) -> tuple:
  """(A, B) in PEFT's layout from our (down, up); inverse of adapter_params."""
  rank = down.shape[1]
  if len(base_weight_shape) == 4:
    out, channels, height, width = base_weight_shape
    a = down.reshape(height, width, channels, rank).transpose(3, 2, 0, 1)
    b = up.T.reshape(out, rank, 1, 1)
    return a, b
  return down.T, up.T


def _scalar_entries() -> list[common.Entry]:
  return [
    common.Param(ours, theirs, common.SCALAR)
    for theirs, ours in SCALARS.items()
    if theirs != "logit_scale"  # hf_clip's table has it
  ]


def convert(
  tensors: Mapping[str, np.ndarray],
  target_shapes: Mapping[str, tuple[int, ...]],
  *,
  lora_alpha: float = RELEASE_LORA_ALPHA,
  extra_ignored: tuple[str, ...] = (),
) -> common.Conversion:
  """A HySAC state dict -> our flat params of `target_shapes`: adapters kept
  where the target has them, merged into the base weights where not."""
  base, adapters, unknown = split_release(tensors)
  if unknown:
    raise common.ConversionError(
      "not a HySAC state dict (names outside visual./textual.base_model.model. and the "
      f"scalars): {unknown[:5]}"
    )
  keep = any("/lora_" in name for name in target_shapes)
  kept = {}
  for module, (a, b) in adapters.items():
    path = adapter_path(module)
    if keep:
      kept[path] = adapter_params(a, b)
      continue
    weight = f"{module}.weight"
    scale = lora_alpha / a.shape[0]
    base[weight] = (base[weight].astype(np.float64) + common.lora_delta(a, b, scale)).astype(
      np.float32
    )
  base_shapes = {k: v for k, v in target_shapes.items() if "/lora_" not in k}
  conv = common.Conversion(base, base_shapes, ignorable=extra_ignored)
  conv.apply(hf_clip.table(base_shapes, source=base) + _scalar_entries())
  if keep:
    common.place_adapters(conv, kept, target_shapes)
  return conv


def export(flat_params: Mapping[str, np.ndarray], *, naming: str = "base_layer") -> dict:
  """Our flat params (adapters kept) -> HySAC's state dict in `naming`."""
  if naming not in NAMINGS:
    raise common.ExportError(f"naming={naming!r}; valid: {NAMINGS}")
  base = {k: v for k, v in flat_params.items() if "/lora_" not in k}
  adapters = sorted({k.rsplit("/", 1)[0] for k in flat_params if "/lora_" in k})
  hf_table = [
    e for e in hf_clip.table(common.flat_param_shapes(base)) if isinstance(e, common.Param)
  ]
  hf = common.export_tensors(hf_table + _scalar_entries(), base)
  adapted = {hf_module(path): path for path in adapters}
  out = {}
  for name, value in hf.items():
    if name in SCALARS:
      out[name] = value
      continue
    module = name.rsplit(".", 1)[0]
    if module in adapted and naming == "base_layer":
      name = f"{module}.base_layer.{name.rsplit('.', 1)[1]}"
    prefix = TOWER_PREFIXES["visual" if name.startswith(("vision_model", "visual_")) else "textual"]
    out[prefix + name] = value
  for module, path in adapted.items():
    weight_shape = hf[f"{module}.weight"].shape
    a, b = release_lora(
      np.asarray(flat_params[f"{path}/down"]), np.asarray(flat_params[f"{path}/up"]), weight_shape
    )
    prefix = TOWER_PREFIXES["visual" if module.startswith("vision_model") else "textual"]
    out[f"{prefix}{module}.lora_A.default.weight"] = np.ascontiguousarray(a)
    out[f"{prefix}{module}.lora_B.default.weight"] = np.ascontiguousarray(b)
  for name, values in PIXEL_BUFFERS.items():
    out[name] = np.asarray(values, np.float32).reshape(3, 1, 1)
  return out
