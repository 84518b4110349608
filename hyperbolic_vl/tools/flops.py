"""Model FLOPs of a training step (the numerator of MFU, counted from the
config as the usual convention does), XLA's own count of a compiled
program (`cost_analysis`, the package's one reader of it), and the chips'
dense bf16 peaks (the denominator; the figures are `aot_targets.CHIPS`)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from hyperbolic_vl import objectives as objectives_lib
from hyperbolic_vl.models import resnet, vit
from hyperbolic_vl.models import text as text_lib
from hyperbolic_vl.tools import aot_targets


def chip_of(device) -> aot_targets.Chip | None:
  """The chip of `device` (a JAX device) in `aot_targets.CHIPS`, the
  package's one table of chips: a TPU by the name JAX gives it ("TPU v5
  lite"), a GPU by its family ("h100" in "NVIDIA H100 80GB HBM3"). None for
  a chip the table lacks (a CPU)."""
  kind = device.device_kind.lower()
  for family, chip in aot_targets.CHIPS.items():
    if chip.name.lower() in kind or (chip.platform == "gpu" and family in kind):
      return chip
  return None


def peak_flops(device) -> float | None:
  """The dense bf16 peak FLOP/s of `device`'s chip; None where unknown."""
  chip = chip_of(device)
  return chip.peak_bf16_flops if chip is not None else None


def cost_analysis(compiled) -> dict:
  """XLA's cost analysis of a compiled program as one dict ("flops",
  "bytes accessed", "optimal_seconds", ...): the first module's where the
  backend gives a list, {} where it gives none."""
  analysis = compiled.cost_analysis()
  if isinstance(analysis, (list, tuple)):
    analysis = analysis[0] if analysis else None
  return dict(analysis or {})


def compiled_flops(compiled) -> float | None:
  """XLA's FLOP count of a compiled program; None where it gives none."""
  analysis = cost_analysis(compiled)
  return float(analysis["flops"]) if "flops" in analysis else None


def encoder_forward_flops(
  tokens: int, width: int, depth: int, mlp_dim: int, *, pooled: bool = False
) -> float:
  """Matmul FLOPs (2 per multiply-add) of a transformer encoder on one
  sequence: QKV + output projections, MLP, and the two attention products
  (counted in full, also for the causal text tower). `pooled`: the caller
  reads one output row, and the last layer computes that row alone
  (`transformer.Encoder`'s `output_position`): keys and values (and the
  queries, projected with them) of every row, the rest of one."""
  per_layer = 2 * tokens * (4 * width * width + 2 * width * mlp_dim) + 4 * tokens * tokens * width
  if not pooled:
    return depth * per_layer
  last_layer = 2 * tokens * 3 * width * width + 2 * (width * width + 2 * width * mlp_dim)
  return (depth - 1) * per_layer + last_layer + 4 * tokens * width


def resnet_forward_flops(variant: str, image_size: int) -> float:
  """Convolution FLOPs (2 per multiply-add) of a `models/resnet.py` tower
  on one image: the stem, every bottleneck's three convolutions and its
  projected shortcut, at the sizes their strides leave (pooling, batch norms
  and ReLUs are not counted, as published per-architecture counts do not)."""
  size = resnet.RESNET_SIZES[variant]

  def out_size(side, kernel, stride):  # padding kernel // 2, as resnet._conv pads
    return (side + 2 * (kernel // 2) - kernel) // stride + 1

  def conv(side_out, kernel, in_features, out_features):
    return 2 * side_out * side_out * kernel * kernel * in_features * out_features

  side = out_size(image_size, 7, 2)
  total = conv(side, 7, 3, size["width"])
  side = out_size(side, 3, 2)  # the stem's 3x3 stride-2 max pool
  in_features = size["width"]
  for stage, num_blocks in enumerate(size["blocks"]):
    width = size["width"] * 2**stage
    out_features = width * resnet.EXPANSION
    for index in range(num_blocks):
      stride = 2 if stage > 0 and index == 0 else 1
      strided = out_size(side, 3, stride)
      total += conv(side, 1, in_features, width) + conv(strided, 3, width, width)
      total += conv(strided, 1, width, out_features)
      if stride != 1 or in_features != out_features:
        total += conv(out_size(side, 1, stride), 1, in_features, out_features)
      side, in_features = strided, out_features
  return total


def two_tower_forward_flops(
  model_config, image_size: int, context_length: int, mask_ratio: float = 0.0, *, pooled=True
) -> tuple[float, float]:
  """(image, text) forward matmul FLOPs per pair of a two-tower model; the
  image tower sees round(N (1 - mask_ratio)) patches plus CLS. `pooled`
  (the default, what the towers compute): each tower's last layer computes
  the one row it outputs (CLS, EOT); False counts every row, as published
  per-architecture counts do. A ResNet image tower (HCL's `rn50`) counts
  its convolutions (`resnet_forward_flops`; it has no patches to drop)."""
  if resnet.is_resnet_variant(model_config.image_variant):
    size = resnet.RESNET_SIZES[model_config.image_variant]
    # The pooled feature (2048 for RN50) and its projection to embed_dim.
    feature = size["width"] * 2 ** (len(size["blocks"]) - 1) * resnet.EXPANSION
    image_flops = resnet_forward_flops(model_config.image_variant, image_size)
    image_flops += 2 * feature * model_config.embed_dim
    return image_flops, _text_forward_flops(model_config, context_length, pooled)
  image = vit.decode_variant(model_config.image_variant)
  patches = (image_size // image["patch_size"]) ** 2
  kept = int(round(patches * (1.0 - mask_ratio)))
  width = image["width"]
  image_flops = (
    2 * kept * image["patch_size"] ** 2 * 3 * width
    + encoder_forward_flops(kept + 1, width, image["depth"], image["mlp_dim"], pooled=pooled)
    + 2 * width * model_config.embed_dim
  )
  return image_flops, _text_forward_flops(model_config, context_length, pooled)


def _text_forward_flops(model_config, context_length: int, pooled: bool) -> float:
  text = text_lib.TEXT_SIZES[model_config.text_variant]
  return (
    encoder_forward_flops(
      context_length, text["width"], text["depth"], 4 * text["width"], pooled=pooled
    )
    + 2 * text["width"] * model_config.embed_dim
  )


def box_slots(config) -> int:
  """Box slots per row of a several-boxes source (`input.data.max_boxes`,
  UNCHA); 0 for one box (HyCoCLIP) or none."""
  return int(config.input.data.get("max_boxes", 0) or 0)


def inputs_per_row(config, key: str, objective=None) -> int:
  """How many tower inputs of batch key `key` one row carries: the box slots
  of a several-boxes source, the objective's own count (Radial's tiers), else 1."""
  slots = box_slots(config)
  if slots and key.startswith("box_"):
    return slots
  objective = objective or objectives_lib.get(config.objective)
  return int(objective.inputs_per_row.get(key, 1))


def image_mask_ratio(config) -> float:
  """The fraction of patches the trained image tower drops: HMID-Net's
  student mask (`objective.mask_ratio`; its `model.image_token_drop` stays
  0, and counted unmasked its model FLOPs read 1.47x XLA's), else FLIP's
  token dropping (`model.image_token_drop`)."""
  if config.objective.name == "hmid":
    return float(config.objective.mask_ratio)
  return float(config.model.get("image_token_drop", 0.0) or 0.0)


def model_flops_per_step(config, mask_ratio: float | None = None, *, pooled=True) -> float:
  """Model FLOPs of one training step (global batch), the numerator of MFU:
  3x the towers' forward matmul FLOPs (forward + backward) for every image
  and text input of a row (the objective's `tower_inputs`: HyCoCLIP's box
  crops and phrases too, each of UNCHA's box slots, Radial's caption tiers),
  1x for every input a frozen copy reads (`frozen_tower_inputs`: HCL's key
  encoder, Radial's reference model), plus one forward of HMID-Net's frozen
  teacher on the full image and the text. Element-wise work, the loss and the optimizer
  are not counted (the usual convention). `pooled`: as in
  `two_tower_forward_flops` (False: the count of towers that computed every
  row of their last block, as this repository's did before commit 144e2eb)."""
  if mask_ratio is None:  # the image tower sees the kept patches
    mask_ratio = image_mask_ratio(config)
  batch = config.input.batch_size
  context = config.input.tokenizer.context_length
  image, text = two_tower_forward_flops(
    config.model, config.input.image_size, context, mask_ratio or 0.0, pooled=pooled
  )
  objective = objectives_lib.get(config.objective)

  def count(inputs, which):
    return sum(inputs_per_row(config, k, objective) for k, tower in inputs if tower == which)

  trained, frozen = objective.tower_inputs, objective.frozen_tower_inputs
  flops = 3 * (count(trained, "image") * image + count(trained, "text") * text) * batch
  # A frozen copy's inputs (HCL's key encoder, Radial's reference model): forward only.
  flops += (count(frozen, "image") * image + count(frozen, "text") * text) * batch
  if config.objective.name == "hmid":
    teacher = config.objective.teacher_model
    t_image, t_text = two_tower_forward_flops(
      teacher, config.input.image_size, context, pooled=pooled
    )
    flops += (t_image + t_text) * batch
  return flops


def image_tower_forward_flops(model_def, params, config, batch_size: int, keep_indices=None):
  """Forward FLOPs of the image tower alone; keep_indices (B, K) drops patches."""
  images = jax.ShapeDtypeStruct(
    (batch_size, config.input.image_size, config.input.image_size, 3), jnp.float32
  )
  fn = jax.jit(lambda p, x, k: model_def.merge(p).image_tower(x, keep_indices=k))
  return compiled_flops(fn.lower(params, images, keep_indices).compile())
