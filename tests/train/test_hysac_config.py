"""configs/hysac.py trains end to end: the tiny variant on the world's
quadruplets (the safety table printed and logged, the bounds written where
`hyperbolic_vl.load` finds them, traversal through the loaded model), and
the same config on a ViSU file with images from the test's folders."""

import json

import numpy as np
from PIL import Image

import hyperbolic_vl
from configs import hysac as hysac_config
from hyperbolic_vl.data import synthetic_quadruplets as quadruplets
from hyperbolic_vl.data import synthetic_world as world
from hyperbolic_vl.evaluators.metrics import safety
from hyperbolic_vl.training import loop


def small(config, **data):
  with config.unlocked():
    config.input.batch_size = 8
    config.input.image_size = 16
    config.total_steps = 2
    config.ckpt_steps = 2
    config.log_training_steps = 1
    config.optim.warmup_steps = 1
    config.evals.safety.num_examples = 24
    config.evals.safety.bounds_examples = 24
    config.input.data.update(data)
  return config


def test_tiny_variant_trains_prints_the_table_and_writes_bounds(tmp_path, capsys):
  figures = loop.train_and_evaluate(small(hysac_config.get_config()), str(tmp_path))
  assert "Safety retrieval (%)" in capsys.readouterr().out
  for name in ("u2v_and_g", "u2v_and_g/traversal", "g2s_and_u", "u2u_and_s/traversal"):
    assert 0.0 <= figures[f"safety_retrieval/{name}/safety"] <= 1.0
  bounds = safety.read_bounds(tmp_path / "eval" / "safety" / "hysac_bounds.json")
  assert bounds["V"]["up_95"] == figures["safety_retrieval/bounds/V/up_95"]
  model = hyperbolic_vl.load(tmp_path)
  texts = model.encode_texts(["an unsafe red circle alone on a gray background"] * 2)
  moved = model.traverse_to_safe_text(texts, alpha=5.0)
  radius = safety.traversal_radius(bounds["S"]["up_95"], model.curv, 5.0)
  expected = safety.traverse(texts, bounds["S"]["up_95"], model.curv, alpha=5.0)
  np.testing.assert_allclose(moved, expected, rtol=1e-6)
  assert np.all(np.linalg.norm(moved, axis=1) <= max(radius, np.linalg.norm(texts[0])) + 1e-6)


def test_the_config_trains_from_a_visu_file(tmp_path):
  coco, unsafe = tmp_path / "coco" / "train2017", tmp_path / "unsafe"
  coco.mkdir(parents=True)
  unsafe.mkdir()
  entries = {}
  for index in range(8):
    scene = world.sample_scene(1, "train", index)
    Image.fromarray(world.render(scene, 24)).save(coco / f"{index + 7:012d}.jpg")
    Image.fromarray(quadruplets.render_unsafe(scene, 24)).save(unsafe / f"{index}.png")
    caption = world.caption_tiers(scene)[-1]
    entries[str(index)] = dict(
      coco_id=index + 7,
      nsfw_im_path=f"/elsewhere/{index}.png",
      safe=caption,
      nsfw=quadruplets.unsafe_caption(caption),
    )
  (tmp_path / "visu.json").write_text(json.dumps({"info": {}, "data": entries}))
  config = small(
    hysac_config.get_config("tiny,data=visu"),
    path=str(tmp_path / "visu.json"),
    safe_image_root=str(tmp_path / "coco"),
    unsafe_image_root=str(unsafe),
  )
  figures = loop.train_and_evaluate(config, str(tmp_path / "run"))
  assert "safety_retrieval/u2v_and_g/R@1" in figures
  rows = [
    json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
  ]
  assert any("train/loss/entailment/safe_image_unsafe_text" in row for row in rows)
