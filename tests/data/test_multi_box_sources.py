"""Several boxes per image (`max_boxes` = N > 0, UNCHA's data) in every box
source: the first N boxes in stored order with a validity mask and fixed
shapes, UNCHA's crop scale and grayscale, and GRIT samples without a box,
with a missing box file or with an undecodable box crop counted and skipped.
The single-box default is tested, unchanged, by test_grit_shards.py,
test_coco_grounded.py and test_world_boxes_source.py."""

import io
import pathlib
import tarfile

import numpy as np
import pytest
from letter_tokenizer import LetterTokenizer
from PIL import Image

from configs import uncha as uncha_config
from hyperbolic_vl import errors
from hyperbolic_vl.data import registry
from hyperbolic_vl.data import synthetic_grounded as world_boxes
from hyperbolic_vl.data import synthetic_world as world
from hyperbolic_vl.data.readers import tar_shards
from hyperbolic_vl.runs import metrics_io
from hyperbolic_vl.training import loop

# Solid colours of the box crops: a crop's colour says which phrase it shows.
PHRASES = {
  "a red circle": (220, 30, 30),
  "a blue square": (30, 30, 220),
  "a green triangle": (30, 200, 30),
  "a white star": (240, 240, 240),
  "a black dot": (10, 10, 10),
  "a yellow moon": (230, 220, 20),
  "a cyan cross": (20, 220, 220),
}
MAX_BOXES = 5
# Example number -> its stored boxes (phrases in stored order) and what is
# wrong with it. 7 boxes: the first five are kept. NO_BOX has numparents 0,
# MISSING lacks parent001.jpg, CORRUPT's parent002.jpg is not an image:
# each is skipped and counted once per pass.
NAMES = list(PHRASES)
STORED = {
  0: NAMES[:1],
  1: NAMES[:3],
  2: NAMES[:7],
  3: NAMES[2:7],
  4: [],
  5: NAMES[1:4],
  6: NAMES[3:5],
  7: NAMES[:4],
}
NO_BOX, MISSING, CORRUPT = 4, 5, 7
BAD = (NO_BOX, MISSING, CORRUPT)


def _jpeg(pixels: np.ndarray) -> bytes:
  buffer = io.BytesIO()
  Image.fromarray(pixels).save(buffer, format="JPEG", quality=95)
  return buffer.getvalue()


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
  info = tarfile.TarInfo(name)
  info.size = len(data)
  tar.addfile(info, io.BytesIO(data))


def caption_of(number: int) -> str:
  return f"scene {number} with shapes"


def build_multi_box_shard(folder: pathlib.Path) -> str:
  """One shard in HyCoCLIP's GRIT layout with the examples of STORED."""
  rng = np.random.default_rng(0)
  path = folder / "00000.tar"
  with tarfile.open(path, "w") as tar:
    for number, phrases in STORED.items():
      key = f"{number:09d}"
      _add(tar, f"{key}.child.jpg", _jpeg(rng.integers(0, 256, (30, 40, 3), dtype=np.uint8)))
      _add(tar, f"{key}.child.txt", caption_of(number).encode())
      _add(tar, f"{key}.numparents.txt", str(len(phrases)).encode())
      for k, phrase in enumerate(phrases):
        crop = _jpeg(np.full((20, 24, 3), PHRASES[phrase], np.uint8))
        if number == CORRUPT and k == 2:
          crop = b"not a jpeg"
        if not (number == MISSING and k == 1):
          _add(tar, f"{key}.parent{k:03d}.jpg", crop)
        _add(tar, f"{key}.parent{k:03d}.txt", phrase.encode())
  return str(path)


@pytest.fixture(scope="module")
def shard(tmp_path_factory):
  return build_multi_box_shard(tmp_path_factory.mktemp("grit_multi"))


def grit_config(shard, batch_size=5, **data):
  return {
    "batch_size": batch_size,
    "image_size": 8,
    "data": {"name": "grit", "path": shard, "max_boxes": MAX_BOXES, **data},
  }


def test_first_boxes_follow_the_stored_order_and_refuse_incomplete_examples(shard, tmp_path):
  source = tar_shards.GritShardSource(shard, cache_dir=tmp_path, keep_boxless=True)
  assert len(source) == len(STORED)
  for number, phrases in STORED.items():
    if number in (NO_BOX, MISSING):
      continue
    boxes = source.first_boxes(number, MAX_BOXES)
    assert [phrase for _, phrase in boxes] == phrases[:MAX_BOXES]
  with pytest.raises(tar_shards.BadSampleError, match=r"000000004: no box"):
    source.first_boxes(NO_BOX, MAX_BOXES)
  with pytest.raises(tar_shards.BadSampleError, match=r"000000005\.parent001: box image"):
    source.first_boxes(MISSING, MAX_BOXES)
  # The single-box reading leaves the boxless key out, as before.
  assert len(tar_shards.GritShardSource(shard, cache_dir=tmp_path)) == len(STORED) - 1


def test_grit_batches_hold_the_first_boxes_with_their_mask(shard):
  tokenizer = LetterTokenizer(16)
  iterator = registry.make_train_iterator(
    grit_config(shard), tokenizer, seed=1, process_index=0, process_count=1
  )
  seen, bad = set(), 0
  for _ in range(8):  # five passes over the eight examples
    batch = next(iterator)
    assert batch["box_image"].shape == (5, MAX_BOXES, 8, 8, 3)
    assert batch["box_tokens"].shape == (5, MAX_BOXES, tokenizer.context_length)
    assert batch["box_mask"].shape == (5, MAX_BOXES) and batch["box_mask"].dtype == bool
    bad += int(batch["input/bad_samples"].sum())
    for row in range(5):
      number = int(batch["index"][row])
      assert number not in BAD
      seen.add(number)
      kept = STORED[number][:MAX_BOXES]
      np.testing.assert_array_equal(batch["box_mask"][row], np.arange(MAX_BOXES) < len(kept))
      for slot in range(MAX_BOXES):
        tokens = batch["box_tokens"][row, slot]
        if slot < len(kept):
          np.testing.assert_array_equal(tokens, tokenizer.encode([kept[slot]])[0])
          # JPEG (q95) and the bicubic resize of a flat crop stay within a few levels.
          colour = batch["box_image"][row, slot].reshape(-1, 3).mean(0)
          assert np.abs(colour - PHRASES[kept[slot]]).max() < 6, (number, slot)
        else:
          assert not batch["box_image"][row, slot].any()
          np.testing.assert_array_equal(tokens, tokenizer.encode([""])[0])
  assert seen == set(STORED) - set(BAD)
  # 40 positions over 8 examples: five passes. A bad example's position is
  # filled by the next good one, and every bad one met on the way counts:
  # position 4 meets NO_BOX then MISSING (2), position 5 MISSING (1),
  # position 7 CORRUPT (1): four per pass.
  assert bad == 5 * 4


def test_grit_process_slices_concatenate(shard):
  tokenizer = LetterTokenizer(16)
  config = grit_config(shard, batch_size=4)
  single = registry.make_train_iterator(config, tokenizer, seed=3, process_index=0, process_count=1)
  halves = [
    registry.make_train_iterator(config, tokenizer, seed=3, process_index=i, process_count=2)
    for i in range(2)
  ]
  for _ in range(2):
    whole = next(single)
    parts = [next(half) for half in halves]
    for key in whole:
      np.testing.assert_array_equal(
        np.concatenate([p[key] for p in parts]), whole[key], err_msg=key
      )


def test_world_boxes_keep_the_first_objects_in_order():
  tokenizer = LetterTokenizer(16)
  config = {
    "batch_size": 8,
    "image_size": 16,
    "data": {"name": "world_boxes", "num_train": 32, "max_boxes": 3},
  }
  batch = next(
    registry.make_train_iterator(config, tokenizer, seed=2, process_index=0, process_count=1)
  )
  assert set(batch) == set(registry.get("world_boxes").batch_keys) | {"box_mask"}
  assert batch["box_image"].shape == (8, 3, 16, 16, 3)
  counts = []
  for row in range(8):
    scene = world.sample_scene(0, "train", int(batch["index"][row]))
    kept = scene.objects[:3]
    counts.append(len(kept))
    np.testing.assert_array_equal(batch["box_mask"][row], np.arange(3) < len(kept))
    for slot, obj in enumerate(kept):
      np.testing.assert_array_equal(
        batch["box_tokens"][row, slot], tokenizer.encode([world_boxes.box_phrase(obj)])[0]
      )
    assert not batch["box_image"][row, len(kept) :].any()
  # The world has scenes of one to four objects: both full and padded rows occur.
  assert min(counts) < 3 and max(counts) == 3


def test_full_crop_scale_shows_the_whole_scene_and_grayscale_one_makes_every_image_grey():
  tokenizer = LetterTokenizer(16)
  data = {"name": "world_boxes", "num_train": 8, "max_boxes": 2, "crop_scale": (1.0, 1.0)}
  config = {"batch_size": 4, "image_size": 16, "data": data}
  batch = next(
    registry.make_train_iterator(config, tokenizer, seed=0, process_index=0, process_count=1)
  )
  for row in range(4):
    scene = world.sample_scene(0, "train", int(batch["index"][row]))
    # Area share 1 leaves no window of another aspect: torchvision's fallback,
    # the whole image.
    np.testing.assert_array_equal(batch["image"][row], world.render(scene, 16))
  config["data"] = {**data, "grayscale_prob": 1.0}
  grey = next(
    registry.make_train_iterator(config, tokenizer, seed=0, process_index=0, process_count=1)
  )
  for images in (grey["image"], grey["box_image"][grey["box_mask"]]):
    assert (images[..., 0] == images[..., 1]).all() and (images[..., 1] == images[..., 2]).all()
  # The luma of PIL's "L" conversion (ITU-R 601), per pixel.
  expected = np.asarray(Image.fromarray(batch["image"][0]).convert("L"))
  np.testing.assert_array_equal(grey["image"][0][..., 0], expected)


@pytest.mark.parametrize(
  "data, message",
  [
    ({"max_boxes": -1}, "max_boxes must be >= 0"),
    ({"crop_scale": (0.9, 0.8)}, "crop_scale must be"),
    ({"grayscale_prob": 1.5}, "grayscale_prob must be in"),
  ],
)
def test_bad_box_settings_name_the_key(data, message):
  with pytest.raises(errors.ConfigError, match=message):
    registry.settings_class("world_boxes").from_config(data)


def test_coco_grounded_keeps_the_first_boxes_of_the_instances_file(tmp_path):
  import json

  colours = {1: (220, 30, 30), 2: (30, 30, 220), 3: (30, 200, 30)}
  names = {1: "dog", 2: "cat", 3: "bird"}
  # Image 1: three boxes (stored order bird, dog, cat); image 2: one box.
  layout = {
    1: [(3, [4, 4, 36, 36]), (1, [48, 4, 36, 36]), (2, [4, 44, 36, 34])],
    2: [(2, [8, 8, 40, 40])],
  }
  images, annotations = [], []
  for image_id, boxes in layout.items():
    pixels = np.full((80, 96, 3), 128, np.uint8)
    for category, (x, y, w, h) in boxes:
      pixels[max(y - 3, 0) : y + h + 3, max(x - 3, 0) : x + w + 3] = colours[category]
      annotations.append(
        {
          "id": len(annotations) + 1,
          "image_id": image_id,
          "category_id": category,
          "bbox": [x, y, w, h],
          "iscrowd": 0,
          "area": w * h,
        }
      )
    name = f"{image_id}.png"
    Image.fromarray(pixels).save(tmp_path / name)
    images.append({"id": image_id, "file_name": name, "width": 96, "height": 80})
  categories = [{"id": i, "name": n} for i, n in names.items()]
  (tmp_path / "instances.json").write_text(
    json.dumps({"images": images, "annotations": annotations, "categories": categories})
  )
  captions = [{"id": i, "image_id": i, "caption": f"photo {i}"} for i in layout]
  (tmp_path / "captions.json").write_text(json.dumps({"images": images, "annotations": captions}))
  data = {
    "name": "coco_grounded",
    "path": str(tmp_path / "instances.json"),
    "captions_path": str(tmp_path / "captions.json"),
    "image_root": str(tmp_path),
    "max_boxes": 2,
  }
  tokenizer = LetterTokenizer(16)
  batch = next(
    registry.make_train_iterator(
      {"batch_size": 2, "image_size": 8, "data": data},
      tokenizer,
      seed=0,
      process_index=0,
      process_count=1,
    )
  )
  for row in range(2):
    boxes = layout[1 + int(batch["index"][row])][:2]
    np.testing.assert_array_equal(batch["box_mask"][row], np.arange(2) < len(boxes))
    for slot, (category, _) in enumerate(boxes):
      np.testing.assert_array_equal(
        batch["box_tokens"][row, slot], tokenizer.encode([names[category]])[0]
      )
      # The crop shows its box's colour: the nearest of the three by its mean
      # (neighbouring boxes' paint bleeds a little into the bicubic resize).
      colour = batch["box_image"][row, slot].reshape(-1, 3).mean(0)
      nearest = min(colours, key=lambda c: np.abs(colour - colours[c]).sum())
      assert nearest == category and np.abs(colour - colours[category]).max() < 12
    assert not batch["box_image"][row, len(boxes) :].any()


def test_uncha_trains_on_a_multi_box_shard(shard, tmp_path):
  """The paper config's GRIT reading (`configs/uncha.py:data=grit`) trains on
  a shard with missing and corrupt boxes; in process, on one device (the
  command line's flags are the docs test's and tests/integration's)."""
  workdir = tmp_path / "run"
  config = uncha_config.get_config("data=grit")
  with config.unlocked():
    config.num_devices = 1
    config.input.data.path = str(shard)
    config.input.data.num_train = 0
    config.input.data.max_boxes = MAX_BOXES
    config.input.batch_size = 4
    config.input.image_size = 16
    config.input.max_bad_fraction = 0.5
    config.total_steps, config.log_training_steps, config.ckpt_steps = 3, 1, 100
    config.optim.warmup_steps = 1
  assert loop.train(config, str(workdir)).step == 3
  records = metrics_io.read_metrics(str(workdir))
  per_step = {r["step"]: r for r in records if "train/loss" in r}
  assert sorted(per_step) == [1, 2, 3]
  assert all(np.isfinite(r["train/loss"]) for r in per_step.values())
  # The eight examples in shuffled order fill positions 0-7 (one pass: its
  # bad examples meet 4 times, see above), positions 8-11 half of the next.
  bad = sum(r.get("train/input/bad_samples", 0.0) for r in per_step.values())
  assert 4 <= bad <= 8
  # Only good examples train: examples 0, 1, 2, 3 and 6 with 1, 3, 5, 5 and 2 boxes.
  for record in per_step.values():
    assert 1 <= record["train/valid_boxes_per_image"] <= MAX_BOXES
