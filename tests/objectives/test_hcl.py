"""HCL: losses against float64 references, 1 vs 8 devices (queue too), data, evals, CLI.

As released: HCL ball clipping as released: exp map, then projection to (1 - 1e-3) r."""

import json
import os
import subprocess
import sys

import cheap_codegen
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from paths import REPO
from tiny_fixtures import MESH_LAYOUTS, assert_one_device_equals_n_devices_float64

from configs import hcl as hcl_config
from hyperbolic_vl import objectives as objectives_lib
from hyperbolic_vl import predictor as predictor_lib
from hyperbolic_vl.data import registry as data_registry
from hyperbolic_vl.data import scene_objects
from hyperbolic_vl.data.readers import object_boxes as coco_boxes
from hyperbolic_vl.evaluators import registry as evaluator_registry
from hyperbolic_vl.evaluators.metrics import linear_probe_adam, ranking
from hyperbolic_vl.models import registry as models_registry
from hyperbolic_vl.objectives import hcl as hcl_lib
from hyperbolic_vl.training import setup as setup_lib

ROOT = str(REPO)
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
  model_def, params = setup_lib.build_model(config, obj, tokenizer, 0)
  aux = obj.init_aux(model_def.module, params, jax.random.key(1))
  # A momentum encoder different from the live one exercises the update.
  # In NumPy: eagerly in jnp each parameter shape compiles its own multiply.
  aux["momentum"] = jax.tree.map(lambda x: np.asarray(x) * x.dtype.type(0.9), aux["momentum"])
  it = data_registry.make_train_iterator(config.input, None, seed=config.seed)
  return config, obj, model_def, params, aux, next(it)


def np_poincare_dist(x, y, c):
  sq = np.sum((x[:, None] - y[None]) ** 2, -1)
  den = (1 - c * np.sum(x * x, -1))[:, None] * (1 - c * np.sum(y * y, -1))[None]
  return np.arccosh(1 + 2 * c * sq / den) / np.sqrt(c)


def np_ce(logits, targets):
  logits = logits - logits.max(1, keepdims=True)
  logp = logits - np.log(np.exp(logits).sum(1, keepdims=True))
  return -np.mean(logp[np.arange(len(targets)), targets])


def reference_ball(v, cfg):
  """float64: z = tanh(|s v| / r) r (s v) / |s v|, projected to (1 - 1e-3) r (released)."""
  v = v * cfg.hyp_input_scale
  norm = np.linalg.norm(v, axis=-1, keepdims=True)
  z = np.tanh(norm / cfg.radius) * cfg.radius * v / norm
  z_norm = np.linalg.norm(z, axis=-1, keepdims=True)
  limit = (1 - 1e-3) * cfg.radius
  return np.where(z_norm > limit, z / z_norm * limit, z)


@pytest.mark.parametrize(
  "object_loss, hyp_negatives",
  [("symmetric", "queue"), ("paper", "queue"), ("symmetric", "batch"), ("paper", "batch")],
)
def test_loss_matches_float64_reference(object_loss, hyp_negatives):
  """Both object losses (released symmetric with two queues, the paper's one
  direction) and both hyperbolic negative sets (released queue of earlier
  object points, the batch's other objects), against float64 NumPy."""
  with jax.enable_x64(True):
    check_loss_against_reference(object_loss, hyp_negatives)


def check_loss_against_reference(object_loss, hyp_negatives):
  config, obj, model_def, params, aux, batch = setup(
    "float64", object_loss=object_loss, hyp_negatives=hyp_negatives
  )
  cfg = config.objective
  rng = np.random.default_rng(3)
  if hyp_negatives == "queue":
    # Earlier object points anywhere in the ball, not only the initial unit vectors.
    points = rng.normal(size=aux["hyp_queue"].shape)
    points *= rng.uniform(0, 0.9 * cfg.radius, (len(points), 1)) / np.linalg.norm(
      points, axis=-1, keepdims=True
    )
    aux["hyp_queue"] = jnp.asarray(points)
  loss, (metrics, new_aux) = jax.jit(
    lambda p, a, b: obj.loss(model_def.merge(p), a, b, rng=None, axis_name=None)
  )(params, aux, batch)
  # float64 NumPy (the same IEEE operations as jnp, without a compile per shape).
  momentum = jax.tree.map(
    lambda m, t: cfg.momentum * np.asarray(m) + (1 - cfg.momentum) * np.asarray(t),
    aux["momentum"],
    params,
  )
  head = jax.jit(lambda p, x: model_def.merge(p)(x))
  g = lambda p, x: np.asarray(head(p, x), np.float64)
  unit = lambda v: v / np.linalg.norm(v, axis=-1, keepdims=True)
  q1, k2 = unit(g(params, batch["view1"])), unit(g(momentum, batch["view2"]))
  q2, k1 = unit(g(params, batch["view2"])), unit(g(momentum, batch["view1"]))
  queue = np.asarray(aux["queue"])
  rows = [np.concatenate([np.sum(q1 * k2, -1, keepdims=True), q1 @ queue.T], 1)]
  if object_loss == "symmetric":
    queue_view1 = np.asarray(aux["queue_view1"])
    rows.append(np.concatenate([np.sum(q2 * k1, -1, keepdims=True), q2 @ queue_view1.T], 1))
  logits = np.concatenate(rows) / cfg.temperature
  euc = np_ce(logits, np.zeros(len(logits), int))

  c = 1 / cfg.radius**2
  z_scene = reference_ball(g(params, batch["scene"]), cfg)
  z_object = reference_ball(g(momentum, batch["object"]), cfg)
  if hyp_negatives == "queue":
    hyp_queue = np.asarray(aux["hyp_queue"])
    positive = np.diag(np_poincare_dist(z_scene, z_object, c))[:, None]
    hyp_logits = -np.concatenate([positive, np_poincare_dist(z_scene, hyp_queue, c)], 1)
    hyp = np_ce(hyp_logits / cfg.temperature, np.zeros(BATCH, int))
  else:
    hyp = np_ce(-np_poincare_dist(z_scene, z_object, c) / cfg.temperature, np.arange(BATCH))
  np.testing.assert_allclose(float(metrics["loss/euc"]), euc, rtol=1e-10)
  np.testing.assert_allclose(float(metrics["loss/hyp"]), hyp, rtol=1e-10)
  np.testing.assert_allclose(float(loss), euc + cfg.hyp_weight * hyp, rtol=1e-10)
  # Each queue took the global batch's keys at its pointer, which moved on.
  written = [("queue", k2, queue)]
  if object_loss == "symmetric":
    written.append(("queue_view1", k1, queue_view1))
  if hyp_negatives == "queue":
    written.append(("hyp_queue", z_object, hyp_queue))
  else:
    assert "hyp_queue" not in new_aux
  for name, keys, before in written:
    np.testing.assert_allclose(np.asarray(new_aux[name][:BATCH]), keys, rtol=1e-10, atol=1e-12)
    np.testing.assert_array_equal(np.asarray(new_aux[name][BATCH:]), before[BATCH:])
    assert int(new_aux[name + "_ptr"]) == BATCH


@pytest.mark.parametrize("fsdp", MESH_LAYOUTS)
def test_one_device_equals_eight_devices_queue_included(fsdp):
  """Loss, gradients, the enqueued keys, the queue pointer and the momentum
  encoder agree on 1 and 8 devices."""

  def build():
    _, obj, model_def, params, aux, batch = setup("float64")
    return model_def, params, obj, batch, aux

  assert_one_device_equals_n_devices_float64(build, label="hcl", fsdp=fsdp)


def test_riemannian_scaling_shrinks_gradients_near_the_boundary():
  v = jnp.array([[4.0, 0.0], [0.5, 0.0]])
  f = lambda v, s: jnp.sum(hcl_lib.to_ball(v, 4.5, 1e-5, s, 1.0))
  # Compiled per flag (an eager gradient compiles each of its operations).
  grad = jax.jit(jax.grad(f), static_argnums=1)
  plain, scaled = grad(v, False), grad(v, True)
  z = np.asarray(hcl_lib.to_ball(v, 4.5, 1e-5, False))
  factor = (1 - np.sum(z * z, -1) / 4.5**2) ** 2 / 4
  np.testing.assert_allclose(scaled, plain * factor[:, None], rtol=1e-5)
  # Clipping: tangent norms above r - eps all land on the same radius.
  big = np.asarray(hcl_lib.to_ball(jnp.array([[100.0, 0.0]]), 4.5, 1e-5, False, clip="tangent"))
  np.testing.assert_allclose(np.linalg.norm(big), 4.5 * np.tanh((4.5 - 1e-5) / 4.5), rtol=1e-5)


def test_batches_scene_regions_contain_their_object():
  provider = coco_boxes.WorldBoxes(0, "train", 100)
  rendered = []  # every (box, size) the examples ask for, in order
  opened = []

  class RecordingProvider:
    def __len__(self):
      return len(provider)

    def pixel_boxes(self, index):
      return provider.pixel_boxes(index)

    def pixel_size(self, index):
      return provider.pixel_size(index)

    def open(self, index):
      opened.append(index)
      scene = provider.open(index)

      class Recording:
        def render_pixels(self, box, size):
          rendered.append(np.asarray(box, np.float64))
          return scene.render_pixels(box, size)

      return Recording()

  it = scene_objects.make_scene_object_iterator(
    RecordingProvider(), batch_size=8, image_size=IMAGE, seed=0, num_threads=0
  )
  batch = next(it)
  assert set(batch) == {"view1", "view2", "scene", "object"}
  assert all(v.shape == (8, IMAGE, IMAGE, 3) and v.dtype == np.uint8 for v in batch.values())
  # One open (one decode) per example, four crops from it: view1 window,
  # view2 window, scene region, object box.
  assert len(opened) == 8 and len(rendered) == 4 * 8
  for index, (_window1, _window2, region, box) in zip(opened, np.reshape(rendered, (8, 4, 4))):
    # Released sampling: only scenes with >= 2 objects; the object is one of
    # their boxes, the region a union of >= 2 of them that holds it.
    boxes = provider.pixel_boxes(index)
    assert len(boxes) >= 2 and any(np.array_equal(box, b) for b in boxes)
    assert np.all(region[:2] <= box[:2]) and np.all(region[2:] >= box[2:])
    inside = [b for b in boxes if np.all(b[:2] >= region[:2]) and np.all(b[2:] <= region[2:])]
    assert len(inside) >= 2
  # grain's iterator state is the position: a restored iterator replays the stream.
  state = it.get_state()
  expected = next(it)
  again = scene_objects.make_scene_object_iterator(
    provider, batch_size=8, image_size=IMAGE, seed=0, num_threads=0
  )
  again.set_state(state)
  np.testing.assert_array_equal(next(again)["scene"], expected["scene"])


def test_process_slices_concatenate_to_the_single_process_batch():
  provider = coco_boxes.WorldBoxes(0, "train", 50)
  make = lambda i, n: scene_objects.make_scene_object_iterator(
    provider, batch_size=8, image_size=IMAGE, seed=0, process_index=i, process_count=n
  )
  single = make(0, 1)
  halves = [make(0, 2), make(1, 2)]
  for _ in range(2):
    whole, parts = next(single), [next(h) for h in halves]
    for key in whole:
      np.testing.assert_array_equal(whole[key], np.concatenate([p[key] for p in parts]))


def test_coco_boxes_drop_crowd_and_keep_pixels(tmp_path):
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
  # Crowd boxes go at load; small ones stay for the sampler's pixel filter,
  # so image b.jpg (one 20 x 20 box) stays too.
  assert len(boxes) == 2 and boxes.skipped_images == 0
  np.testing.assert_allclose(boxes.boxes(0), [[0, 0, 0.5, 0.8], [0, 0, 0.25, 0.5]])
  np.testing.assert_array_equal(boxes.pixel_boxes(0), [[0, 0, 100, 80], [0, 0, 50, 50]])
  assert boxes.pixel_size(0) == (200, 100)
  assert boxes.labels(0).tolist() == [1, 0]
  # The 50 x 50 box is under 56 x 56: the sampler never picks it.
  np.testing.assert_array_equal(
    scene_objects.kept_boxes(boxes.pixel_boxes(0), coco_boxes.HCL_MIN_BOX_AREA), [[0, 0, 100, 80]]
  )
  assert boxes.render(0, boxes.boxes(0)[0], 8).shape == (8, 8, 3)
  # A crop in pixels is the same window as the normalised one.
  opened = boxes.open(0)
  np.testing.assert_array_equal(
    opened.render_pixels([0, 0, 100, 80], 8), opened.render(boxes.boxes(0)[0], 8)
  )


def test_coco_pixel_boxes_truncate_as_released(tmp_path):
  """The released loader truncates each corner (int(x * width)); a box of
  exactly 56 x 56 px after truncation stays, one of 56 x 55 goes."""
  from PIL import Image

  Image.new("RGB", (300, 200)).save(tmp_path / "a.jpg")
  (tmp_path / "ann.json").write_text(
    json.dumps(
      {
        "images": [{"id": 1, "file_name": "a.jpg", "width": 300, "height": 200}],
        "categories": [{"id": 1}],
        "annotations": [
          # corners 10.7, 20.2, 66.7, 76.2 -> 10, 20, 66, 76: 56 x 56
          {"image_id": 1, "bbox": [10.7, 20.2, 56.0, 56.0], "category_id": 1},
          # corners 100, 100, 156, 155.9 -> 100, 100, 156, 155: 56 x 55
          {"image_id": 1, "bbox": [100, 100, 56, 55.9], "category_id": 1},
        ],
      }
    )
  )
  boxes = coco_boxes.CocoBoxes(tmp_path / "ann.json", tmp_path)
  np.testing.assert_array_equal(boxes.pixel_boxes(0), [[10, 20, 66, 76], [100, 100, 156, 155]])
  np.testing.assert_array_equal(
    scene_objects.kept_boxes(boxes.pixel_boxes(0), 56 * 56), [[10, 20, 66, 76]]
  )


def test_ndcg_and_linear_probe():
  assert ranking.ndcg(np.array([3.0, 2, 1]), np.array([3, 2, 1])) == pytest.approx(1.0)
  assert ranking.ndcg(np.array([1.0, 2, 3]), np.array([3, 2, 1])) < 1.0
  rng = np.random.default_rng(0)
  x = rng.normal(size=(200, 5))
  y = (x[:, 0] > 0).astype(int)
  assert linear_probe_adam.linear_probe(x[:100], y[:100], x[100:], y[100:], 2, steps=100) > 0.9
  # The entropy baseline: probabilities on extra rows, Shannon entropy in nats.
  accuracy, probabilities = linear_probe_adam.linear_probe(
    x[:100], y[:100], x[100:], y[100:], 2, steps=100, score_x=x[:3]
  )
  assert accuracy > 0.9 and probabilities.shape == (3, 2)
  np.testing.assert_allclose(probabilities.sum(-1), 1.0, rtol=1e-6)
  np.testing.assert_allclose(
    ranking.entropy(np.array([[0.5, 0.5], [1.0, 0.0], [0.2, 0.8]])),
    [np.log(2), 0.0, -(0.2 * np.log(0.2) + 0.8 * np.log(0.8))],
    rtol=1e-12,
  )


def test_vit_s_variant_builds_abstractly():
  model = models_registry.abstract_model(hcl_config.get_config("vit_s"))
  assert model.image_tower.width == 384 and model.head_out.kernel.shape == (2048, 128)


def test_the_hcl_evaluator_reads_its_ball_from_the_predictors_objective():
  """Built from the input section alone; the ball (radius, input scale, clip)
  is the objective's of the predictor it is called with, recompiled for
  another, and the scene and object norms follow it."""
  config, obj, model_def, params, _, _ = setup()
  with config.unlocked():
    config.evals = {"hcl": evaluator_registry.entry("hcl", num_examples=6)}
  (built,) = evaluator_registry.build_all(config, tokenizer=None)
  evaluator = built.evaluate
  other_section = dict(config.objective.to_dict(), radius=2.0, hyp_input_scale=0.5)
  other = objectives_lib.get(other_section)
  # The model's outputs for the crops, compiled once (an eager pass compiles
  # each of its operations instead).
  outputs = jax.jit(lambda p, x: model_def.merge(p)(x))(params, evaluator.crops)
  crops = np.asarray(outputs, np.float64)
  norms = {}
  for objective in (obj, other, obj):
    predictor = predictor_lib.Predictor(
      model_def, objective, params, tokenizer=None, image_size=IMAGE
    )
    figures = evaluator(predictor)
    ball = objective.settings
    want = np.linalg.norm(reference_ball(crops, ball), axis=-1).mean() / ball.radius
    assert figures["eval/norm/object"] == pytest.approx(want, rel=1e-4)
    norms.setdefault(ball.radius, []).append(figures["eval/norm/object"])
  assert sorted(norms) == [2.0, obj.settings.radius] and len(norms[obj.settings.radius]) == 2
  assert norms[2.0][0] != pytest.approx(norms[obj.settings.radius][0], rel=1e-3)


@pytest.mark.slow  # an end-to-end run of the command line
def test_tiny_variant_trains_from_the_command_line(tmp_path):
  env = dict(os.environ, XLA_FLAGS=cheap_codegen.XLA_FLAG, JAX_PLATFORMS="cpu")
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
      "--config.evals.hcl.num_examples=24",
    ],
    cwd=ROOT,
    env=env,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert run.returncode == 0, run.stderr[-3000:]
  assert "eval/linear_probe_accuracy" in run.stdout and "eval/ndcg_norm_vs_objects" in run.stdout
  assert "eval/ndcg_entropy_vs_objects" in run.stdout


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
