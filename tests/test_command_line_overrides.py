"""hyperbolic_vl.command_line.apply_overrides: KEY=VALUE read as its key's type."""

import pytest

from configs import meru as meru_config
from hyperbolic_vl import command_line, errors


def test_each_value_takes_the_type_of_the_value_it_replaces():
  config = meru_config.get_config("vit_s")
  command_line.apply_overrides(
    config,
    [
      "input.image_size=32",  # int
      "model.image_variant=mu/8",  # text, as it is
      "model.curv_init=2",  # float, written without a point
      "model.learn_curv=false",  # bool
    ],
  )
  assert config.input.image_size == 32 and isinstance(config.input.image_size, int)
  assert config.model.image_variant == "mu/8"
  assert config.model.curv_init == 2.0 and isinstance(config.model.curv_init, float)
  assert config.model.learn_curv is False


@pytest.mark.parametrize(
  ("override", "said"),
  [
    ("model.embed_dimm=3", "config.model has no 'embed_dimm'; its keys: activation,"),
    ("input.image_size=abc", "input.image_size=abc: input.image_size takes an integer"),
    ("model.learn_curv=maybe", "model.learn_curv takes true or false"),
    ("model.embed_dim", "expected KEY=VALUE"),
  ],
)
def test_a_wrong_key_or_value_is_one_line(override, said):
  with pytest.raises(errors.ConfigError) as error:
    command_line.apply_overrides(meru_config.get_config("vit_s"), [override])
  assert said in str(error.value) and "\n" not in str(error.value)
