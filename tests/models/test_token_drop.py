"""Image token dropping (model.image_token_drop, FLIP) for every objective:
1 device == 8 devices with dropping on (float64), the masks the loss uses
are exactly the documented ones (count and key), none at evaluation, and
the final unmasked phase."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from model_refs import abstract_model_def, built_model_def, fast_compile_jit
from tiny_fixtures import (
  as_float64,
  assert_one_device_equals_n_devices_float64,
  random_batch,
)
from tiny_fixtures import tiny_two_towers as tiny_model

from hyperbolic_vl import errors
from hyperbolic_vl.models import token_drop
from hyperbolic_vl.objectives import clip as clip_lib
from hyperbolic_vl.objectives import hmid as hmid_lib
from hyperbolic_vl.objectives import meru as meru_lib

DROP = 0.5
NUM_PATCHES = 4  # the tiny 16 px image, 8 px patches


def _meru():
  return meru_lib.MeruObjective({"name": "meru", "entail_weight": 0.2})


@pytest.fixture(scope="module")
def drop_model():
  """(ModelDef, params) of the float64 tiny MERU model with dropping, built
  once (one compile) for every test of this module."""
  with jax.enable_x64(True):
    return built_model_def(
      lambda: tiny_model(geometry="lorentz", dtype="float64", image_token_drop=DROP)
    )


@pytest.mark.parametrize(
  "geometry, objective",
  [
    pytest.param("lorentz", _meru(), id="meru"),
    # CLIP's dropping is MERU's image tower path again: slow tier.
    pytest.param(
      "euclidean", clip_lib.ClipObjective({"name": "clip"}), id="clip", marks=pytest.mark.slow
    ),
  ],
)
def test_one_device_equals_eight_devices_with_dropping(geometry, objective, request):
  """Each example's mask is keyed by its global index, so the 8-device
  step drops the same patches as the 1-device one."""

  def build():
    if geometry == "lorentz":
      model_def, params = request.getfixturevalue("drop_model")
    else:
      model_def, params = built_model_def(
        lambda: tiny_model(geometry=geometry, dtype="float64", image_token_drop=DROP)
      )
    return model_def, params, objective, random_batch(16), None

  grads = assert_one_device_equals_n_devices_float64(build, label=f"{objective.name} drop {DROP}")
  assert float(np.abs(grads["image_tower"]["patch_embed"]["kernel"]).max()) > 0


# Every loss is compiled (an eager pass compiles each of its operations), once
# per model and shapes, with the fast test-only options (tests/fixtures/model_refs.py).
def _loss_fn(objective, model_def):
  """(params, batch, rng, aux) -> (loss, new_aux): the objective's loss."""

  @fast_compile_jit
  def loss_of(params, batch, rng, aux):
    loss, (_, new_aux) = objective.loss(
      model_def.merge(params), aux, batch, rng=rng, axis_name=None
    )
    return loss, new_aux

  def call(params, batch, rng, aux=None):
    loss, new_aux = loss_of(params, batch, rng, aux or {})
    return float(loss), new_aux

  return call


def _meru_losses_with_keep(model_def):
  """(params, batch, keep) -> (MERU's loss with the image tower given `keep`
  explicitly, the same without dropping): one compile for both."""

  def loss_with(model, batch, keep):
    image = model.encode_image(batch["image"], keep_indices=keep)
    text = model.encode_text(batch["tokens"])
    contrastive, entail, _ = _meru().contrastive_and_entailment(model, image, text, None)
    return contrastive + 0.2 * entail

  @fast_compile_jit
  def losses(params, batch, keep):
    model = model_def.merge(params)
    return loss_with(model, batch, keep), loss_with(model, batch, None)

  return lambda params, batch, keep: tuple(map(float, losses(params, batch, keep)))


@pytest.fixture(scope="module")
def drop_model_losses(drop_model):
  return _meru_losses_with_keep(drop_model[0])


# One compile per shape (eagerly each op of the draw compiles on its own).
_example_keep_indices = jax.jit(token_drop.example_keep_indices, static_argnums=(2, 3, 4))


@jax.jit
def _first_call_keep(rng, index):
  first_call_key = jax.random.fold_in(jax.random.fold_in(rng, token_drop.SALT), 0)
  return token_drop.example_keep_indices(first_call_key, index, 6, NUM_PATCHES, DROP)


def test_the_loss_drops_exactly_the_documented_patches(drop_model, drop_model_losses):
  """The training loss equals MERU's loss on the keep indices the module
  docstring's key gives; each row keeps round(N (1 - r)) distinct patches."""
  with jax.enable_x64(True):
    model_def, params = drop_model
    batch = as_float64(random_batch(6, index_offset=40))
    rng = jax.random.key(3)
    loss, _ = _loss_fn(_meru(), model_def)(params, batch, rng)
    keep = _first_call_keep(rng, jnp.asarray(batch["index"]))
    expected, whole = drop_model_losses(params, batch, keep)
  np.testing.assert_allclose(loss, expected, rtol=1e-13)
  assert abs(loss - whole) > 1e-6  # dropping changed the loss
  keep = np.asarray(keep)
  assert keep.shape == (6, 2)
  for row in keep:
    assert len(set(row.tolist())) == 2 and row.min() >= 0 and row.max() < NUM_PATCHES
  # The kept count: round(N (1 - r)) for the paper configs' grids too.
  assert token_drop.kept_count(196, 0.5) == 98
  assert token_drop.kept_count(196, 0.75) == 49
  assert token_drop.kept_count(49, 0.75) == 12


def test_masks_follow_the_example_and_the_step():
  """Same index, same key: same mask wherever the row sits; another step
  (rng) or example: another mask (over many draws)."""
  key = jax.random.key(0)
  index = np.arange(64, dtype=np.int32)
  keep = np.asarray(_example_keep_indices(key, index, 64, 16, 0.5))
  shuffled = np.asarray(_example_keep_indices(key, index[::-1], 64, 16, 0.5))
  np.testing.assert_array_equal(keep, shuffled[::-1])
  other_step = np.asarray(_example_keep_indices(jax.random.fold_in(key, 1), index, 64, 16, 0.5))
  assert (keep != other_step).any(axis=1).mean() > 0.9
  assert len({tuple(row) for row in keep}) > 40


def test_no_dropping_at_evaluation(drop_model):
  """The same params give the same embeddings with and without the option
  outside a training step (evaluation, inference, export)."""
  # float32 models, built abstractly: the params are drop_model's, cast.
  model_def, _ = abstract_model_def(lambda: tiny_model(geometry="lorentz"))
  dropping_def, dropping_params = abstract_model_def(
    lambda: tiny_model(geometry="lorentz", image_token_drop=0.75)
  )
  params = jax.tree.map(lambda x: np.asarray(x, np.float32), drop_model[1])
  assert set(dropping_params) == set(params)  # no param added
  batch = random_batch(4)

  # Each model's forward pass and loss compiled whole (eagerly each of its
  # ops would compile), one program per model. rng=None (a loss called
  # outside training, as by unit tests) never drops.
  def embeddings_and_loss(model_def):
    @fast_compile_jit
    def run(params, batch):
      model = model_def.merge(params)
      loss, _ = _meru().loss(model, {}, batch, rng=None, axis_name=None)
      return model.encode_image(batch["image"]), loss

    return jax.device_get(run(params, batch))

  plain, plain_loss = embeddings_and_loss(model_def)
  dropping, dropping_loss = embeddings_and_loss(dropping_def)
  np.testing.assert_array_equal(dropping, plain)
  assert float(dropping_loss) == pytest.approx(float(plain_loss), rel=0, abs=0)


def test_final_unmasked_phase(drop_model, drop_model_losses):
  """image_token_drop_until_step=S: aux counts steps; before S the loss
  drops patches, from S on it sees whole images."""
  with jax.enable_x64(True):
    # drop_model's params in the model with the final phase (built abstractly).
    params = drop_model[1]
    model_def, _ = abstract_model_def(
      lambda: tiny_model(
        geometry="lorentz", dtype="float64", image_token_drop=DROP, image_token_drop_until_step=3
      )
    )
    objective = _meru()
    aux = objective.init_aux(model_def.module, params, jax.random.key(0))
    assert int(aux[token_drop.STEP_KEY]) == 0
    batch = as_float64(random_batch(6))
    rng = jax.random.key(5)
    # The whole-image loss (the keep-indices loss beside it is unused here;
    # sharing the compiled pair saves a compile).
    _, whole = drop_model_losses(params, batch, np.zeros((6, 2), np.int32))
    loss = _loss_fn(objective, model_def)
    dropped, new_aux = loss(params, batch, rng, aux)
    late_step = np.asarray(3, np.asarray(aux[token_drop.STEP_KEY]).dtype)
    late, late_aux = loss(params, batch, rng, {**aux, token_drop.STEP_KEY: late_step})
  assert int(new_aux[token_drop.STEP_KEY]) == 1
  assert int(late_aux[token_drop.STEP_KEY]) == 4
  assert abs(dropped - whole) > 1e-6
  np.testing.assert_allclose(late, whole, rtol=1e-13)


def test_bad_settings_are_config_errors():
  # Built abstractly: the check runs, no initialiser compiles.
  with pytest.raises(errors.ConfigError, match="image_token_drop"):
    jax.eval_shape(lambda: tiny_model(image_token_drop=1.0))
  with pytest.raises(errors.ConfigError, match="ResNet"):
    jax.eval_shape(lambda: tiny_model(image_variant="RN-mu", image_token_drop=0.5))
  objective = hmid_lib.HmidObjective({"name": "hmid", "allow_random_teacher": True})
  with pytest.raises(errors.ConfigError, match="masks its student"):
    objective.check_model_config({"geometry": "lorentz", "image_token_drop": 0.5})
