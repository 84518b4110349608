"""configs/adapt_clip.py: a converted Euclidean CLIP lifted onto the
hyperboloid with LoRA. What the first step starts from: CLIP's weights
bitwise, fresh adapters and Lorentz scalars, a fresh logit scale."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax.nnx import traversals

from configs import adapt_clip
from configs import clip as clip_config
from hyperbolic_vl import errors
from hyperbolic_vl import objectives as objectives_lib
from hyperbolic_vl.data import tokenizer as tokenizer_lib
from hyperbolic_vl.geometry import lorentz
from hyperbolic_vl.interop import workdir as interop_workdir
from hyperbolic_vl.models import lora
from hyperbolic_vl.training import setup

# The recipe's towers at a CPU-test size; everything else is the recipe's.
TINY_TOWERS = {"image_variant": "mu/8", "text_variant": "mu", "embed_dim": 64}


def _tiny(config):
  with config.unlocked():
    config.model.update(TINY_TOWERS)
    config.input.image_size = 16
  return config


def _flat(tree):
  return {"/".join(map(str, k)): v for k, v in traversals.flatten_mapping(tree).items()}


@pytest.fixture(scope="module")
def converted_clip(tmp_path_factory):
  """A 'converted' OpenAI-layout CLIP workdir (random weights, logit scale 100)."""
  config = _tiny(clip_config.get_config("openai_vit_b32"))
  with config.unlocked():
    config.model.dtype = "float32"  # the recipe's towers compute in float32
  objective = objectives_lib.get(config.objective)
  tokenizer = tokenizer_lib.get_tokenizer(config.input.tokenizer)
  model_def, params = setup.build_model(config, objective, tokenizer, seed=3)
  params = dict(params, log_logit_scale=jnp.asarray(math.log(100.0), jnp.float32))
  workdir = str(tmp_path_factory.mktemp("openai_b32"))
  interop_workdir.write_workdir(params, config, workdir)
  return workdir, params, model_def


def test_the_recipe_starts_from_clip_with_fresh_adapters_and_scalars(converted_clip):
  workdir, clip_params, clip_def = converted_clip
  config = _tiny(adapt_clip.get_config("vit_b32,data=world"))
  with config.unlocked():
    config.init_from = workdir
    config.total_steps = 20
  objective = objectives_lib.get(config.objective)
  tokenizer = tokenizer_lib.get_tokenizer(config.input.tokenizer)
  initial = setup.init_state(config, objective, tokenizer)
  state = initial.state
  mine, theirs = _flat(state["params"]), _flat(clip_params)

  for name, value in theirs.items():
    if name != "log_logit_scale":
      np.testing.assert_array_equal(mine[name], value, err_msg=name)
  # HySAC's fresh scalars: logit scale 1/0.07, c = 1, alphas 1/sqrt(64).
  np.testing.assert_allclose(mine["log_logit_scale"], math.log(1 / 0.07), rtol=1e-6)
  assert float(mine["log_curv"]) == 0.0
  np.testing.assert_allclose(mine["log_alpha_img"], math.log(64**-0.5), rtol=1e-6)
  adapters = {name for name in mine if lora.is_adapter_path(tuple(name.split("/")))}
  assert adapters == set(mine) - set(theirs) - {"log_curv", "log_alpha_img", "log_alpha_txt"}
  # HySAC's targets: k, v, out, fc1, fc2 and the patch embedding; no q.
  kinds = {name.split("/")[-2] for name in adapters}
  assert kinds == {"lora_k", "lora_v", "lora_out", "lora_fc1", "lora_fc2", "lora_patch"}

  # Only the adapters and the four scalars train.
  mask = _flat(initial.trainable)
  assert {name for name, trains in mask.items() if trains} == adapters | {
    "log_logit_scale",
    "log_curv",
    "log_alpha_img",
    "log_alpha_txt",
  }

  # Step 0: the hyperbolic embedding is exp_map0 of CLIP's own projected
  # features times alpha (the adapters add exact zeros).
  images = jax.random.uniform(jax.random.key(0), (4, 16, 16, 3))
  # Each tower compiled whole (run eagerly, each operation compiles alone).
  clip_features = jax.jit(lambda p: clip_def.merge(p).image_tangent(images))(clip_params)
  lifted = jax.jit(lambda p: initial.model_def.merge(p).encode_image(images))(state["params"])
  expected = lorentz.exp_map0(clip_features * 64**-0.5, jnp.asarray(1.0))
  np.testing.assert_allclose(lifted, expected, rtol=1e-6, atol=1e-7)


def test_the_recipe_refuses_to_start_without_a_clip_to_adapt():
  config = _tiny(adapt_clip.get_config("vit_b32,data=world"))
  objective = objectives_lib.get(config.objective)
  tokenizer = tokenizer_lib.get_tokenizer(config.input.tokenizer)
  with pytest.raises(errors.ConfigError, match="config.init_from is required"):
    setup.init_state(config, objective, tokenizer)


def test_recipe_variants_and_objectives():
  large = adapt_clip.get_config("vit_l14,objective=hycoclip")
  assert (large.model.image_variant, large.model.embed_dim) == ("L/14", 768)
  assert (large.objective.name, large.input.data.name) == ("hycoclip", "grit")
  with pytest.raises(errors.ConfigError, match="variant"):
    adapt_clip.get_config("vit_s")
