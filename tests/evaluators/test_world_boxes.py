"""The `world_boxes` evaluator: its figures on hand-placed embeddings, its
rows against the world, and the evaluator in a tiny HyCoCLIP run."""

import math

import numpy as np
import pytest
from tiny_runs import small_config

import hyperbolic_vl
from configs import hycoclip as hycoclip_config
from hyperbolic_vl.data import synthetic_world as world
from hyperbolic_vl.evaluators import registry as evaluator_registry
from hyperbolic_vl.evaluators import world_boxes
from hyperbolic_vl.objectives import hycoclip as hycoclip_lib
from hyperbolic_vl.runs import metrics_io
from hyperbolic_vl.training import loop


def test_figures_on_hand_placed_embeddings():
  """Three rows in 2-D, curvature 1. A point beyond the apex on its own ray
  is inside the apex's cone (exterior angle 0); one on the opposite ray is
  outside (angle pi, apertures are at most pi/2)."""
  u = np.asarray([1.0, 0.0])
  ray = lambda *scales: np.stack([s * u for s in scales])
  embeddings = {
    "phrase": ray(0.5, 0.5, 0.5),
    "caption": ray(1.0, -1.0, 1.0),
    "box": ray(0.8, 0.8, -0.8),
    "image": ray(2.0, 2.0, 2.0),
  }
  figures = world_boxes.compositional_figures(embeddings, "lorentz", 1.0)
  # image vs box: rows 0, 1 inside (same ray, farther); row 2 opposite.
  assert figures["image_inside_box_cone_fraction"] == pytest.approx(2 / 3)
  # caption vs phrase: row 1 opposite.
  assert figures["caption_inside_phrase_cone_fraction"] == pytest.approx(2 / 3)
  # box vs phrase: row 2 opposite.
  assert figures["box_inside_phrase_cone_fraction"] == pytest.approx(2 / 3)
  # image vs caption: row 1's caption is on the opposite ray.
  assert figures["image_inside_caption_cone_fraction"] == pytest.approx(2 / 3)
  # d(O, x) = asinh(|x|) at c = 1.
  assert figures["mean_dist_origin/phrase"] == pytest.approx(math.asinh(0.5))
  assert figures["mean_dist_origin/caption"] == pytest.approx(math.asinh(1.0))
  assert figures["mean_dist_origin/box"] == pytest.approx(math.asinh(0.8))
  assert figures["mean_dist_origin/image"] == pytest.approx(math.asinh(2.0))
  # Euclidean models: norms, and no cones.
  flat = world_boxes.compositional_figures(embeddings, "euclidean", None)
  assert set(flat) == {f"mean_dist_origin/{level}" for level in world_boxes.LEVELS}
  assert flat["mean_dist_origin/image"] == pytest.approx(2.0)


def test_one_row_per_object_with_its_crop_and_phrase():
  rows = world_boxes.grounded_scenes(0, "test", 5, 16)
  scenes = [world.sample_scene(0, "test", index) for index in range(5)]
  assert len(rows["phrase"]) == sum(scene.count for scene in scenes) == len(rows["box"])
  row = 0
  for index, scene in enumerate(scenes):
    for obj in scene.objects:
      assert rows["scene"][row] == index
      assert rows["phrase"][row] == world.with_article(f"{obj.color} {obj.shape}")
      assert rows["caption"][row] == world.caption_tiers(scene)[-1]
      np.testing.assert_array_equal(rows["image"][row], world.render(scene, 16))
      np.testing.assert_array_equal(rows["box"][row], world.render(scene, 16, crop=obj.box))
      row += 1


def test_a_tiny_hycoclip_run_logs_every_term_and_the_box_figures(tmp_path):
  config = small_config(
    hycoclip_config.get_config, total_steps=4, ckpt_steps=100, log_training_steps=1
  )
  with config.unlocked():
    config.evals.world_boxes.num_examples = 12
    # The world's own figures are the tiny MERU run's (the same towers):
    # only the box figures are under test here.
    del config.evals.world
  results = loop.train_and_evaluate(config, str(tmp_path))
  records = metrics_io.read_metrics(str(tmp_path))
  train_keys = set().union(*(r.keys() for r in records))
  for label, *_ in hycoclip_lib.CONTRASTIVE_TERMS:
    assert f"train/loss/contrastive/{label}" in train_keys
  for label, *_ in hycoclip_lib.ENTAILMENT_TERMS:
    assert f"train/loss/entailment/{label}" in train_keys
  first = next(r for r in records if "train/loss" in r)
  # The logged total is its logged parts combined as the released code does.
  assert first["train/loss"] == pytest.approx(
    first["train/loss/contrastive"] + 0.2 * first["train/loss/entailment"], rel=1e-5
  )
  figures = {key for key in results if key.startswith("eval/boxes/")}
  assert figures == {
    *(f"eval/boxes/{name}" for name, *_ in world_boxes.CONES),
    *(f"eval/boxes/mean_dist_origin/{level}" for level in world_boxes.LEVELS),
  }
  for name, *_ in world_boxes.CONES:
    assert 0.0 <= results[f"eval/boxes/{name}"] <= 1.0
  # The evaluator gives the same figures on the saved run.
  loaded = hyperbolic_vl.load(str(tmp_path))
  built = evaluator_registry.build_all(loaded.config, loaded.tokenizer)
  again = next(e for e in built if e.name == "world_boxes").evaluate(loaded)
  for key, value in again.items():
    assert value == pytest.approx(results[key], rel=1e-5), key
