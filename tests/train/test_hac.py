"""configs/hac.py and the model pieces HAC adds: rank-stabilised LoRA by its
definition, excluded blocks, NEFTune's noise, and the tiny variant training
from a converted random-weight CLIP with only what HAC trains moving."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from flax.nnx import traversals

from configs import clip as clip_config
from configs import hac as hac_config
from hyperbolic_vl import objectives as objectives_lib
from hyperbolic_vl.data import tokenizer as tokenizer_lib
from hyperbolic_vl.interop import meru as meru_interop
from hyperbolic_vl.interop import workdir as interop_workdir
from hyperbolic_vl.models import locking, lora, text
from hyperbolic_vl.training import loop, setup


def _flat(tree):
  """{"a/b/0/c": host array} of a nested param tree."""
  tree = jax.device_get(tree)
  return {"/".join(map(str, k)): np.asarray(v) for k, v in traversals.flatten_mapping(tree).items()}


def test_rank_stabilised_lora_is_w_plus_alpha_over_sqrt_r_times_a_b():
  """PEFT's use_rslora: W + (alpha / sqrt(r)) A B, by hand, for the adapter's
  forward and for the merged kernel (the q columns of a fused qkv)."""
  rank, alpha, width = 4, 8.0, 6
  settings = lora.LoraSettings(rank=rank, alpha=alpha, targets=("q",), rank_stabilised=True)
  assert settings.scale == alpha / 2  # sqrt(4) = 2; plain LoRA would be alpha / 4
  rng = np.random.default_rng(0)
  down, up = rng.normal(size=(width, rank)), rng.normal(size=(rank, width))
  x, kernel = rng.normal(size=(3, width)), rng.normal(size=(width, 3 * width))
  with jax.enable_x64(True):
    adapter = lora.LowRankAdapter(
      width, width, settings, dtype=jnp.float64, param_dtype=jnp.float64, rngs=nnx.Rngs(0)
    )
    adapter.down[...], adapter.up[...] = jnp.asarray(down), jnp.asarray(up)
    np.testing.assert_allclose(adapter(jnp.asarray(x)), x @ down @ up * 4.0, rtol=1e-12)
    params = {"attn": {"qkv": {"kernel": kernel}, "lora_q": {"down": down, "up": up}}}
    model_config = {"lora": {"rank": rank, "alpha": alpha, "rank_stabilised": True}}
    merged = np.asarray(lora.merge_adapters(params, model_config)["attn"]["qkv"]["kernel"])
  expected = kernel.copy()
  expected[:, :width] += (alpha / math.sqrt(rank)) * down @ up
  np.testing.assert_allclose(merged, expected, rtol=1e-12)


def test_the_recipe_adapts_the_release_blocks_and_trains_what_hac_trains():
  config = hac_config.get_config()
  assert config.model.lora.rank == 128 and config.model.text_embedding_noise == 0.1
  assert (config.optim.lr, config.optim.warmup_steps, config.total_steps) == (2.5e-4, 4000, 30_000)
  assert (config.input.batch_size, config.optim.b1, config.optim.b2) == (768, 0.9, 0.98)
  from hyperbolic_vl.models import registry as models_registry

  params = nnx.to_pure_dict(nnx.state(models_registry.abstract_model(config), nnx.Param))
  names = _flat(params)
  adapted = {
    (n.split("/")[0], int(n.split("/")[3]), n.split("/")[5]) for n in names if "lora_" in n
  }
  expected = {
    (tower, block, f"lora_{target}")
    for tower, blocks in (("image_tower", range(8, 12)), ("text_tower", range(4, 12)))
    for block in blocks
    for target in ("q", "k", "v", "out")
  }
  assert adapted == expected
  locks = locking.Locks.from_model_config(config.model, params)
  trained = {n for n in names if not locks.locked(tuple(n.split("/")))}
  beside = {n for n in trained if "lora_" not in n}
  assert beside == {
    "image_proj/kernel",
    "text_proj/kernel",
    "image_tower/norm/scale",
    "image_tower/norm/bias",
    "text_tower/norm/scale",
    "text_tower/norm/bias",
    "log_logit_scale",
    "log_curv",
    "log_alpha_img",
    "log_alpha_txt",
  }


def test_neftune_noise_is_the_releases_and_only_in_training():
  """U(-1, 1) x alpha / sqrt(n d) on the n real tokens, none on padding
  (hac/encoders/text_encoders.py:19-35), added after the position embedding;
  no key (evaluation): the tower is deterministic."""
  alpha, width = 0.1, 64
  tokens = jnp.asarray([[5, 9, 3, 40, 0, 0], [7, 40, 0, 0, 0, 0]])
  noise = np.asarray(text.neftune_noise(jax.random.key(1), tokens, width, alpha))
  for row, real in ((0, 4), (1, 2)):
    bound = alpha / math.sqrt(real * width)
    assert np.all(noise[row, real:] == 0)
    assert np.abs(noise[row, :real]).max() <= bound
    # 4 x 64 (2 x 64) uniform draws reach within 10% of the bound.
    assert np.abs(noise[row, :real]).max() > 0.9 * bound

  tower = text.TextTransformer("mu", 64, 6, embedding_noise=alpha, rngs=nnx.Rngs(0))
  assert lora.has_dropout(tower)
  graphdef, state = nnx.split(tower)

  @jax.jit
  def plain_noisy_and_by_hand(state, key):
    # As a training step: merged, then given its key (lora.training_mode).
    tower = nnx.merge(graphdef, state)
    plain = tower(tokens)
    lora.training_mode(tower, key)
    noisy = tower(tokens)
    features = tower.token_embedding(tokens) + tower.positional_embedding[...]
    features = features + text.neftune_noise(
      jax.random.fold_in(tower.noise_key, 0), tokens, width, alpha
    )
    by_hand = tower.norm(tower.encoder(features, output_position=jnp.argmax(tokens, -1)))
    return plain, noisy, by_hand

  plain, noisy, by_hand = plain_noisy_and_by_hand(state, jax.random.key(2))
  # Same float32 ops in the same order: equal up to XLA's fusion choices.
  np.testing.assert_allclose(noisy, by_hand, rtol=1e-6, atol=1e-6)
  assert float(jnp.max(jnp.abs(noisy - plain))) > 1e-4


@pytest.fixture(scope="module")
def converted_random_clip(tmp_path_factory):
  """A tiny random-weight CLIP written in MERU's layout (the release's
  clip_vit_b.pth's) and converted back into a run, as `convert` does."""
  config = clip_config.get_config("tiny")
  with config.unlocked():
    config.input.image_size = 16
  objective = objectives_lib.get(config.objective)
  tokenizer = tokenizer_lib.get_tokenizer(config.input.tokenizer)
  _, params = setup.build_model(config, objective, tokenizer, seed=5)
  flat = {k: np.asarray(v) for k, v in _flat(params).items()}
  state_dict = meru_interop.export(flat, pixel_stats="imagenet", image_size=16)
  converted, _ = interop_workdir.convert_state_dict("meru", state_dict, config)
  workdir = str(tmp_path_factory.mktemp("clip_tiny"))
  interop_workdir.write_workdir(converted, config, workdir)
  return workdir, _flat(converted)


@pytest.mark.slow  # ~12 s on 2 cores: the training step's compile
def test_tiny_variant_trains_only_adapters_projections_norms_and_scalars(
  converted_random_clip, tmp_path
):
  clip_dir, clip_params = converted_random_clip
  config = hac_config.get_config("tiny")
  with config.unlocked():
    config.init_from = clip_dir
    config.input.image_size = 16
    config.input.batch_size = 16
    config.total_steps = 3
    config.ckpt_steps = 3
    config.log_training_steps = 3
    config.optim.warmup_steps = 1
    config.evals = {}
  result = loop.train(config, str(tmp_path / "hac"))
  start = _flat(setup.init_state(config, result.objective, result.tokenizer).state["params"])
  final = _flat(result.state["params"])

  fresh = ("image_proj/", "text_proj/", "image_tower/norm/", "text_tower/norm/")
  scalars = {"log_logit_scale", "log_curv", "log_alpha_img", "log_alpha_txt"}
  trained = {n for n in start if "lora_" in n or n.startswith(fresh) or n in scalars}
  # The first step starts from CLIP's weights (logit scale included) with
  # the projections and final norms re-initialised (norms to 1 and 0).
  for name, value in clip_params.items():
    if not name.startswith(fresh):
      np.testing.assert_array_equal(start[name], value, err_msg=name)
  assert float(np.abs(start["image_proj/kernel"] - clip_params["image_proj/kernel"]).max()) > 0
  np.testing.assert_array_equal(start["text_tower/norm/scale"], 1.0)
  np.testing.assert_array_equal(start["image_tower/norm/bias"], 0.0)
  # Block 0 of each tower has no adapters (the tiny variant's exclusion).
  assert not any("/blocks/0/" in n for n in start if "lora_" in n)
  assert any("/blocks/1/" in n for n in start if "lora_" in n)

  for name, value in start.items():
    if name in trained:
      assert float(np.max(np.abs(final[name] - value))) > 0, name
    else:
      np.testing.assert_array_equal(final[name], value, err_msg=name)
  assert float(final["log_curv"]) != 0.0  # the curvature moved from c = 1
