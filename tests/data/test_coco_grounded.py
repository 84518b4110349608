"""COCO instances + captions as HyCoCLIP's grounded data (`coco_grounded`):
a box crop comes with its category name, small and crowd boxes are dropped,
images without a box or a caption are skipped, an undecodable image is
skipped and counted."""

import json

import numpy as np
import pytest
from letter_tokenizer import LetterTokenizer
from PIL import Image

from hyperbolic_vl.data import grounded, registry

WIDTH, HEIGHT = 96, 80
BACKGROUND = (128, 128, 128)
CATEGORIES = [
  {"id": 1, "name": "dog", "colour": (220, 30, 30)},
  {"id": 3, "name": "traffic light", "colour": (30, 30, 220)},
  {"id": 5, "name": "cat", "colour": (30, 200, 30)},
]
COLOUR = {c["id"]: c["colour"] for c in CATEGORIES}
NAME = {c["id"]: c["name"] for c in CATEGORIES}
# Boxes (x, y, w, h): 40 x 34 = 1360 px > 32 x 32, kept; 20 x 20 dropped.
LEFT, RIGHT, SMALL = [6, 20, 40, 34], [56, 20, 36, 34], [60, 60, 20, 16]
# Image id -> its boxes (category, box, iscrowd) and captions.
IMAGES = {
  10: ([(1, LEFT, 0), (3, RIGHT, 0)], ["a dog beside a traffic light", "a red dog"]),
  11: ([(5, LEFT, 0), (1, RIGHT, 1)], ["a cat on grey", "one green cat"]),  # crowd dog dropped
  12: ([(1, SMALL, 0)], ["a small dog"]),  # no box kept: skipped
  13: ([(5, LEFT, 0)], []),  # no caption: skipped
  14: ([(1, LEFT, 0)], ["a broken photo"]),  # file not an image: counted
  15: ([(3, LEFT, 0), (5, SMALL, 0)], ["a traffic light"]),  # small cat dropped
}
CORRUPT = 14


@pytest.fixture(scope="module")
def coco(tmp_path_factory):
  root = tmp_path_factory.mktemp("coco")
  images_dir = root / "images"
  images_dir.mkdir()
  images, instances, captions = [], [], []
  for image_id, (boxes, texts) in IMAGES.items():
    name = f"{image_id:012d}.png"
    images.append({"id": image_id, "file_name": name, "width": WIDTH, "height": HEIGHT})
    pixels = np.full((HEIGHT, WIDTH, 3), BACKGROUND, np.uint8)
    for category, (x, y, w, h), crowd in boxes:
      # Painted 3 px beyond the box: the bicubic resize of a crop inside
      # the box reads up to 2.5 px outside it, and must read the same colour.
      pixels[max(y - 3, 0) : y + h + 3, max(x - 3, 0) : x + w + 3] = COLOUR[category]
      instances.append(
        {
          "id": len(instances) + 1,
          "image_id": image_id,
          "category_id": category,
          "bbox": [x, y, w, h],
          "iscrowd": crowd,
          "area": w * h,
        }
      )
    if image_id == CORRUPT:
      (images_dir / name).write_bytes(b"not a png")
    else:
      Image.fromarray(pixels).save(images_dir / name)
    for text in texts:
      captions.append({"id": len(captions) + 1, "image_id": image_id, "caption": text})
  categories = [{"id": c["id"], "name": c["name"]} for c in CATEGORIES]
  (root / "instances.json").write_text(
    json.dumps({"images": images, "annotations": instances, "categories": categories})
  )
  (root / "captions.json").write_text(json.dumps({"images": images, "annotations": captions}))
  return root


def _data(coco):
  return {
    "name": "coco_grounded",
    "path": str(coco / "instances.json"),
    "captions_path": str(coco / "captions.json"),
    "image_root": str(coco / "images"),
  }


def test_examples_keep_captioned_images_with_boxes_over_32_by_32(coco):
  examples = grounded.CocoGroundedExamples(
    str(coco / "instances.json"), str(coco / "captions.json"), str(coco / "images"), 32 * 32
  )
  kept = [int(item[0].rsplit("/", 1)[-1].split(".")[0]) for item in examples.items]
  assert kept == [10, 11, 14, 15]
  assert examples.skipped_images == 2  # 12 (only a small box), 13 (no caption)
  # Categories by id: 1 dog, 3 traffic light, 5 cat; crowd and small boxes gone.
  assert [item[5].tolist() for item in examples.items] == [[0, 1], [2], [0], [1]]
  np.testing.assert_array_equal(examples.items[0][4], [[6, 20, 46, 54], [56, 20, 92, 54]])


def test_batches_carry_box_crops_with_their_category_and_count_the_bad_image(coco):
  tokenizer = LetterTokenizer(24)
  config = {"batch_size": 4, "image_size": 16, "data": _data(coco)}
  iterator = registry.make_train_iterator(
    config, tokenizer, seed=0, process_index=0, process_count=1
  )
  examples = registry.get("coco_grounded").open(
    registry.read_config(config)[2]
  )  # the same kept images, in the iterator's index order
  image_ids = [int(item[0].rsplit("/", 1)[-1].split(".")[0]) for item in examples.items]
  bad, drawn = 0, set()
  for _ in range(8):  # eight passes over the four kept images
    batch = next(iterator)
    assert batch["image"].shape == batch["box_image"].shape == (4, 16, 16, 3)
    bad += int(batch["input/bad_samples"].sum())
    for row in range(4):
      image_id = image_ids[int(batch["index"][row])]
      assert image_id != CORRUPT
      boxes, texts = IMAGES[image_id]
      assert any((batch["tokens"][row] == tokenizer.encode([t])[0]).all() for t in texts)
      # The crop lies inside the box, which is painted one flat colour
      # (PNG, lossless): bicubic resizing of a flat area is exact to +-1.
      pixels = batch["box_image"][row].reshape(-1, 3).astype(int)
      category = next(c for c in COLOUR if (np.abs(pixels - COLOUR[c]) <= 1).all())
      assert (category, 0) in {(c, crowd) for c, _, crowd in boxes}
      np.testing.assert_array_equal(batch["box_tokens"][row], tokenizer.encode([NAME[category]])[0])
      drawn.add((image_id, category))
  assert bad == 8  # the broken file, once a pass
  assert drawn == {(10, 1), (10, 3), (11, 5), (15, 3)}  # both boxes of image 10 drawn


def test_process_slices_and_resume_match_the_single_uninterrupted_stream(coco):
  config = {"batch_size": 4, "image_size": 16, "data": _data(coco)}
  make = lambda index, count: registry.make_train_iterator(
    config, LetterTokenizer(24), seed=2, process_index=index, process_count=count
  )
  single = make(0, 1)
  expected = [next(single) for _ in range(4)]
  halves = [make(i, 2) for i in range(2)]
  for want in expected[:2]:
    parts = [next(half) for half in halves]
    for key in want:
      np.testing.assert_array_equal(np.concatenate([p[key] for p in parts]), want[key], key)
  stopped = make(0, 1)
  next(stopped)
  resumed = make(0, 1)
  resumed.set_state(stopped.get_state())
  for want in expected[1:]:
    got = next(resumed)
    for key in want:
      np.testing.assert_array_equal(got[key], want[key], key)


def test_missing_captions_file_names_the_key(coco):
  data = dict(_data(coco), captions_path=str(coco / "nope.json"))
  config = {"batch_size": 4, "image_size": 16, "data": data}
  with pytest.raises(FileNotFoundError, match=r"input\.data\.captions_path: .*nope\.json"):
    registry.make_train_iterator(
      config, LetterTokenizer(24), seed=0, process_index=0, process_count=1
    )
