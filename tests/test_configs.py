"""Configs parse, lock, and build at paper scale without allocating."""

import jax
import pytest
from flax import nnx

from configs import clip as clip_config
from configs import common
from configs import meru as meru_config
from hyperbolic_vl import train


def tower_counts(config):
  model = train.abstract_model(config)
  params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
  count = train.param_count
  return count(params["image_tower"]), count(params["text_tower"]), params


@pytest.mark.parametrize(
  "get_config,arg,image_expected",
  [
    (meru_config.get_config, "vit_l", 304e6),
    (clip_config.get_config, "vit_b", 86e6),
    (meru_config.get_config, "vit_s", 22e6),
  ],
)
def test_paper_variants_build_abstractly_with_standard_counts(get_config, arg, image_expected):
  config = get_config(arg)
  assert config.input.image_size == 224 and config.input.batch_size == 2048
  assert config.total_steps == 120_000 and config.optim.lr == 5e-4
  assert config.optim.warmup_steps == 4000 and config.model.embed_dim == 512
  image, text, params = tower_counts(config)
  assert abs(image - image_expected) / image_expected <= 0.02, image
  assert abs(text - 63e6) / 63e6 <= 0.02, text
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
