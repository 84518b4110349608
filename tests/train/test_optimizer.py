"""The optimizer: decay mask, schedules (warmup-cosine, MoCo's per-epoch cosine), AdamW and
PyTorch-style SGD, and clipping off by default (no paper or released code clips).

Clipping: Gradient clipping: off by default (no paper or released code clips), on as an option."""

import importlib

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest
from paths import method_config_names
from tiny_fixtures import tiny_two_towers as tiny_model

from hyperbolic_vl import errors
from hyperbolic_vl.training import optimizer

CONFIGS = method_config_names(recipes=True)


def test_weight_decay_mask_excludes_scalars_biases_and_gains():
  model_def, params = tiny_model(geometry="lorentz")
  mask = optimizer.weight_decay_mask(params, decay_gains_biases=False)
  assert mask["image_proj"]["kernel"] is True
  assert mask["log_curv"] is False and mask["log_logit_scale"] is False
  flat = {optimizer.path_str(p): v for p, v in jax.tree_util.tree_flatten_with_path(mask)[0]}
  assert not any(v for k, v in flat.items() if k.endswith("bias") or k.endswith("scale"))
  mask_all = optimizer.weight_decay_mask(params, decay_gains_biases=True)
  flat_all = {
    optimizer.path_str(p): v for p, v in jax.tree_util.tree_flatten_with_path(mask_all)[0]
  }
  assert all(v for k, v in flat_all.items() if not k.split("/")[-1].startswith("log_"))


def test_phyclip_paper_variants_decay_the_per_factor_scalars_as_released():
  """PHyCLIP's release decays its per-factor curvatures and alphas (its
  exclusion names never match a ParameterList's "0".."63") and LayerNorm
  gains and biases; only the logit scale is spared. The mask does the same
  for the (K,) scalars of a product model, and never for 0-d scalars."""
  config = importlib.import_module("configs.phyclip").get_config("vit_b")
  assert config.optim.decay_factor_scalars is True and config.optim.decay_gains_biases is True
  _, params = tiny_model(geometry="lorentz", factor_dim=4)
  mask = optimizer.weight_decay_mask(params, True, decay_factor_scalars=True)
  for name in ("log_curv", "log_alpha_img", "log_alpha_txt"):
    assert mask[name] is True, name
  assert mask["log_logit_scale"] is False
  assert mask["image_tower"]["norm"]["scale"] is True
  # A one-space model's scalars stay undecayed under the same option.
  _, plain = tiny_model(geometry="lorentz")
  plain_mask = optimizer.weight_decay_mask(plain, True, decay_factor_scalars=True)
  assert plain_mask["log_curv"] is False and plain_mask["log_alpha_img"] is False
  # Without the option (the tiny variant, the paper's reading) nothing scalar decays.
  off = optimizer.weight_decay_mask(params, True)
  assert not any(off[name] for name in ("log_curv", "log_alpha_img", "log_alpha_txt"))


def test_schedule_warmup_then_cosine_to_zero():
  optim = ml_collections.ConfigDict(dict(lr=1e-3, warmup_steps=10))
  schedule = optimizer.learning_rate_schedule(optim, 110)
  np.testing.assert_allclose(schedule(0), 0.0)
  np.testing.assert_allclose(schedule(5), 5e-4, rtol=1e-6)
  np.testing.assert_allclose(schedule(10), 1e-3, rtol=1e-6)
  np.testing.assert_allclose(schedule(60), 5e-4, rtol=1e-5)  # half-way down the cosine
  np.testing.assert_allclose(schedule(110), 0.0, atol=1e-12)


def _adam_first_moment(optim_config, grad_value):
  """Adam's first moment after one update with a constant gradient."""
  params = {"w": jnp.zeros((3, 2), jnp.float32)}
  tx, _ = optimizer.make_optimizer(optim_config, 10, params, lambda path: True)
  grads = {"w": jnp.full((3, 2), grad_value, jnp.float32)}
  _, state = tx.update(grads, tx.init(params), params)
  is_adam = lambda x: isinstance(x, optax.ScaleByAdamState)
  moments = [s.mu["w"] for s in jax.tree.leaves(state, is_leaf=is_adam) if is_adam(s)]
  assert len(moments) == 1
  return np.asarray(moments[0], np.float64)


@pytest.mark.parametrize("name", CONFIGS)
def test_every_config_leaves_clipping_off(name):
  config = importlib.import_module(f"configs.{name}").get_config()
  assert config.optim.grad_clip_norm == 0.0


def test_default_passes_a_huge_gradient_unclipped():
  config = importlib.import_module("configs.clip").get_config()
  # Unclipped: mu = (1 - b1) g exactly (float32 rounding only, rtol 1e-6).
  mu = _adam_first_moment(config.optim, 1e6)
  np.testing.assert_allclose(mu, (1 - config.optim.b1) * 1e6, rtol=1e-6)


def test_clip_option_scales_to_the_global_norm():
  config = importlib.import_module("configs.clip").get_config()
  config.optim.grad_clip_norm = 1.0
  mu = _adam_first_moment(config.optim, 1e6)
  # Global norm of 6 entries of 1e6 is 1e6 sqrt(6): clipped entries 1/sqrt(6).
  np.testing.assert_allclose(mu, (1 - config.optim.b1) / np.sqrt(6.0), rtol=1e-6)


def test_cosine_per_epoch_is_constant_within_each_epoch():
  """MoCo's `--cos`: lr (1 + cos(pi e / E)) / 2 for every step of epoch e."""
  optim = ml_collections.ConfigDict(
    dict(lr=0.15, schedule="cosine_per_epoch", steps_per_epoch=10, warmup_steps=0)
  )
  schedule = optimizer.learning_rate_schedule(optim, 30)  # E = 3 epochs
  # Hand values: cos(pi / 3) = 1/2 and cos(2 pi / 3) = -1/2.
  expected = {0: 0.15, 9: 0.15, 10: 0.15 * 0.75, 19: 0.15 * 0.75, 20: 0.15 * 0.25, 29: 0.15 * 0.25}
  for step, lr in expected.items():
    np.testing.assert_allclose(float(schedule(step)), lr, rtol=1e-6)  # float32 cos
  # A run that stops inside an epoch counts the started one: 25 steps are E = 3.
  partial = optimizer.learning_rate_schedule(optim, 25)
  np.testing.assert_allclose(float(partial(24)), 0.15 * 0.25, rtol=1e-6)
  optim.steps_per_epoch = 0
  with pytest.raises(errors.ConfigError, match="steps_per_epoch"):
    optimizer.learning_rate_schedule(optim, 30)


def test_sgd_follows_torch_sgd_in_float64():
  """PyTorch's SGD (HCL's released optimizer): m <- mu m + g + wd p, p <- p - lr m,
  the first m being g + wd p, gains and biases decayed too; two steps across
  an epoch boundary of the per-epoch cosine."""
  optim = ml_collections.ConfigDict(
    dict(
      name="sgd",
      lr=0.15,
      momentum=0.9,
      weight_decay=1e-4,
      schedule="cosine_per_epoch",
      steps_per_epoch=1,
      warmup_steps=0,
      decay_gains_biases=True,
    )
  )
  rng = np.random.default_rng(0)
  p0 = {"w": rng.normal(size=(3, 2)), "bias": rng.normal(size=(2,)), "log_scale": np.array(0.5)}
  grads = [jax.tree.map(lambda x: rng.normal(size=np.shape(x)), p0) for _ in range(2)]
  lrs = [0.15, 0.15 * 0.5]  # epochs 0 and 1 of E = 2: cos(0) = 1, cos(pi / 2) = 0
  expected, momentum = dict(p0), {}
  for step in range(2):
    for key in p0:
      decay = 0.0 if key == "log_scale" else 1e-4  # learned scalars never decay
      g = grads[step][key] + decay * expected[key]
      momentum[key] = g if step == 0 else 0.9 * momentum[key] + g
      expected[key] = expected[key] - lrs[step] * momentum[key]
  with jax.enable_x64(True):
    params = jax.tree.map(jnp.asarray, p0)
    tx, _ = optimizer.make_optimizer(optim, 2, params, lambda path: True)
    state = tx.init(params)
    for step in range(2):
      updates, state = tx.update(jax.tree.map(jnp.asarray, grads[step]), state, params)
      params = optax.apply_updates(params, updates)
    for key in p0:
      np.testing.assert_allclose(np.asarray(params[key]), expected[key], rtol=1e-12, atol=1e-15)


def test_unknown_optimizer_and_empty_run_fail_naming_the_key():
  config = importlib.import_module("configs.clip").get_config()
  params = {"w": jnp.zeros((2, 2))}
  config.optim.unlock()
  config.optim.name = "lamb"
  with pytest.raises(errors.ConfigError, match="optim.name"):
    optimizer.make_optimizer(config.optim, 10, params, lambda path: True)
  config.optim.name = "adamw"
  with pytest.raises(errors.ConfigError, match="total_steps=0"):
    optimizer.make_optimizer(config.optim, 0, params, lambda path: True)


def test_atmg_decays_gains_and_biases_as_released():
  """ATMG's released optimiser (MERU's `gain_bias_decay or weight_decay`)
  decays every parameter but the learned scalars; the option spares gains and
  biases."""
  config = importlib.import_module("configs.atmg").get_config()
  assert config.optim.decay_gains_biases is True
  _, params = tiny_model(geometry="lorentz")
  flat = {
    optimizer.path_str(p): v
    for p, v in jax.tree_util.tree_flatten_with_path(
      optimizer.weight_decay_mask(params, config.optim.decay_gains_biases)
    )[0]
  }
  scalars = {k for k in flat if k.split("/")[-1].startswith("log_")}
  assert scalars >= {"log_curv", "log_logit_scale"}
  assert all(flat[k] is False for k in scalars)
  assert all(flat[k] is True for k in flat if k not in scalars)
  biases = [k for k in flat if k.endswith(("bias", "scale")) and k not in scalars]
  assert biases  # the tiny model has gains and biases, and they decay
  paper = optimizer.weight_decay_mask(params, decay_gains_biases=False)
  flat_paper = {optimizer.path_str(p): v for p, v in jax.tree_util.tree_flatten_with_path(paper)[0]}
  assert not any(flat_paper[k] for k in biases)


def test_bfloat16_first_moment_matches_adamw_reference():
  """optim.mu_dtype="bfloat16": AdamW keeps its first moment in bfloat16.
  Float64 reference of two AdamW steps in which only the stored moment is
  rounded to bfloat16, as optax does: each step's moment is formed from the
  stored one (its decay computed in bfloat16) and the float32 gradient,
  used for the update, and stored rounded. Params of ~1e-2 move by
  ~lr = 1e-2 a step; float32 arithmetic (~10 operations on O(1) ratios,
  params rounded at ~1e-9) keeps them within 1e-5 of the moves' scale of
  the reference, while the same reference without the rounding is ~1e-3 of
  it away (bfloat16 keeps 8 bits of step 1's moment, which makes up half of
  step 2's), so the bound tells the two apart."""
  import ml_dtypes

  config = importlib.import_module("configs.meru").get_config()
  config.optim.mu_dtype = "bfloat16"
  config.optim.schedule = "constant"
  config.optim.lr = 1e-2
  optim = config.optim
  rng = np.random.default_rng(0)
  params = {"w": jnp.asarray(1e-2 * rng.normal(size=(4, 8)), jnp.float32)}
  grads = [jnp.asarray(rng.normal(size=(4, 8)), jnp.float32) for _ in range(2)]
  tx, _ = optimizer.make_optimizer(optim, 10, params, lambda path: True)
  state = tx.init(params)
  adam = [s for s in jax.tree.leaves(state, is_leaf=_is_adam_state) if _is_adam_state(s)][0]
  assert adam.mu["w"].dtype == jnp.bfloat16 and adam.nu["w"].dtype == jnp.float32
  assert adam.mu["w"].nbytes * 2 == adam.nu["w"].nbytes
  p = params
  for g in grads:
    updates, state = tx.update({"w": g}, state, p)
    p = optax.apply_updates(p, updates)

  bf16 = lambda x: x.astype(np.float32).astype(ml_dtypes.bfloat16).astype(np.float64)

  def reference(round_moment: bool) -> np.ndarray:
    w = np.asarray(params["w"], np.float64)
    m = v = np.zeros_like(w)
    for t, g in enumerate(grads, start=1):
      g = np.asarray(g, np.float64)
      # The stored moment's decay b1 m is a bfloat16 product (a Python float
      # times a bfloat16 array: b1 itself is rounded, 0.9 -> 0.8984375),
      # added to the float32 (1 - b1) g.
      decayed = bf16(bf16(np.float64(optim.b1)) * m) if round_moment else optim.b1 * m
      m = decayed + (1 - optim.b1) * g
      v = optim.b2 * v + (1 - optim.b2) * g * g
      m_hat, v_hat = m / (1 - optim.b1**t), v / (1 - optim.b2**t)
      w = w - optim.lr * (m_hat / (np.sqrt(v_hat) + optim.eps) + optim.weight_decay * w)
      if round_moment:
        m = bf16(m)
    return w

  result = np.asarray(p["w"], np.float64)
  scale = float(np.max(np.abs(reference(True) - np.asarray(params["w"], np.float64))))
  assert scale > 1e-3  # the params moved
  print(
    "bf16 moment vs reference:",
    float(np.max(np.abs(result - reference(True)))) / scale,
    float(np.max(np.abs(result - reference(False)))) / scale,
  )
  assert float(np.max(np.abs(result - reference(True)))) <= 1e-5 * scale
  assert float(np.max(np.abs(result - reference(False)))) > 1e-4 * scale


def _is_adam_state(x) -> bool:
  return isinstance(x, optax.ScaleByAdamState)


def test_momentum_dtype_of_sgd_and_bad_mu_dtype():
  config = importlib.import_module("configs.hcl").get_config()
  config.optim.name = "sgd"
  config.optim.mu_dtype = "bfloat16"
  params = {"w": jnp.zeros((3, 2), jnp.float32)}
  tx, _ = optimizer.make_optimizer(config.optim, 10, params, lambda path: True)
  traces = [s for s in jax.tree.leaves(tx.init(params), is_leaf=_is_trace) if _is_trace(s)]
  assert [t.trace["w"].dtype for t in traces] == [jnp.bfloat16]
  config.optim.mu_dtype = "float16"
  with pytest.raises(errors.ConfigError, match=r"^optim\.mu_dtype='float16'; valid: "):
    optimizer.make_optimizer(config.optim, 10, params, lambda path: True)


def _is_trace(x) -> bool:
  return isinstance(x, optax.TraceState)
