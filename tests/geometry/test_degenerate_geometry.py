"""The exponential map's cap and the flat limit are visible: the cap is
recognised from a mapped point alone, counted by MERU's clamped_fraction and
exp_map_capped_fraction, and the first step's metrics of a degenerate run
produce a start-up warning (geometry_health)."""

import math

import jax
import jax.numpy as jnp
import numpy as np

from hyperbolic_vl.geometry import lorentz
from hyperbolic_vl.objectives import meru
from hyperbolic_vl.training import geometry_health

CAP = lorentz.EXP_MAP_MAX_RADIUS  # asinh(2^15) = 11.0904


def test_a_point_mapped_past_the_cap_is_recognised_and_one_below_is_not():
  curv = 4.0
  direction = np.array([[0.6, 0.8, 0.0]], np.float32)
  # Tangent radii sqrt(c)|v|: 20 and CAP + 1 are capped; CAP - 0.01 (1%
  # below in sinh: sinh(CAP - 0.01) = 2^15 e^-0.01 approximately) is not.
  radii = np.array([20.0, CAP + 1, CAP - 0.01, 1.0], np.float32)
  v = direction * (radii / math.sqrt(curv))[:, None]
  with jax.default_device(jax.devices("cpu")[0]):
    x = lorentz.exp_map0(jnp.asarray(v), curv)
    capped = np.asarray(lorentz.exp_map_capped(x, curv))
  assert capped.tolist() == [True, True, False, False]
  # At the cap |x| = 2^15 / sqrt(c) whatever the radius beyond it.
  np.testing.assert_allclose(np.linalg.norm(np.asarray(x[:2]), axis=-1), 2**15 / 2, rtol=1e-6)


def test_clamped_fraction_counts_every_pair_that_touches_a_capped_point():
  curv = jnp.asarray(1.0)
  rng = np.random.default_rng(0)
  tangents = rng.normal(size=(4, 8)).astype(np.float32)
  tangents /= np.linalg.norm(tangents, axis=-1, keepdims=True)
  radii = np.array([1.0, 2.0, 30.0, 0.5], np.float32)  # image 2 is capped
  image = lorentz.exp_map0(jnp.asarray(tangents * radii[:, None]), curv)
  text = lorentz.exp_map0(jnp.asarray(rng.normal(size=(5, 8)).astype(np.float32) * 0.3), curv)
  # Row 2 (5 of the 20 pairs) touches the cap; no other pair is guarded.
  assert float(meru.clamped_fraction(image, text, curv)) == 5 / 20
  assert float(meru.capped_fraction(image, text, curv)) == np.float32(1 / 9)  # a float32 mean


def metrics(curv, distance, capped=0.0):
  return {
    "train/curv": curv,
    "train/mean_dist_origin/image": distance,
    "train/mean_dist_origin/text": distance,
    "train/exp_map_capped_fraction": capped,
  }


def test_the_first_step_warns_at_the_cap_and_in_the_flat_limit_only():
  # curv_init = 1e3, measured on the tiny MERU config: every embedding at
  # the cap, distance asinh(2^15) / sqrt(1000) = 0.3507.
  (cap_warning,) = geometry_health.first_step_warnings(metrics(1000.0, CAP / 1000**0.5, 1.0))
  assert cap_warning.startswith("100% of the first batch's embeddings sit at the exponential")
  assert "model.curv_init" in cap_warning
  # curv_init = 1e-6: radius sqrt(1e-6) x 0.998 = 1.0e-3 < 1e-2.
  (flat_warning,) = geometry_health.first_step_warnings(metrics(1e-6, 0.998))
  assert "curvature-scaled radius 0.001 from the origin (< 0.01)" in flat_warning
  # The defaults (curv 1, distance ~1) and non-hyperbolic runs say nothing.
  assert geometry_health.first_step_warnings(metrics(1.0, 0.998)) == []
  assert geometry_health.first_step_warnings({"train/loss": 3.0}) == []


def test_a_run_with_curv_init_1e3_warns_at_its_first_step(tmp_path, capsys):
  from tiny_runs import small_config

  from hyperbolic_vl.training import loop

  config = small_config(**{"model.curv_init": 1e3})
  loop.train(config, str(tmp_path), stop_at_step=1)
  stderr = capsys.readouterr().err
  assert "warning: 100% of the first batch's embeddings sit at the exponential map's cap" in stderr
