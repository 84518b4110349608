"""LoRA adapters: step 0 equals the base model, merge folds adapters into the
base kernels, and locking decides which params train."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from flax.nnx import traversals
from model_refs import build, module_jit

from configs import meru as meru_config
from hyperbolic_vl import errors
from hyperbolic_vl.models import locking, lora
from hyperbolic_vl.models import registry as models_registry

ALL_TARGETS = ("q", "k", "v", "out", "fc1", "fc2", "patch")


def _config(rank=0, targets=ALL_TARGETS, towers=("image", "text"), dtype="float64"):
  config = meru_config.get_config("tiny")
  config.input.image_size = 16
  config.model.dtype = dtype
  config.model.lora.rank = rank
  config.model.lora.alpha = 3.0
  config.model.lora.targets = targets
  config.model.lora.towers = towers
  return config


_BUILT = {}


def _model(config, seed=0):
  """A new module of the model, its initialisers run as one compile (eagerly
  each compiles) the first time this config is asked for; later calls
  share those arrays in a module of their own (tests change modules, not
  arrays)."""
  key = (str(config), seed)
  if key not in _BUILT:
    _BUILT[key] = nnx.split(
      build(
        lambda: models_registry.build_for_run(config, vocab_size=64, context_length=8, seed=seed)
      )
    )
  return nnx.merge(*_BUILT[key])


def _abstract_model(config):
  """The model's structure and shapes, nothing computed (for tests of names)."""
  return nnx.eval_shape(
    lambda: models_registry.build_for_run(config, vocab_size=64, context_length=8, seed=0)
  )


@module_jit
def _encode_image(model, images):
  """The image tower as one (fast) compiled computation per model graph."""
  return model.encode_image(images)


@module_jit
def _embed(model, images, tokens):
  """Both towers' embeddings as one compiled computation per model graph
  (eagerly every op of the forward pass would compile on its own)."""
  return model.encode_image(images), model.encode_text(tokens)


def _params(module) -> dict:
  return nnx.to_pure_dict(nnx.state(module, nnx.Param))


def _with_params(module, params):
  graphdef, state, rest = nnx.split(module, nnx.Param, ...)
  nnx.replace_by_pure_dict(state, params)
  return nnx.merge(graphdef, state, rest)


def _inputs():
  images = np.random.default_rng(1).uniform(size=(3, 16, 16, 3))  # float64
  tokens = jnp.array(
    [[5, 9, 63, 0, 0, 0, 0, 0], [7, 63, 0, 0, 0, 0, 0, 0], [1, 2, 3, 4, 5, 6, 7, 63]]
  )
  return images, tokens


def _base_params_into_adapted(base, adapted):
  """The adapted model with the base's params (adapters keep their init)."""
  mine = traversals.flatten_mapping(_params(adapted))
  theirs = traversals.flatten_mapping(_params(base))
  merged = {path: theirs.get(path, value) for path, value in mine.items()}
  assert set(theirs) <= set(merged)
  return _with_params(adapted, traversals.unflatten_mapping(merged))


def test_adapters_at_init_compute_exactly_the_base_model():
  with jax.enable_x64(True):
    base = _model(_config(rank=0))
    adapted = _base_params_into_adapted(base, _model(_config(rank=4)))
    images, tokens = _inputs()
    # B = 0 at init: each adapter adds an exact 0.0, so the outputs are
    # bitwise those of the base model (float64 towers).
    adapted_image, adapted_text = _embed(adapted, images, tokens)
    base_image, base_text = _embed(base, images, tokens)
    np.testing.assert_array_equal(adapted_image, base_image)
    np.testing.assert_array_equal(adapted_text, base_text)
    # Every target is adapted in both towers, and only the image tower
    # has a patch adapter.
    names = {
      str(path[-2])
      for path in traversals.flatten_mapping(_params(adapted))
      if lora.is_adapter_path(path)
    }
    assert names == {f"lora_{target}" for target in ALL_TARGETS}


def test_merged_adapters_compute_what_the_adapted_model_computes():
  with jax.enable_x64(True):
    config = _config(rank=4)
    adapted = _model(config)
    # Non-zero B everywhere, so every adapter changes the function (drawn in
    # NumPy: one jax.random draw per shape would compile per shape).
    flat = traversals.flatten_mapping(_params(adapted))
    draws = np.random.default_rng(7)
    for path in sorted(flat, key=str):
      if path[-1] == "up":
        flat[path] = jnp.asarray(0.3 * draws.standard_normal(flat[path].shape), jnp.float64)
    adapted = _with_params(adapted, traversals.unflatten_mapping(flat))
    merged_params = lora.merge_adapters(_params(adapted), config.model)
    assert not lora.has_adapters(merged_params)
    # The base model's own tree (its block lists keyed by int, as nnx has them);
    # `_with_params` gives new modules, so the one base build serves all three.
    base_module = _model(lora.without_lora_config(config))
    assert jax.tree.structure(merged_params) == jax.tree.structure(_params(base_module))
    base = _with_params(base_module, merged_params)
    images, tokens = _inputs()
    adapted_image, adapted_text = _embed(adapted, images, tokens)
    base_image, base_text = _embed(base, images, tokens)
    # The adapters moved the embeddings (the comparison is not trivial) ...
    unadapted = _with_params(base_module, _strip_adapters(_params(adapted)))
    unadapted_image, _ = _embed(unadapted, images, tokens)
    assert float(np.max(np.abs(unadapted_image - adapted_image))) > 1e-3
    # ... and merging is x (W + s A B) = x W + s (x A) B up to float64 rounding.
    np.testing.assert_allclose(base_image, adapted_image, rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(base_text, adapted_text, rtol=1e-12, atol=1e-13)


def _strip_adapters(params):
  flat = traversals.flatten_mapping(params)
  return traversals.unflatten_mapping(
    {p: v for p, v in flat.items() if not lora.is_adapter_path(p)}
  )


def _adapted_with_dropout():
  """Adapters with dropout 0.5 and B = 1, so every mask shows in the output."""
  config = _config(rank=4)
  config.model.lora.dropout = 0.5
  adapted = _model(config)
  flat = traversals.flatten_mapping(_params(adapted))
  flat = {p: (np.ones(v.shape, v.dtype) if p[-1] == "up" else v) for p, v in flat.items()}
  return _with_params(adapted, traversals.unflatten_mapping(flat))


def test_dropout_applies_only_in_training_mode():
  with jax.enable_x64(True):
    adapted = _adapted_with_dropout()
    images, _ = _inputs()
    evaluation = np.asarray(_encode_image(adapted, images))
    np.testing.assert_array_equal(_encode_image(adapted, images), evaluation)  # deterministic
    assert lora.has_dropout(adapted)
    lora.training_mode(adapted, jax.random.key(3))
    first = np.asarray(_encode_image(adapted, images))
    assert float(np.max(np.abs(first - evaluation))) > 1e-3
    np.testing.assert_array_equal(_encode_image(adapted, images), first)  # same key, same masks


def test_locks_name_the_params_that_stay():
  config = _config(rank=0, dtype="float32")
  params = _params(_abstract_model(config))
  config.model.lock_image = True
  config.model.lock_image_unlocked_blocks = 1
  config.model.lock_image_norms_trainable = True
  config.model.lock_text = True
  locks = locking.Locks.from_model_config(config.model, params)
  trainable = {
    "/".join(map(str, path))
    for path in traversals.flatten_mapping(params)
    if not locks.locked(tuple(map(str, path)))
  }
  depth = locks.depth["image"]
  last = depth - 1
  expected = {
    "log_logit_scale",
    "log_curv",
    "log_alpha_img",
    "log_alpha_txt",
    "image_proj/kernel",
    "image_tower/norm/scale",
    "image_tower/norm/bias",
  }
  for block in range(depth):
    expected |= {
      f"image_tower/encoder/blocks/{block}/{n}/{p}"
      for n in ("norm1", "norm2")
      for p in ("scale", "bias")
    }
  expected |= {
    "/".join(map(str, path))
    for path in traversals.flatten_mapping(params)
    if path[:4] == ("image_tower", "encoder", "blocks", last)
  }
  assert trainable == expected


def test_lora_locks_the_base_weights_of_adapted_towers_only():
  config = _config(rank=2, towers=("text",), dtype="float32")
  params = _params(_abstract_model(config))
  locks = locking.Locks.from_model_config(config.model, params)
  flat = ["/".join(map(str, p)) for p in traversals.flatten_mapping(params)]
  trainable = {name for name in flat if not locks.locked(tuple(name.split("/")))}
  assert {n for n in trainable if n.startswith("text_")} == {n for n in flat if "lora_" in n}
  assert {n for n in flat if n.startswith("image_")} <= trainable


@pytest.mark.parametrize(
  ("key", "value", "named"),
  [
    ("rank", -1, "model.lora.rank"),
    ("targets", ("q", "query"), "model.lora.targets"),
    ("towers", ("audio",), "model.lora.towers"),
    ("dropout", 1.0, "model.lora.dropout"),
  ],
)
def test_bad_lora_settings_are_named(key, value, named):
  config = _config(rank=2, dtype="float32")
  config.model.lora[key] = value
  with pytest.raises(errors.ConfigError, match=named):
    lora.LoraSettings.from_model_config(config.model)


def test_unlocked_blocks_without_a_lock_are_refused():
  config = _config(dtype="float32")
  config.model.lock_text_unlocked_blocks = 1
  with pytest.raises(errors.ConfigError, match="model.lock_text_unlocked_blocks"):
    locking.Locks.from_model_config(config.model, _params(_abstract_model(config)))


def test_dropout_masks_differ_between_micro_batches():
  from hyperbolic_vl.models import micro_batches

  with jax.enable_x64(True):
    adapted = _adapted_with_dropout()
    lora.training_mode(adapted, jax.random.key(3))
    micro_batches.set_micro_batches(adapted, 2)
    image, _ = _inputs()
    same = np.repeat(np.asarray(image[:1]), 4, axis=0)  # slices (0, 1) and (2, 3)
    out = np.asarray(_encode_image(adapted, same))
    # Row 2 is row 0's twin in the second slice: with the first slice's
    # masks repeated it would be equal.
    assert float(np.max(np.abs(out[0] - out[2]))) > 1e-3
