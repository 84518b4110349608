"""HCL: losses against float64 references, 1 vs 8 devices (queue too), data, evals, CLI."""

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from tiny_fixtures import assert_one_device_equals_n_devices_float64

from configs import hcl as hcl_config
from hyperbolic_vl import objectives as objectives_lib
from hyperbolic_vl import train
from hyperbolic_vl.data import coco_boxes
from hyperbolic_vl.evaluators import hcl_eval
from hyperbolic_vl.objectives import hcl as hcl_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
IMAGE, BATCH, QUEUE = 16, 16, 64


def tiny_config(dtype="float32", **objective):
  config = hcl_config.get_config()
  with config.unlocked():
    config.model.dtype = dtype
    config.input.image_size = IMAGE
    config.input.batch_size = BATCH
    config.objective.queue_size = QUEUE
    config.objective.update(objective)
  return config


def setup(dtype="float32", **objective):
  config = tiny_config(dtype, **objective)
  obj = objectives_lib.get(config.objective)
  tokenizer = type("NoText", (), {"vocab_size": 1, "context_length": 1})()
  model_def, params = train.build_model(config, obj, tokenizer, 0)
  aux = obj.init_aux(model_def.module, params, jax.random.key(1))
  # A momentum encoder different from the live one exercises the update.
  aux["momentum"] = jax.tree.map(lambda x: x * 0.9, aux["momentum"])
  it = obj.make_train_iterator(config, None)
  return config, obj, model_def, params, aux, next(it)


def np_poincare_dist(x, y, c):
  sq = np.sum((x[:, None] - y[None]) ** 2, -1)
  den = (1 - c * np.sum(x * x, -1))[:, None] * (1 - c * np.sum(y * y, -1))[None]
  return np.arccosh(1 + 2 * c * sq / den) / np.sqrt(c)


def np_ce(logits, targets):
  logits = logits - logits.max(1, keepdims=True)
  logp = logits - np.log(np.exp(logits).sum(1, keepdims=True))
  return -np.mean(logp[np.arange(len(targets)), targets])


def test_loss_matches_float64_reference():
  config, obj, model_def, params, aux, batch = setup()
  cfg = config.objective
  loss, (metrics, new_aux) = jax.jit(
    lambda p, a, b: obj.loss(model_def.merge(p), a, b, rng=None, axis_name=None)
  )(params, aux, batch)
  momentum = jax.tree.map(
    lambda m, t: cfg.momentum * m + (1 - cfg.momentum) * t, aux["momentum"], params
  )
  head = jax.jit(lambda p, x: model_def.merge(p)(x))
  g = lambda p, x: np.asarray(head(p, x), np.float64)
  unit = lambda v: v / np.linalg.norm(v, axis=-1, keepdims=True)
  q, k = unit(g(params, batch["view1"])), unit(g(momentum, batch["view2"]))
  queue = np.asarray(aux["queue"], np.float64)
  logits = np.concatenate([np.sum(q * k, -1, keepdims=True), q @ queue.T], 1) / cfg.temperature
  euc = np_ce(logits, np.zeros(BATCH, int))

  def ball(v):
    v = v * cfg.hyp_input_scale
    norm = np.linalg.norm(v, axis=-1, keepdims=True)
    v = v * np.minimum(1, (cfg.radius - cfg.eps) / norm)
    n = np.linalg.norm(v, axis=-1, keepdims=True) / cfg.radius
    return np.tanh(n) * v / n

  c = 1 / cfg.radius**2
  d = np_poincare_dist(ball(g(params, batch["scene"])), ball(g(momentum, batch["object"])), c)
  hyp = np_ce(-d / cfg.temperature, np.arange(BATCH))
  np.testing.assert_allclose(float(metrics["loss/euc"]), euc, rtol=2e-5)
  np.testing.assert_allclose(float(metrics["loss/hyp"]), hyp, rtol=2e-5)
  np.testing.assert_allclose(float(loss), euc + cfg.hyp_weight * hyp, rtol=2e-5)
  # The keys went into the queue at the pointer, which moved on.
  np.testing.assert_allclose(np.asarray(new_aux["queue"][:BATCH]), k, atol=1e-5)
  np.testing.assert_array_equal(np.asarray(new_aux["queue"][BATCH:]), queue[BATCH:])
  assert int(new_aux["queue_ptr"]) == BATCH


def test_one_device_equals_eight_devices_queue_included():
  """Loss, gradients, the enqueued keys, the queue pointer and the momentum
  encoder agree on 1 and 8 devices."""

  def build():
    _, obj, model_def, params, aux, batch = setup("float64")
    return model_def, params, obj, batch, aux

  assert_one_device_equals_n_devices_float64(build, label="hcl")


def test_riemannian_scaling_shrinks_gradients_near_the_boundary():
  v = jnp.array([[4.0, 0.0], [0.5, 0.0]])
  f = lambda v, s: jnp.sum(hcl_lib.to_ball(v, 4.5, 1e-5, s, 1.0))
  plain, scaled = jax.grad(f)(v, False), jax.grad(f)(v, True)
  z = np.asarray(hcl_lib.to_ball(v, 4.5, 1e-5, False))
  factor = (1 - np.sum(z * z, -1) / 4.5**2) ** 2 / 4
  np.testing.assert_allclose(scaled, plain * factor[:, None], rtol=1e-5)
  # Clipping: tangent norms above r - eps all land on the same radius.
  big = np.asarray(hcl_lib.to_ball(jnp.array([[100.0, 0.0]]), 4.5, 1e-5, False, clip="tangent"))
  np.testing.assert_allclose(np.linalg.norm(big), 4.5 * np.tanh((4.5 - 1e-5) / 4.5), rtol=1e-5)


def test_batches_scene_regions_contain_their_object():
  provider = coco_boxes.WorldBoxes(0, "train", 100)
  rendered = []  # every (box, size) the iterator asks for, in order

  class RecordingProvider:
    def __len__(self):
      return len(provider)

    def boxes(self, index):
      return provider.boxes(index)

    def render(self, index, box, size):
      rendered.append(np.asarray(box, np.float64))
      return provider.render(index, box, size)

  it = hcl_lib.HclIterator(RecordingProvider(), batch_size=8, image_size=IMAGE, seed=0)
  batch = next(it)
  assert set(batch) == {"view1", "view2", "scene", "object"}
  assert all(v.shape == (8, IMAGE, IMAGE, 3) for v in batch.values())
  # Per example: view1 window, view2 window, scene region, object box.
  assert len(rendered) == 4 * 8
  whole = 0
  for _window1, _window2, region, box in np.reshape(rendered, (8, 4, 4)):
    assert np.all(region[:2] <= box[:2] + 1e-12) and np.all(region[2:] >= box[2:] - 1e-12)
    whole += bool(np.allclose(region, [0, 0, 1, 1]))
  assert whole < 8  # some regions are unions of boxes, not the whole image
  # The position is the iterator state: a restored iterator replays the stream.
  state = it.get_state()
  expected = next(it)
  again = hcl_lib.HclIterator(provider, batch_size=8, image_size=IMAGE, seed=0)
  again.set_state(state)
  np.testing.assert_array_equal(next(again)["scene"], expected["scene"])


def test_coco_boxes_drop_tiny_and_crowd(tmp_path):
  from PIL import Image

  Image.new("RGB", (200, 100), (10, 20, 30)).save(tmp_path / "a.jpg")
  Image.new("RGB", (200, 100)).save(tmp_path / "b.jpg")
  (tmp_path / "ann.json").write_text(
    json.dumps(
      {
        "images": [
          {"id": 1, "file_name": "a.jpg", "width": 200, "height": 100},
          {"id": 2, "file_name": "b.jpg", "width": 200, "height": 100},
        ],
        "categories": [{"id": 5}, {"id": 9}],
        "annotations": [
          {"image_id": 1, "bbox": [0, 0, 100, 80], "category_id": 9, "iscrowd": 0},
          {"image_id": 1, "bbox": [0, 0, 50, 50], "category_id": 5, "iscrowd": 0},  # tiny
          {"image_id": 1, "bbox": [10, 10, 150, 80], "category_id": 5, "iscrowd": 1},  # crowd
          {"image_id": 2, "bbox": [0, 0, 20, 20], "category_id": 5, "iscrowd": 0},
        ],
      }
    )
  )
  boxes = coco_boxes.CocoBoxes(tmp_path / "ann.json", tmp_path)
  assert len(boxes) == 1 and boxes.skipped_images == 1
  np.testing.assert_allclose(boxes.boxes(0), [[0, 0, 0.5, 0.8]])
  assert boxes.labels(0).tolist() == [1]
  assert boxes.render(0, boxes.boxes(0)[0], 8).shape == (8, 8, 3)


def test_ndcg_and_linear_probe():
  assert hcl_eval.ndcg(np.array([3.0, 2, 1]), np.array([3, 2, 1])) == pytest.approx(1.0)
  assert hcl_eval.ndcg(np.array([1.0, 2, 3]), np.array([3, 2, 1])) < 1.0
  rng = np.random.default_rng(0)
  x = rng.normal(size=(200, 5))
  y = (x[:, 0] > 0).astype(int)
  assert hcl_eval.linear_probe(x[:100], y[:100], x[100:], y[100:], 2, steps=100) > 0.9


def test_vit_s_variant_builds_abstractly():
  model = train.abstract_model(hcl_config.get_config("vit_s"))
  assert model.image_tower.width == 384 and model.head_out.kernel.shape == (2048, 128)


def test_tiny_variant_trains_from_the_command_line(tmp_path):
  env = dict(os.environ, XLA_FLAGS="", JAX_PLATFORMS="cpu")
  run = subprocess.run(
    [
      sys.executable,
      "-m",
      "hyperbolic_vl.main",
      "--config=configs/hcl.py",
      f"--workdir={tmp_path / 'hcl'}",
      "--config.total_steps=2",
      f"--config.input.batch_size={BATCH}",
      f"--config.input.image_size={IMAGE}",
      f"--config.objective.queue_size={QUEUE}",
      "--config.log_training_steps=1",
      "--config.optim.warmup_steps=1",
      "--config.evals.hcl_world.num_examples=24",
    ],
    cwd=ROOT,
    env=env,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert run.returncode == 0, run.stderr[-3000:]
  assert "eval/linear_probe_accuracy" in run.stdout and "eval/ndcg_norm_vs_objects" in run.stdout
