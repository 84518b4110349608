"""A run sized in epochs: steps per pass, the resolved config (Radial's one
pass over a CSV, HCL's 200 epochs), and a trained run on the resolved config."""

import json

import numpy as np
import pytest
from tiny_runs import small_config

from configs import clip as clip_config
from configs import hcl as hcl_config
from configs import radial as radial_config
from hyperbolic_vl import errors
from hyperbolic_vl.data import run_length
from hyperbolic_vl.runs import metrics_io
from hyperbolic_vl.training import loop


def test_steps_per_epoch_drop_and_fill():
  assert run_length.steps_per_epoch(70, 8, "drop") == 8  # 64 rows, 6 left over
  assert run_length.steps_per_epoch(70, 8, "fill") == 9  # every row at least once
  assert run_length.steps_per_epoch(64, 8, "drop") == run_length.steps_per_epoch(64, 8, "fill") == 8
  with pytest.raises(errors.ConfigError, match="less than one batch"):
    run_length.steps_per_epoch(7, 8, "drop")
  with pytest.raises(errors.ConfigError, match="epoch_last_batch"):
    run_length.steps_per_epoch(70, 8, "keep")


def write_tiers_csv(path, rows):
  lines = ["positive,negative,image_url"]
  lines += [
    f"a{i} => b{i} => c{i} => d{i},e{i} => f{i} => g{i} => h{i},x{i}.jpg" for i in range(rows)
  ]
  path.write_text("\n".join(lines) + "\n")


def test_radial_paper_variant_is_one_pass_over_the_csv(tmp_path):
  """As the released script: ceil(rows / 8) steps for one epoch at batch 8."""
  write_tiers_csv(tmp_path / "train.csv", 21)
  config = radial_config.get_config("vit_b")
  assert (config.total_steps, config.epochs, config.input.batch_size) == (0, 1, 8)
  with config.unlocked():
    config.input.data.path = str(tmp_path / "train.csv")
  resolved = run_length.resolve(config)
  assert resolved.total_steps == 3  # ceil(21 / 8)
  assert config.total_steps == 0  # the caller's config is left as it was
  with resolved.unlocked():
    resolved.input.data.num_train = 16  # a cap on the rows counts too
  assert run_length.resolve(resolved) is resolved  # total_steps is given now
  with resolved.unlocked():
    resolved.total_steps = 0
  assert run_length.resolve(resolved).total_steps == 2


def write_coco(tmp_path, images):
  (tmp_path / "images").mkdir()
  data = {
    "images": [
      {"id": i, "file_name": f"{i}.jpg", "width": 640, "height": 480} for i in range(images)
    ],
    "categories": [{"id": 1}],
    "annotations": [
      {"image_id": i, "bbox": [0, 0, 100, 100], "category_id": 1} for i in range(images)
    ],
  }
  (tmp_path / "ann.json").write_text(json.dumps(data))


def test_hcl_paper_variant_is_200_epochs_of_whole_batches(tmp_path):
  write_coco(tmp_path, 300)
  config = hcl_config.get_config("vit_s")
  assert (config.optim.name, config.optim.lr, config.input.batch_size) == ("sgd", 0.15, 128)
  assert (config.optim.momentum, config.optim.weight_decay) == (0.9, 1e-4)
  assert config.optim.schedule == "cosine_per_epoch" and config.optim.decay_gains_biases
  assert (config.total_steps, config.epochs, config.epoch_last_batch) == (0, 200, "drop")
  assert config.objective.hyp_input_scale == 1.0
  with config.unlocked():
    config.input.data.path = str(tmp_path / "ann.json")
    config.input.data.image_root = str(tmp_path / "images")
  resolved = run_length.resolve(config)
  # 300 scenes // 128 = 2 whole batches an epoch (drop_last, as released).
  assert (resolved.optim.steps_per_epoch, resolved.total_steps) == (2, 400)


def test_no_length_at_all_is_a_config_error():
  config = hcl_config.get_config()
  with config.unlocked():
    config.total_steps = 0
  with pytest.raises(errors.ConfigError, match="epochs=0"):
    run_length.resolve(config)


def test_a_run_sized_in_epochs_trains_with_the_per_epoch_cosine(tmp_path):
  """The trainer on a resolved config: 2 epochs of 40 world scenes at batch
  16 (2 whole batches each) with SGD and MoCo's per-epoch cosine."""
  config = small_config(
    clip_config.get_config,
    **{
      "input.data.num_train": 40,
      "total_steps": 0,
      "evals": {},
      "log_training_steps": 1,
      "ckpt_steps": 100,
    },
  )
  with config.unlocked():
    config.epochs = 2
    config.optim.update(
      dict(name="sgd", momentum=0.9, lr=0.15, schedule="cosine_per_epoch", steps_per_epoch=0)
    )
  resolved = run_length.resolve(config)
  assert (resolved.total_steps, resolved.optim.steps_per_epoch) == (4, 2)
  result = loop.train(resolved, str(tmp_path))
  assert result.step == 4
  logged = {r["step"]: r["train/learning_rate"] for r in metrics_io.read_metrics(str(tmp_path))}
  # The logged lr is the schedule at the step's own index (0-based, step - 1):
  # 0.15 through epoch 0, 0.15 (1 + cos(pi / 2)) / 2 = 0.075 through epoch 1.
  expected = {1: 0.15, 2: 0.15, 3: 0.075, 4: 0.075}
  np.testing.assert_allclose([logged[s] for s in expected], list(expected.values()), rtol=1e-6)
