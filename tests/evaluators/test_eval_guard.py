"""A run on real image-text data is never ended by an evaluator that needs
the synthetic world: it is disabled at start-up with the reason."""

import csv
import json
import os

import numpy as np
import pytest
from PIL import Image

from configs import meru as meru_config
from hyperbolic_vl.training import loop


def write_pairs(root, num_images=8):
  images = root / "images"
  images.mkdir()
  rng = np.random.default_rng(0)
  with open(root / "pairs.csv", "w", newline="") as f:
    writer = csv.DictWriter(f, fieldnames=["image", "caption"])
    writer.writeheader()
    for i in range(num_images):
      name = f"img_{i}.png"
      Image.fromarray(rng.integers(0, 256, size=(20, 24, 3), dtype=np.uint8)).save(images / name)
      for caption in ("a red circle", "two blue squares"):
        writer.writerow({"image": name, "caption": caption})
  return root / "pairs.csv", images


@pytest.mark.slow
def test_real_data_run_trains_past_its_periodic_evaluation(tmp_path, capsys):
  csv_path, images = write_pairs(tmp_path)
  config = meru_config.get_config("data=image_text_csv")
  with config.unlocked():
    config.input.data.path = str(csv_path)
    config.input.data.image_root = str(images)
    config.input.batch_size = 8
    config.input.image_size = 16
    config.total_steps = 4
    config.ckpt_steps = 4
    config.log_training_steps = 2
    config.optim.warmup_steps = 1
    config.evals.world.every_steps = 2
  workdir = tmp_path / "run"
  result = loop.train(config, str(workdir))
  assert result.step == 4
  printed = capsys.readouterr().out
  assert "Evaluator 'world' (world) disabled" in printed and "input.data.name='world'" in printed
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    rows = [json.loads(line) for line in f]
  assert [r["step"] for r in rows if "train/loss" in r] == [2, 4]
  assert not any(k.startswith("eval/") for r in rows for k in r)
