"""SugarCrepe, VL-Checklist and multi-label mAP on small files in each
benchmark's published layout, built here, through a stand-in predictor whose
scores are known (stub_predictors.py): figures equal the hand computations
written beside each case."""

import json
import os

import ml_collections
import numpy as np
import pytest
from PIL import Image
from stub_predictors import ColourPredictor

from hyperbolic_vl.evaluators import EvaluatorUnavailable, registry
from hyperbolic_vl.evaluators import multilabel as multilabel_module

SOLID = {"red": (230, 20, 20), "green": (20, 230, 20), "blue": (20, 20, 230)}


def save_solid(path, colour, size=(12, 10)):
  os.makedirs(os.path.dirname(path), exist_ok=True)
  pixels = np.broadcast_to(np.asarray(colour, np.uint8), (size[1], size[0], 3))
  Image.fromarray(np.ascontiguousarray(pixels)).save(path, quality=100)


def run_input(image_size=8):
  """The `config.input` an evaluator is built from."""
  return ml_collections.ConfigDict({"image_size": image_size, "data": {}})


def build(type_name, **settings):
  return registry.get(type_name).build(
    type_name, registry.entry(type_name, **settings), run_input()
  )


# -- SugarCrepe -------------------------------------------------------------------
def write_sugarcrepe(root):
  """data/ with the seven files and a val2017 folder of three images."""
  images = root / "val2017"
  for index, colour in enumerate(SOLID):
    save_solid(str(images / f"00000000000{index}.jpg"), SOLID[colour])
  items = {
    # red image: "red" 1 > "green" 0, correct; green image: "red" 0 < "green" 1, wrong.
    "add_obj": {
      "0": {
        "filename": "000000000000.jpg",
        "caption": "a red cup",
        "negative_caption": "a green cup",
      },
      "1": {
        "filename": "000000000001.jpg",
        "caption": "a red cup",
        "negative_caption": "a green cup",
      },
      "2": {"filename": "000000000001.jpg", "caption": "a cup"},  # malformed: skipped
    },
    # blue image, both captions name blue: a tie, counted wrong.
    "swap_att": {
      "0": {"filename": "000000000002.jpg", "caption": "blue", "negative_caption": "a blue cup"}
    },
    # its image is absent: skipped, and the category has no figure.
    "replace_rel": {
      "0": {"filename": "000000000009.jpg", "caption": "red", "negative_caption": "blue"}
    },
  }
  data = root / "data"
  os.makedirs(data)
  for category in (
    "add_obj",
    "add_att",
    "replace_obj",
    "replace_att",
    "replace_rel",
    "swap_obj",
    "swap_att",
  ):
    (data / f"{category}.json").write_text(json.dumps(items.get(category, {})))
  return data, images


@pytest.mark.parametrize("resize", ["squeeze", "crop"])
def test_sugarcrepe_hand_computed(tmp_path, resize, capsys):
  data, images = write_sugarcrepe(tmp_path)
  evaluator = build(
    "sugarcrepe", path=str(data), image_root=str(images), resize=resize, batch_size=2
  )
  # The skipped items, by reason, in one line.
  assert capsys.readouterr().out == (
    "sugarcrepe: skipped 2 item(s): 1 item(s) lack the text fields filename, caption, "
    "negative_caption (add_obj.json item '2' has ['caption', 'filename']); "
    f"1 item(s) have no image in {images}\n"
  )
  figures = evaluator(ColourPredictor())
  assert figures == {
    "sugarcrepe/add_obj": 0.5,
    "sugarcrepe/swap_att": 0.0,
    "sugarcrepe/overall": 1 / 3,  # 1 correct of 3 items
    "sugarcrepe/skipped": 2.0,
  }


def test_sugarcrepe_names_the_layout_when_the_path_is_wrong(tmp_path):
  with pytest.raises(EvaluatorUnavailable, match="add_obj.json, add_att.json"):
    build("sugarcrepe", path=str(tmp_path / "nowhere"), image_root=str(tmp_path))
  os.makedirs(tmp_path / "data")
  with pytest.raises(EvaluatorUnavailable, match="lacks add_obj.json"):
    build("sugarcrepe", path=str(tmp_path / "data"), image_root=str(tmp_path))


# -- VL-Checklist -----------------------------------------------------------------
def write_vl_checklist(root):
  """A checkout with two Object/Size types of corpus vg_obj, images under vg/."""
  samples = {
    "large": [
      ["VG_100K/1.jpg", {"POS": ["red"], "NEG": ["green"]}],  # correct
      ["VG_100K/2.jpg", {"POS": ["red"], "NEG": ["green"]}],  # green image: wrong
      ["VG_100K/9.jpg", {"POS": ["red"], "NEG": ["green"]}],  # no image: skipped
      ["VG_100K/3.jpg", {"POS": ["blue"], "NEG": ["red"]}],  # correct
    ],
    "small": [
      ["VG_100K/3.jpg", {"POS": ["blue"], "NEG": ["green"]}],  # correct
      ["VG_100K/1.jpg", {"POS": [], "NEG": ["green"]}],  # malformed: skipped
    ],
  }
  for index, colour in enumerate(SOLID, start=1):
    save_solid(str(root / "images" / "vg" / "VG_100K" / f"{index}.jpg"), SOLID[colour])
  for size, rows in samples.items():
    corpus = root / "corpus" / "v1" / "Object" / "Size" / size
    os.makedirs(corpus)
    anno = f"data/Object/Size/vg_size/vg_obj_{size}.json"
    (corpus / "vg_obj.yaml").write_text(
      f'ANNO_PATH: "{anno}"\nIMG_ROOT: "vg/"\nTYPE: "TUPLE_JSON"\n'
    )
    os.makedirs(root / os.path.dirname(anno), exist_ok=True)
    (root / anno).write_text(json.dumps(rows))
  return root


@pytest.mark.parametrize("normalization", ["release", "project"])
def test_vl_checklist_hand_computed(tmp_path, normalization, capsys):
  root = write_vl_checklist(tmp_path)
  types = ("Object/Size/large", "Object/Size/small")
  evaluator = build(
    "vl_checklist",
    path=str(root),
    image_root=str(root / "images"),
    types=types,
    normalization=normalization,
  )
  printed = capsys.readouterr().out
  assert printed.startswith("vl_checklist: skipped 2 sample(s): 1 sample(s) are not [image, ")
  assert "(vg_obj_small.json sample 1 is ['VG_100K/1.jpg', {'POS': [], 'NEG': ['green']}]); " in (
    printed
  )
  assert printed.endswith(
    f"1 sample(s) have no image in the IMG_ROOT folders under {root / 'images'}\n"
  )
  predictor = ColourPredictor()
  figures = evaluator(predictor)
  # large: 2 correct of 3 kept; small: 1 of 1; the group: mean of the two.
  assert figures == pytest.approx(
    {
      "vl_checklist/Object/Size/large/vg_obj": 2 / 3,
      "vl_checklist/Object/Size/small/vg_obj": 1.0,
      "vl_checklist/Object/Size": (2 / 3 + 1) / 2,
      "vl_checklist/skipped": 2.0,
    },
    abs=1e-15,
  )
  low = min(r[0] for r in predictor.pixel_ranges)
  # The release's Normalize(0.5, 0.5) maps the dark channels (~20/255) below 0.
  assert (low < -0.5) if normalization == "release" else (low >= 0)
  # max_num=2: the itc task keeps the first max_num / 2 = 1 sample of each corpus.
  first_only = build(
    "vl_checklist", path=str(root), image_root=str(root / "images"), types=types, max_num=2
  )(ColourPredictor())
  assert first_only["vl_checklist/Object/Size/large/vg_obj"] == 1.0


def test_vl_checklist_names_the_layout_when_the_path_is_wrong(tmp_path):
  with pytest.raises(EvaluatorUnavailable, match="corpus/v1/<type>/<corpus>.yaml"):
    build("vl_checklist", path=str(tmp_path))


# -- multi-label mAP ----------------------------------------------------------------
# Image colours with distinct off-axis components, so no two scores tie:
# unit mean colours ~ (.894, .447, 0), (0, .894, .447), (.447, 0, .894).
MULTI = {"000001": (200, 100, 0), "000002": (0, 200, 100), "000003": (100, 0, 200)}
CLASS_AXES = {"aeroplane": 0, "bicycle": 1, "bird": 2}


def write_voc(root):
  for image_id, colour in MULTI.items():
    save_solid(str(root / "JPEGImages" / f"{image_id}.jpg"), colour)
  marks = {
    "aeroplane": {"000001": 0, "000002": 1, "000003": -1},  # image 1 difficult
    "bicycle": {"000001": 1, "000002": -1, "000003": 1},
    "bird": {"000001": -1, "000002": -1, "000003": 1},
  }
  main = root / "ImageSets" / "Main"
  os.makedirs(main)
  for name in multilabel_module.VOC_CLASSES:
    rows = marks.get(name, dict.fromkeys(MULTI, -1))
    (main / f"{name}_test.txt").write_text("".join(f"{i} {m:2d}\n" for i, m in rows.items()))


def test_voc2007_map_hand_computed(tmp_path):
  write_voc(tmp_path)
  # aeroplane (axis 0), difficult image 1 left out: image 3 (.447, -) then
  #   image 2 (0, +): AP 1/2.
  # bicycle (axis 1): image 2 (.894, -), image 1 (.447, +), image 3 (0, +):
  #   precisions 1/2, 2/3 -> AP 7/12.
  # bird (axis 2): image 3 first and the only positive: AP 1.
  # The other 17 classes have no positive and are left out.
  evaluator = build("multilabel", dataset="voc2007", path=str(tmp_path))
  figures = evaluator(ColourPredictor(CLASS_AXES))
  assert figures["multilabel/voc2007/map"] == pytest.approx((1 / 2 + 7 / 12 + 1) / 3, abs=1e-12)
  # 11-point: aeroplane 1/2 at every level, bicycle 2/3 at every level, bird 1.
  eleven = build("multilabel", dataset="voc2007", path=str(tmp_path), ap="voc07")
  assert eleven(ColourPredictor(CLASS_AXES))["multilabel/voc2007/map"] == pytest.approx(
    (1 / 2 + 2 / 3 + 1) / 3, abs=1e-12
  )


def test_coco_map_hand_computed(tmp_path):
  for image_id, colour in MULTI.items():
    save_solid(str(tmp_path / "val2014" / f"{image_id}.jpg"), colour)
  annotations = {
    "images": [{"id": int(i), "file_name": f"{i}.jpg"} for i in MULTI]
    + [{"id": 4, "file_name": "000004.jpg"}],  # no box (and no file): skipped
    "categories": [
      {"id": 5, "name": "bird"},
      {"id": 1, "name": "aeroplane"},
      {"id": 2, "name": "bicycle"},
    ],
    "annotations": [
      {"image_id": 1, "category_id": 2},
      {"image_id": 2, "category_id": 1},
      {"image_id": 3, "category_id": 2},
      {"image_id": 3, "category_id": 5},
      {"image_id": 3, "category_id": 5},
    ],
  }
  path = tmp_path / "instances_val2014.json"
  path.write_text(json.dumps(annotations))
  evaluator = build(
    "multilabel", dataset="coco", path=str(path), image_root=str(tmp_path / "val2014")
  )
  assert evaluator.classnames == ("aeroplane", "bicycle", "bird")  # by category id
  figures = evaluator(ColourPredictor(CLASS_AXES))
  # aeroplane: image 1 (.894, -), image 3 (.447, -), image 2 (0, +): AP 1/3.
  # bicycle: as VOC's, 7/12. bird: image 3 first: 1.
  assert figures["multilabel/coco/map"] == pytest.approx((1 / 3 + 7 / 12 + 1) / 3, abs=1e-12)
  assert figures["multilabel/coco/skipped"] == 1.0


def test_multilabel_names_the_layout_when_the_path_is_wrong(tmp_path):
  with pytest.raises(EvaluatorUnavailable, match="ImageSets/Main/<class>_<split>.txt"):
    build("multilabel", dataset="voc2007", path=str(tmp_path))
  with pytest.raises(EvaluatorUnavailable, match="instances_<split>.json"):
    build("multilabel", dataset="coco", path=str(tmp_path / "x.json"), image_root=str(tmp_path))
