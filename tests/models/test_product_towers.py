"""The two-tower model with K Lorentz factors (`model.factor_dim`, PHyCLIP):
per-factor scalars, their init and clamps, and the per-factor lift."""

import jax
import jax.numpy as jnp
import numpy as np
import phyclip_reference as ref
import pytest
from tiny_fixtures import random_batch
from tiny_fixtures import tiny_two_towers as tiny_model

from hyperbolic_vl import errors
from hyperbolic_vl.models import two_towers


def test_scalars_are_per_factor_with_the_released_init():
  model_def, params = tiny_model(factor_dim=4)  # embed 16: K = 4
  module = model_def.merge(params)
  assert module.num_factors == 4
  for name in ("log_curv", "log_alpha_img", "log_alpha_txt"):
    assert params[name].shape == (4,), name
  np.testing.assert_allclose(params["log_curv"], 0.0)  # c_k = 1
  np.testing.assert_allclose(params["log_alpha_img"], np.log(4**-0.5), rtol=1e-6)  # d^-1/2
  assert module.curv().shape == (4,)
  # The default model is one space with scalar parameters, as before.
  _, plain = tiny_model()
  assert plain["log_curv"].shape == () and plain["log_alpha_txt"].shape == ()
  np.testing.assert_allclose(plain["log_alpha_img"], np.log(16**-0.5), rtol=1e-6)


def test_embeddings_lift_each_factor_with_its_own_alpha_and_curvature():
  with jax.enable_x64(True):
    model_def, params = tiny_model(factor_dim=4, dtype="float64")
    params["log_curv"] = jnp.log(jnp.asarray([0.3, 1.0, 2.5, 6.0]))
    params["log_alpha_img"] = jnp.log(jnp.asarray([0.2, 0.5, 0.9, 1.0]))
    images = random_batch(3)["image"].astype(np.float64)

    @jax.jit  # one program (eagerly, each of the towers' operations compiles alone)
    def lifted_and_features(params):
      module = model_def.merge(params)
      return module.encode_image(images), module.image_proj(module.image_tower(images))

    got, features = map(np.asarray, lifted_and_features(params))
  curvs = np.exp(np.asarray(params["log_curv"]))
  alphas = np.exp(np.asarray(params["log_alpha_img"]))
  tangent = ref.factors(features, 4) * alphas[None, :, None]
  # The release's exp map at eps 1e-8 (our lift's floor): equal to 1e-12.
  expected = ref.exp_map0(tangent, curvs, eps=1e-8).reshape(features.shape)
  np.testing.assert_allclose(got, expected, rtol=1e-12)


def test_clamps_apply_to_each_factor():
  model_def, params = tiny_model(factor_dim=4)
  params["log_curv"] = jnp.asarray([-5.0, 0.0, 1.0, 5.0])
  params["log_alpha_txt"] = jnp.asarray([-1.0, 0.5, -0.2, 2.0])
  clamped = two_towers.project_learned_scalars(params, model_def.merge(params))
  np.testing.assert_allclose(clamped["log_curv"], [np.log(0.1), 0.0, 1.0, np.log(10.0)], 1e-6)
  np.testing.assert_allclose(clamped["log_alpha_txt"], [-1.0, 0.0, -0.2, 0.0])


def test_fixed_curvature_is_a_vector_too():
  model_def, params = tiny_model(factor_dim=8, learn_curv=False, curv_init=2.0)
  curv = model_def.merge(params).curv()
  np.testing.assert_allclose(curv, [2.0, 2.0])


@pytest.mark.parametrize(
  ("kwargs", "message"),
  [
    (dict(factor_dim=5), r"model.factor_dim=5 must divide model.embed_dim=16"),
    (dict(factor_dim=4, geometry="euclidean"), r"model.geometry='euclidean' has none"),
  ],
)
def test_factor_dims_that_cannot_split_the_embedding_fail_in_one_line(kwargs, message):
  with pytest.raises(errors.ConfigError, match=message):
    tiny_model(**kwargs)
