"""Configs parse, lock, and build at paper scale without allocating."""

import jax
import pytest
from flax import nnx

from configs import clip as clip_config
from configs import common
from configs import hycoclip as hycoclip_config
from configs import meru as meru_config
from configs import phyclip as phyclip_config
from hyperbolic_vl.models import registry as models_registry


@pytest.mark.parametrize(
  "get_config,arg,image_width",
  [
    (meru_config.get_config, "vit_l", 1024),
    (clip_config.get_config, "vit_b", 768),
    (meru_config.get_config, "vit_s", 384),
  ],
)
def test_paper_variants_build_abstractly(get_config, arg, image_width):
  config = get_config(arg)
  assert config.input.image_size == 224 and config.input.batch_size == 2048
  assert config.total_steps == 120_000 and config.optim.lr == 5e-4
  assert config.optim.warmup_steps == 4000 and config.model.embed_dim == 512
  # Exact parameter counts of each tower size are asserted once, in test_towers.
  params = nnx.to_pure_dict(nnx.state(models_registry.abstract_model(config), nnx.Param))
  assert params["image_proj"]["kernel"].shape == (image_width, 512)
  embedding = params["text_tower"]["token_embedding"]["embedding"]
  assert embedding.shape == (49408, 512)
  # Abstract: nothing was allocated.
  assert all(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree.leaves(params))


def test_meru_paper_hyperparameters():
  config = meru_config.get_config("vit_b")
  assert config.objective.entail_weight == 0.2
  assert abs(config.model.logit_scale_init - 1 / 0.07) < 1e-9
  assert config.model.max_logit_scale == 100.0
  assert config.model.curv_init == 1.0 and config.model.geometry == "lorentz"
  assert config.optim.weight_decay == 0.2 and (config.optim.b1, config.optim.b2) == (0.9, 0.98)


@pytest.mark.parametrize("variant", ["vit_s", "vit_b", "vit_l"])
def test_hycoclip_paper_variants_have_the_released_hyperparameters(variant):
  # The released train_hycoclip_vit_{s,b,l}.py: batch 768, 500k iterations,
  # AdamW 5e-4 (0.9, 0.98) wd 0.2, gains and biases decayed too (the
  # released `gain_bias_decay or weight_decay`), 4k warmup,
  # entail_weight 0.2, apertures 0.7 / 1.2, 224 px, 77 tokens.
  config = hycoclip_config.get_config(variant)
  assert (config.input.batch_size, config.total_steps, config.input.image_size) == (
    768,
    500_000,
    224,
  )
  assert (config.optim.lr, config.optim.warmup_steps, config.optim.weight_decay) == (
    5e-4,
    4000,
    0.2,
  )
  assert (config.optim.b1, config.optim.b2, config.optim.decay_gains_biases) == (0.9, 0.98, True)
  objective = config.objective
  assert (objective.entail_weight, objective.inter_modal_aperture) == (0.2, 0.7)
  assert objective.intra_modal_aperture == 1.2
  assert config.model.curv_init == 1.0 and config.model.learn_curv
  assert config.input.tokenizer.context_length == 77 and config.input.data.name == "world_boxes"
  # MERU's model, whose paper variants build abstractly above.
  assert config.model == meru_config.get_config(variant).model


def test_hycoclip_tiny_matches_merus_tiny_but_for_objective_data_and_evals():
  meru, hyco = meru_config.get_config().to_dict(), hycoclip_config.get_config().to_dict()
  for key in ("objective", "input", "evals"):
    meru.pop(key), hyco.pop(key)
  assert meru == hyco
  assert meru_config.get_config().input.batch_size == hycoclip_config.get_config().input.batch_size


@pytest.mark.parametrize("variant", ["vit_s", "vit_b", "vit_l"])
def test_phyclip_paper_variants_have_the_released_hyperparameters(variant):
  # The released train_phyclip_vit_{s,b,l}.py: embed 512 in factors of 8
  # (subspace_dim), lorentz_eps 1e-6, l1, batch 768, 500k iterations, AdamW
  # 5e-4 (0.9, 0.98) wd 0.2 on gains, biases and the per-factor scalars too.
  config = phyclip_config.get_config(variant)
  assert (config.model.embed_dim, config.model.factor_dim) == (512, 8)
  assert (config.objective.eps, config.objective.product_metric) == (1e-6, "l1")
  assert (config.input.batch_size, config.total_steps) == (768, 500_000)
  assert (config.optim.lr, config.optim.warmup_steps, config.optim.weight_decay) == (
    5e-4,
    4000,
    0.2,
  )
  assert config.optim.decay_gains_biases and config.optim.decay_factor_scalars
  assert config.objective.entail_weight == 0.2 and config.input.data.name == "world_boxes"
  # MERU's model in factors: the towers of each size build abstractly above.
  meru_model = meru_config.get_config(variant).model
  with meru_model.unlocked():
    meru_model.factor_dim = 8
  assert config.model == meru_model


def test_phyclip_paper_model_builds_abstractly_with_per_factor_scalars():
  # The factors do not depend on the image tower's size: ViT-S, the cheapest.
  config = phyclip_config.get_config("vit_s")
  params = nnx.to_pure_dict(nnx.state(models_registry.abstract_model(config), nnx.Param))
  assert params["image_proj"]["kernel"].shape == (384, 512)
  assert params["log_curv"].shape == params["log_alpha_img"].shape == (64,)


def test_phyclip_tiny_is_hycoclips_tiny_in_eight_factors():
  hyco, phy = hycoclip_config.get_config().to_dict(), phyclip_config.get_config().to_dict()
  hyco.pop("objective"), phy.pop("objective")
  assert phy["model"].pop("factor_dim") == 8 and hyco["model"].pop("factor_dim") == 0
  assert hyco == phy


def test_meru_paper_variants_decay_gains_and_biases_as_released_tiny_does_not():
  assert meru_config.get_config("vit_b").optim.decay_gains_biases is True
  assert meru_config.get_config().optim.decay_gains_biases is False


def test_parse_arg_variants_and_flags():
  assert common.parse_arg("vit_l", variant="tiny").variant == "vit_l"
  parsed = common.parse_arg("variant=vit_s,runlocal", variant="tiny", runlocal=False)
  assert parsed.variant == "vit_s" and parsed.runlocal is True
  with pytest.raises(ValueError, match="valid"):
    common.parse_arg("colour=red", variant="tiny")
  with pytest.raises(ValueError, match="vit_l"):
    meru_config.get_config("vit_xxl")


def test_configs_are_locked_against_unknown_keys():
  config = meru_config.get_config()
  with pytest.raises(AttributeError):
    config.totl_steps = 5
