"""HCL ball clipping as released: exp map, then projection to (1 - 1e-3) r."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import hcl as hcl_config
from hyperbolic_vl.objectives import hcl as hcl_lib


def reference_to_ball(v, radius, mode, eps=1e-5):
  """float64 NumPy: z = tanh(|v| / r) r v / |v| (exp_0, c = 1/r^2) with either clip."""
  out = []
  for x in v:
    norm = np.linalg.norm(x)
    if mode == "tangent" and norm > radius - eps:
      x, norm = x * (radius - eps) / norm, radius - eps
    z = np.tanh(norm / radius) * radius * x / norm
    if mode == "point" and np.linalg.norm(z) > (1 - 1e-3) * radius:
      z = z / np.linalg.norm(z) * (1 - 1e-3) * radius
    out.append(z)
  return np.stack(out)


@pytest.mark.parametrize("mode", ["point", "tangent"])
def test_to_ball_matches_float64_reference(mode):
  rng = np.random.default_rng(0)
  direction = rng.normal(size=(6, 5))
  direction /= np.linalg.norm(direction, axis=-1, keepdims=True)
  # Tangent norms from deep inside to far beyond the clip points (r = 4.5).
  v = direction * np.array([0.3, 2.0, 4.4, 9.0, 20.0, 200.0])[:, None]
  with jax.enable_x64(True):
    z = np.asarray(hcl_lib.to_ball(jnp.asarray(v), 4.5, 1e-5, False, 1.0, clip=mode))
  np.testing.assert_allclose(z, reference_to_ball(v, 4.5, mode), rtol=1e-12, atol=1e-12)
  norms = np.linalg.norm(z, axis=-1) / 4.5
  if mode == "point":
    assert norms.max() == pytest.approx(1 - 1e-3, abs=1e-12)  # can reach the boundary
  else:
    assert norms.max() < 0.77  # tanh(1) caps the tangent-clipped points


def test_default_config_uses_the_released_clip():
  assert hcl_config.get_config().objective.ball_clip == "point"
  with pytest.raises(ValueError, match="ball_clip"):
    hcl_lib.to_ball(jnp.ones((1, 2)), 4.5, 1e-5, False, clip="sphere")
