"""Configs parse, lock, and build at paper scale without allocating."""

import jax
import pytest
from flax import nnx

from configs import clip as clip_config
from configs import common
from configs import meru as meru_config
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
