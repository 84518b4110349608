"""The benchmark's model-FLOP count (the numerator of MFU) and its finiteness check.

On GPUs XLA's cost analysis leaves out the matrix products it hands to
cuBLAS/cuDNN, so MFU is computed from the architecture instead; these tests
pin that count to published figures and to XLA's own count on the CPU.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from configs import hcl as hcl_config
from configs import hmid as hmid_config
from configs import hycoclip as hycoclip_config
from configs import meru as meru_config
from configs import radial as radial_config
from hyperbolic_vl import objectives as objectives_lib
from hyperbolic_vl.models import resnet, two_towers
from hyperbolic_vl.tools import flops
from hyperbolic_vl.tools import step_throughput as benchmark


@pytest.mark.parametrize(
  "variant, published_gmacs",
  # timm's model table: vit_base_patch16_224 17.6 GMACs, vit_large_patch16_224 61.6 GMACs
  # (multiply-adds of one 224 px forward pass; ours counts 2 FLOPs per multiply-add).
  [("vit_b", 17.6), ("vit_l", 61.6)],
)
def test_image_tower_flops_match_published_vit_counts(variant, published_gmacs):
  config = meru_config.get_config(variant)
  # Published counts compute every row of the last block (pooled=False).
  image, _ = flops.two_tower_forward_flops(config.model, 224, 77, pooled=False)
  # The published figures are rounded to 0.1 GMAC; our count adds the 512-wide
  # projection (0.4 MMAC), far inside that rounding.
  assert image / 2 / 1e9 == pytest.approx(published_gmacs, abs=0.05)


@pytest.mark.parametrize(
  "variant, published_gmacs",
  # torchvision's model table: resnet50 4.09, resnet101 7.80, resnet152 11.51
  # "GFLOPS" (multiply-adds of one 224 px forward pass, to 0.01).
  [("RN50", 4.09), ("RN101", 7.80), ("RN152", 11.51)],
)
def test_resnet_flops_match_published_torchvision_counts(variant, published_gmacs):
  assert flops.resnet_forward_flops(variant, 224) / 2 / 1e9 == pytest.approx(
    published_gmacs, abs=0.005
  )


def _convolution_flops(jaxpr) -> int:
  """2 x multiply-adds of every convolution in a traced program (nested ones too)."""
  total = 0
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == "conv_general_dilated":
      kernel = eqn.invars[1].aval.shape
      out_features = kernel[eqn.params["dimension_numbers"].rhs_spec[0]]
      total += 2 * math.prod(eqn.outvars[0].aval.shape) * math.prod(kernel) // out_features
    for sub in jax.core.jaxprs_in_params(eqn.params):
      total += _convolution_flops(sub)
  return total


def test_resnet_flops_equal_the_traced_towers_convolutions():
  # An odd image size exercises the strided sizes' rounding; the count is
  # of the tower as traced (nothing compiled), so the two agree exactly.
  for variant, image_size in [("RN-mu", 33), ("RN50", 64)]:
    graph, state = nnx.split(
      nnx.eval_shape(lambda v=variant, s=image_size: resnet.ResNet(v, s, rngs=nnx.Rngs(0)))
    )
    images = jax.ShapeDtypeStruct((2, image_size, image_size, 3), jnp.float32)
    traced = jax.make_jaxpr(lambda st, x: nnx.merge(graph, st)(x))(state, images)
    assert _convolution_flops(traced.jaxpr) == 2 * flops.resnet_forward_flops(variant, image_size)


def test_hcl_rn50_step_counts_its_convolutions():
  # HCL's paper backbone: the same 3 + 1 tower passes per input as its ViT
  # variants (test_frozen_copies_count_one_forward_and_radial_counts_its_tiers),
  # each the ResNet's convolutions and the 2048 -> 128 projection.
  config = hcl_config.get_config("rn50")
  image, _ = flops.two_tower_forward_flops(config.model, 224, 77)
  assert image == flops.resnet_forward_flops("RN50", 224) + 2 * 2048 * 128
  assert flops.model_flops_per_step(config) == pytest.approx(
    (3 * 3 + 3 * 1) * image * config.input.batch_size, rel=1e-12
  )


def test_encoder_flops_by_hand():
  # One layer, 3 tokens, width 4, MLP 8: QKV+out 4*16, MLP 2*32 multiply-adds
  # per token; QK^T and AV 2 * 3 * 4 per query.
  expected = 2 * 3 * (4 * 16 + 2 * 4 * 8) + 4 * 3 * 3 * 4
  assert flops.encoder_forward_flops(3, 4, 1, 8) == expected
  # Pooled, one layer: QKV for the 3 rows (3 * 16 each), the output
  # projection (16) and MLP (64) for one; QK^T and AV 2 * 3 * 4 for one query.
  pooled = 2 * 3 * 3 * 16 + 2 * (16 + 64) + 4 * 3 * 4
  assert flops.encoder_forward_flops(3, 4, 1, 8, pooled=True) == pooled
  # Two layers: the first in full.
  assert flops.encoder_forward_flops(3, 4, 2, 8, pooled=True) == expected + pooled


def test_hmid_step_adds_teacher_forward_and_masking_shrinks_student():
  config = hmid_config.get_config("vit_b")
  image, text = flops.two_tower_forward_flops(config.model, 224, 77)
  full = flops.model_flops_per_step(config, 0.0)
  assert full == pytest.approx(4 * (image + text) * config.input.batch_size, rel=1e-12)
  masked_image, _ = flops.two_tower_forward_flops(config.model, 224, 77, mask_ratio=0.5)
  # 98 of 196 patches + CLS: the encoder part roughly halves.
  assert 0.45 < masked_image / image < 0.55
  assert flops.model_flops_per_step(config, 0.5) == pytest.approx(
    full - 3 * (image - masked_image) * config.input.batch_size, rel=1e-12
  )
  # Unnamed, the ratio is the student's own (objective.mask_ratio, 0.5 here).
  assert config.objective.mask_ratio == 0.5 and config.model.image_token_drop == 0
  assert flops.model_flops_per_step(config) == flops.model_flops_per_step(config, 0.5)


def test_hycoclip_step_counts_box_crops_and_phrases():
  # Each row sends a whole image, a box crop, a caption and a phrase through
  # the towers: twice MERU's image and text forward passes.
  config = hycoclip_config.get_config("vit_b")
  image, text = flops.two_tower_forward_flops(config.model, 224, 77)
  assert flops.model_flops_per_step(config) == pytest.approx(
    3 * 2 * (image + text) * config.input.batch_size, rel=1e-12
  )


def test_frozen_copies_count_one_forward_and_radial_counts_its_tiers():
  """HCL: view 1 and the scene through the query encoder (3x), view 2 and
  the object through the momentum key encoder (1x), and with the symmetric
  object loss view 2 -> query and view 1 -> key as well; no text tower.
  Radial: 4 caption tiers and 4 negatives per row through the trained text
  tower (3x) and the frozen reference copy (1x); no image tower."""
  config = hcl_config.get_config("vit_b")
  image, _ = flops.two_tower_forward_flops(config.model, 224, 77)
  batch = config.input.batch_size
  assert config.objective.object_loss == "symmetric" and config.objective.hyp_weight > 0
  assert flops.model_flops_per_step(config) == pytest.approx(
    (3 * 3 + 3 * 1) * image * batch, rel=1e-12
  )
  with config.unlocked():
    config.objective.object_loss = "paper"
    config.objective.hyp_weight = 0.0
  assert flops.model_flops_per_step(config) == pytest.approx((3 + 1) * image * batch, rel=1e-12)
  config = radial_config.get_config("vit_b")
  context = config.input.tokenizer.context_length
  _, text = flops.two_tower_forward_flops(config.model, config.input.image_size, context)
  assert flops.model_flops_per_step(config) == pytest.approx(
    (3 + 1) * 8 * text * config.input.batch_size, rel=1e-12
  )
  tokenizer = benchmark._FixedTokenizer(64, context)
  rows = benchmark.synthetic_batch(config, tokenizer, 2, objectives_lib.get(config.objective))
  assert sorted(rows) == ["index", "neg_tier_tokens", "tier_tokens"]
  assert rows["tier_tokens"].shape == rows["neg_tier_tokens"].shape == (2, 4, context)


# HyCoCLIP with its box crops through the towers in a second call repeats
# the one-call count's path (the same terms, counted twice): slow tier.
@pytest.mark.parametrize(
  "module, calls",
  [
    (meru_config, 1),
    (hycoclip_config, 1),
    pytest.param(hycoclip_config, 2, marks=pytest.mark.slow),
  ],
)
def test_model_flops_close_to_xla_count_on_cpu(module, calls):
  # On the CPU every dot is XLA's own, so its cost analysis of the whole step
  # (matmuls + element-wise work + optimizer) bounds our matmul-only count from
  # above, and the element-wise share of the tiny model is under 15%.
  # HyCoCLIP's step compiles only with box crops and phrases in the
  # synthetic batch, and counts them whether the towers run once or twice.
  config = module.get_config("tiny")
  with config.unlocked():
    config.input.batch_size = 16
    config.num_devices = 1
    if module is hycoclip_config:
      config.objective.box_tower_calls = calls
  compiled, _, batch, *_ = benchmark.compile_step(config)
  xla = flops.compiled_flops(compiled)
  ours = flops.model_flops_per_step(config)
  assert 0.85 * xla < ours < xla
  if module is hycoclip_config:
    assert batch["box_image"].shape == batch["image"].shape
    assert batch["box_tokens"].shape == batch["tokens"].shape


def test_check_finite_names_the_bad_metric():
  ok = benchmark.check_finite(3, {"train/loss": jax.numpy.float32(1.5), "vec": np.zeros(2)})
  assert ok == {"train/loss": 1.5}
  with pytest.raises(FloatingPointError, match="train/curv"):
    benchmark.check_finite(7, {"train/loss": 1.0, "train/curv": float("nan")})


def test_attention_flag_reaches_every_attention_layer():
  config = hmid_config.get_config("tiny")
  benchmark.set_attention_implementation(config, "xla")
  assert config.objective.teacher_model.attention_implementation == "xla"
  model = two_towers.build_two_towers(
    config.model, vocab_size=64, context_length=8, image_size=32, rngs=nnx.Rngs(0)
  )
  choices = [
    node.attention_implementation
    for _, node in nnx.iter_graph(model)
    if hasattr(node, "attention_implementation")
  ]
  # mu towers: 2 image + 2 text layers, plus the two tower modules that hold the choice.
  assert len(choices) >= 4 and set(choices) == {"xla"}


def test_dry_run_shapes_shrink_sizes_and_keep_options():
  """`--dry_run` compiles a command's step at tiny shapes: towers (the
  teacher's too), images, tokens and rows shrink; objective, optimizer,
  mesh and dtype settings stay; the command's own config is untouched."""
  config = hmid_config.get_config("vit_b")
  with config.unlocked():
    config.mesh.fsdp = 2
    config.optim.mu_dtype = "bfloat16"
  tiny = benchmark.tiny_shapes(config)
  assert (tiny.model.image_variant, tiny.model.text_variant) == ("mu/8", "mu")
  assert tiny.objective.teacher_model.image_variant == "mu/8"
  assert tiny.input.batch_size == 2 * jax.device_count() and tiny.input.image_size == 32
  assert tiny.input.tokenizer.context_length == 16
  assert tiny.mesh.fsdp == 2 and tiny.optim.to_dict() == config.optim.to_dict()
  assert tiny.model.dtype == config.model.dtype
  assert tiny.objective.mask_ratio == config.objective.mask_ratio
  assert config.model.image_variant == "B/16" and config.input.image_size == 224
  resnet = benchmark.tiny_shapes(hcl_config.get_config("rn50"))
  assert resnet.model.image_variant == "RN-mu"


# fsdp=1 is the replicated bf16 step every bf16 run compiles (the bf16 run
# of tests/train/test_inference.py): slow tier.
@pytest.mark.parametrize("fsdp", [pytest.param(1, marks=pytest.mark.slow), 2])
def test_bf16_step_compiles_with_sharded_params(fsdp):
  """The paper configs' bf16 towers with params sharded over an fsdp axis:
  on a CPU the dense layers' custom weight gradient must take operands and
  return gradients typed alike inside shard_map (varying over the data and
  fsdp axes); the GPU script's dry run first caught it. fsdp=1 is the
  replicated baseline, compiled the same way."""
  config = meru_config.get_config("vit_b")
  with config.unlocked():
    config.mesh.fsdp = fsdp
  compiled, state, batch, *_ = benchmark.compile_step(benchmark.tiny_shapes(config))
  new_state, metrics = compiled(state, batch)
  assert np.isfinite(float(jax.device_get(metrics["train/loss"])))
