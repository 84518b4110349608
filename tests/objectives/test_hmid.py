"""HMID-Net: float64 reference, 1 == 8 devices (masks included), masking,
unmasked tuning, frozen teacher (no gradient, no optimizer state)."""

import shutil

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from tiny_fixtures import (
  IMAGE,
  MESH_LAYOUTS,
  assert_one_device_equals_n_devices_float64,
  np_ce,
  np_dist,
  np_time,
  tiny_two_towers,
)
from tiny_fixtures import random_batch as _random_batch

from configs import hmid as hmid_config
from configs import meru as meru_config
from hyperbolic_vl.models import registry as models_registry
from hyperbolic_vl.objectives import base as objectives_base
from hyperbolic_vl.objectives import hmid as hmid_lib
from hyperbolic_vl.runs import loading
from hyperbolic_vl.training import loop


def tiny_def(seed, geometry="lorentz", image_variant="mu/8", dtype="float32"):
  return tiny_two_towers(seed, geometry, image_variant, dtype=dtype)


def random_batch(batch_size, seed=0):
  return _random_batch(batch_size, seed, index_offset=100)


def make_objective(teacher_geometry="lorentz", dtype="float32", **overrides):
  config = {
    "name": "hmid",
    "mask_ratio": 0.5,
    "distill_weight": 1.0,
    "entail_weight": 0.2,
    **overrides,
  }
  objective = hmid_lib.HmidObjective(config)
  teacher_def, teacher_params = tiny_def(7, teacher_geometry, image_variant="mu/4", dtype=dtype)
  context = objectives_base.RunContext(teacher=objectives_base.Teacher(teacher_def, teacher_params))
  aux = {"teacher_params": teacher_params}
  if objective.settings.unmasked_tuning_steps > 0:
    aux["step"] = jnp.asarray(0, jnp.int32)
  return objective, aux, context


# --- float64 reference (eq. 7-14) ---------------------------------------------
def np_expmap0(v, c):
  r = np.sqrt(c) * np.linalg.norm(v, axis=-1, keepdims=True)
  return np.sinh(r) * v / r


def np_ext(x, y, c):
  inner = c * np.sum(x * y, -1) - c * np_time(x, c) * np_time(y, c)
  num = np_time(y, c) + np_time(x, c) * inner
  return np.arccos(np.clip(num / (np.linalg.norm(x, axis=-1) * np.sqrt(inner**2 - 1)), -1, 1))


def np_hmid_loss(image, text, t_image_tan, t_text_tan, c, s, wd, we):
  t_image, t_text = np_expmap0(t_image_tan, c), np_expmap0(t_text_tan, c)
  hcl = 0.5 * (np_ce(-s * np_dist(image, text, c)) + np_ce(-s * np_dist(text, image, c)))
  dl = 0.5 * (np_ce(-s * np_dist(image, t_text, c)) + np_ce(-s * np_dist(text, t_image, c)))
  aper = np.arcsin(np.minimum(2 * 0.1 / (np.sqrt(c) * np.linalg.norm(text, axis=-1)), 1))
  el = np.maximum(np_ext(text, image, c) - aper, 0).mean()
  return hcl + wd * dl + we * el, dl


@pytest.mark.parametrize("teacher_geometry", ["lorentz", "euclidean"])
def test_hmid_loss_matches_float64_reference(teacher_geometry):
  student_def, params = tiny_def(0)
  params["log_alpha_img"] = jnp.asarray(np.log(0.6), jnp.float32)
  objective, aux, context = make_objective(teacher_geometry, clip_teacher_radius=0.7)
  batch = random_batch(8)
  rng = jax.random.key(3)

  # One compiled program for the loss and the embeddings the reference
  # reads (op by op, the same work compiled ~350 executables).
  @jax.jit
  def loss_and_embeddings(params, aux, batch, rng):
    model = student_def.merge(params)
    teacher = context.teacher.model_def.merge(aux["teacher_params"])
    keep = hmid_lib.example_keep_indices(rng, batch["index"], model.image_tower.num_patches, 0.5)
    loss, (metrics, _) = objective.loss(model, aux, batch, rng=rng, axis_name=None, context=context)
    embeddings = (
      model.encode_image(batch["image"], keep_indices=keep),
      model.encode_text(batch["tokens"]),
      teacher.image_tangent(batch["image"]),
      teacher.text_tangent(batch["tokens"]),
    )
    return loss, metrics, keep, embeddings, model.curv(), model.logit_scale()

  loss, metrics, keep, embeddings, curv, scale = loss_and_embeddings(params, aux, batch, rng)
  assert keep.shape == (8, 2)  # 4 patches at 16 px / 8, half kept
  image, text, t_img, t_txt = (np.asarray(e, np.float64) for e in embeddings)
  if teacher_geometry == "euclidean":
    t_img = 0.7 * t_img / np.linalg.norm(t_img, axis=-1, keepdims=True)
    t_txt = 0.7 * t_txt / np.linalg.norm(t_txt, axis=-1, keepdims=True)
  expected, dl = np_hmid_loss(image, text, t_img, t_txt, float(curv), float(scale), 1.0, 0.2)
  np.testing.assert_allclose(float(metrics["loss/distillation"]), dl, rtol=1e-5)
  np.testing.assert_allclose(float(loss), expected, rtol=1e-5)


def test_masks_are_per_example_per_step_and_device_independent():
  index = jnp.arange(16)
  a = hmid_lib.example_keep_indices(jax.random.key(0), index, 16, 0.5)
  b = hmid_lib.example_keep_indices(jax.random.key(1), index, 16, 0.5)
  assert a.shape == (16, 8)
  assert len({tuple(r) for r in np.asarray(a)}) > 8  # differ across examples
  assert not np.array_equal(np.asarray(a), np.asarray(b))  # and across steps
  # A row depends only on (step rng, global index): any split of the batch agrees.
  np.testing.assert_array_equal(
    np.asarray(hmid_lib.example_keep_indices(jax.random.key(0), index[8:], 16, 0.5)),
    np.asarray(a[8:]),
  )


# A Euclidean teacher repeats the lifted-teacher path of a Lorentz one: slow tier.
@pytest.mark.parametrize(
  "teacher_geometry", ["lorentz", pytest.param("euclidean", marks=pytest.mark.slow)]
)
@pytest.mark.parametrize("fsdp", MESH_LAYOUTS)
def test_one_device_equals_eight_devices(teacher_geometry, fsdp):
  """Masks are drawn from the global example index, so they agree too."""
  metrics = {}

  def build():
    student_def, params = tiny_def(0, dtype="float64")
    params["log_alpha_img"] = jnp.asarray(np.log(0.6))
    objective, aux, context = make_objective(teacher_geometry, dtype="float64")
    return student_def, params, objective, random_batch(16), aux, context

  assert_one_device_equals_n_devices_float64(
    build, rng_seed=5, label=f"hmid/{teacher_geometry}", fsdp=fsdp, metrics=metrics
  )
  assert float(metrics["loss/distillation"]) > 0


def test_unmasked_tuning_switches_to_full_images():
  student_def, params = tiny_def(0)
  batch = random_batch(8)
  rng = jax.random.key(0)

  def jitted_loss(**overrides):
    # Each objective's loss as one program (op by op: ~350 executables).
    objective, aux, context = make_objective(**overrides)
    loss = jax.jit(
      lambda params, aux: objective.loss(
        student_def.merge(params), aux, batch, rng=rng, axis_name=None, context=context
      )
    )
    return loss, aux

  tuned, aux = jitted_loss(unmasked_tuning_steps=2, total_steps=5)
  loss_early, (m_early, aux_after) = tuned(params, aux)
  assert int(aux_after["step"]) == 1 and float(m_early["masked"]) == 1.0
  masked, masked_aux = jitted_loss()
  np.testing.assert_allclose(float(loss_early), float(masked(params, masked_aux)[0]), rtol=1e-6)
  loss_late, (m_late, _) = tuned(params, dict(aux, step=jnp.asarray(3, jnp.int32)))
  assert float(m_late["masked"]) == 0.0
  unmasked, unmasked_aux = jitted_loss(mask_ratio=0.0)
  np.testing.assert_allclose(float(loss_late), float(unmasked(params, unmasked_aux)[0]), rtol=1e-6)


def _tiny_config(module, **objective):
  config = module.get_config()
  config.input.image_size = IMAGE
  config.input.batch_size = 16
  config.total_steps = 2
  config.log_training_steps = 1
  config.optim.warmup_steps = 1
  config.model.embed_dim = 16
  for key, value in objective.items():
    setattr(config.objective, key, value)
  return config


@pytest.mark.slow  # a teacher run and a student run; the teacher restore path runs in the push tier in tests/interop/test_interop_training.py
def test_teacher_frozen_and_without_optimizer_state(tmp_path):
  teacher_dir = str(tmp_path / "teacher")
  loop.train(_tiny_config(meru_config), teacher_dir)
  _, _, teacher_params, _ = loading.restore_run_params(teacher_dir)
  config = _tiny_config(hmid_config, teacher_workdir=teacher_dir)
  config.total_steps = 3
  result = loop.train(config, str(tmp_path / "student"))
  state = result.state
  after = jax.device_get(state["aux"]["teacher_params"])
  same = jax.tree.map(
    lambda a, b: bool(np.array_equal(np.asarray(a), np.asarray(b))),
    after,
    jax.device_get(teacher_params),
  )
  assert all(jax.tree.leaves(same))
  # The optimizer sees the student only: AdamW's mu/nu mirror the student params.
  student_leaves = len(jax.tree.leaves(state["params"]))
  teacher_leaves = len(jax.tree.leaves(after))
  adam = [
    s
    for s in jax.tree.leaves(
      state["opt_state"], is_leaf=lambda x: isinstance(x, optax.ScaleByAdamState)
    )
    if isinstance(s, optax.ScaleByAdamState)
  ]
  assert len(adam) == 1
  assert len(jax.tree.leaves(adam[0].mu)) == student_leaves
  assert len(jax.tree.leaves(state["opt_state"])) < 2 * student_leaves + teacher_leaves
  # The student did train.
  assert int(state["step"]) == 3
  # Resuming never reads the teacher's workdir again: with it deleted, an
  # interrupted run resumes from its own checkpoint (teacher params in aux,
  # architecture from the kept teacher_config.json) and ends where the
  # uninterrupted one did, bitwise (same machine, same programs).
  config.total_steps = 3
  interrupted = str(tmp_path / "interrupted")
  assert loop.train(config, interrupted, stop_at_step=2).step == 2
  shutil.rmtree(teacher_dir)
  resumed = loop.train(config, interrupted)
  assert resumed.step == 3
  jax.tree.map(
    np.testing.assert_array_equal,
    jax.device_get(state["params"]),
    jax.device_get(resumed.state["params"]),
  )


def test_hmid_vit_b_builds_abstractly_and_links_total_steps():
  config = hmid_config.get_config("vit_b")
  assert config.objective.total_steps == config.total_steps == 560_000
  assert config.optim.warmup_steps == 56_000 and config.input.batch_size == 256
  config.total_steps = 1000
  assert config.objective.total_steps == 1000
  model = models_registry.abstract_model(config)
  params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
  assert all(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree.leaves(params))


def test_masking_halves_image_tower_flops():
  from hyperbolic_vl.models import vit
  from hyperbolic_vl.tools import flops

  student_def, params = tiny_def(0, image_variant="mu/4")  # 16 patches
  config = hmid_config.get_config()
  config.input.image_size = IMAGE
  full = flops.image_tower_forward_flops(student_def, params, config, 4)
  keep = vit.random_keep_indices(jax.random.key(0), 4, 16, 0.5)
  half = flops.image_tower_forward_flops(student_def, params, config, 4, keep)
  assert 0.4 < half / full < 0.65
