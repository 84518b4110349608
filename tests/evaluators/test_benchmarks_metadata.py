"""Benchmark metadata against MERU's tables (App. D Tables 3 and 4)."""

import fnmatch
import importlib.resources
import json
import pathlib
import re
import tomllib

import numpy as np
import pytest

from hyperbolic_vl.evaluators.datasets import benchmarks

# MERU Table 2's columns, in order, with our keys.
PAPER_ORDER = (
  "imagenet",
  "food101",
  "cifar10",
  "cifar100",
  "cub",
  "sun397",
  "cars",
  "aircraft",
  "dtd",
  "pets",
  "caltech101",
  "flowers",
  "stl10",
  "eurosat",
  "resisc45",
  "country211",
  "mnist",
  "clevr_count",
  "pcam",
  "sst2",
)

# MERU Table 3 (Classes, Train, Val, Test), transcribed from the paper.
# ImageNet is not in Table 3: 1000 classes, ILSVRC-2012 train and its
# 50,000-image validation set as test, no held-out validation split.
TABLE_3 = {
  "imagenet": (1000, 1281167, 0, 50000),
  "food101": (101, 68175, 7575, 25250),
  "cifar10": (10, 45000, 5000, 10000),
  "cifar100": (100, 45000, 5000, 10000),
  "cub": (200, 4795, 1199, 5794),
  "sun397": (397, 15880, 3970, 19849),
  "cars": (196, 6515, 1629, 8041),
  "aircraft": (100, 3334, 3333, 3333),
  "dtd": (47, 1880, 1880, 1880),
  "pets": (37, 2944, 736, 3669),
  "caltech101": (102, 2448, 612, 6084),
  "flowers": (102, 1020, 1020, 6149),
  "stl10": (10, 4000, 1000, 8000),
  "eurosat": (10, 5000, 5000, 5000),
  "resisc45": (45, 3150, 3150, 25200),
  "country211": (211, 31650, 10550, 21100),
  "mnist": (10, 48000, 12000, 10000),
  "clevr_count": (8, 4500, 500, 5000),
  "pcam": (2, 262144, 32768, 32768),
  "sst2": (2, 6920, 872, 1821),
}

# Number of prompts per dataset in MERU Table 4.
TABLE_4_PROMPT_COUNTS = {
  "imagenet": 7,
  "food101": 2,
  "cifar10": 18,
  "cifar100": 18,
  "cub": 4,
  "sun397": 2,
  "cars": 8,
  "aircraft": 2,
  "dtd": 6,
  "pets": 1,
  "caltech101": 34,
  "flowers": 1,
  "stl10": 2,
  "eurosat": 3,
  "resisc45": 18,
  "country211": 5,
  "mnist": 1,
  "clevr_count": 1,
  "pcam": 1,
  "sst2": 1,
}

# A few prompts quoted from Table 4, to catch a set attached to the wrong
# dataset (the counts alone cannot tell CIFAR's 18 from RESISC's 18).
TABLE_4_SAMPLES = {
  "imagenet": "i took a picture : itap of a {}.",
  "food101": "food porn : {}.",
  "cifar100": "a black and white photo of the {}.",
  "cub": "bird photography : {}.",
  "cars": "i love my {}!",
  "aircraft": "a photo of the {}, a type of aircraft.",
  "dtd": "pics : this {} thing.",
  "pets": "a photo of a {}, a type of pet.",
  "caltech101": "the plushie {}.",
  "flowers": "flowers : {}.",
  "eurosat": "a centered satellite photo of the {}.",
  "resisc45": "aerial view of the {}.",
  "country211": "a photo from my home country of {}.",
  "mnist": 'a photo of the number: "{}".',
  "clevr_count": "a photo of {} objects.",
  "pcam": "this is a photo of {}.",
  "sst2": "a {} review of a movie.",
}

# CLIP's ImageNet names repeat two names for distinct synsets (missile /
# projectile-missile, sunglass / sunglasses); MERU keeps them too.
IMAGENET_DUPLICATES = {"missile": (657, 744), "sunglasses": (836, 837)}


def test_suite_is_the_papers_twenty_datasets_in_table_order():
  assert benchmarks.MERU_ZERO_SHOT_SUITE == PAPER_ORDER
  assert tuple(benchmarks.ZERO_SHOT) == PAPER_ORDER
  assert set(TABLE_3) == set(TABLE_4_PROMPT_COUNTS) == set(PAPER_ORDER)


@pytest.mark.parametrize("name", PAPER_ORDER)
def test_class_count_and_split_sizes_match_table_3(name):
  dataset = benchmarks.zero_shot_dataset(name)
  num_classes, train, val, test = TABLE_3[name]
  assert dataset.name == name
  assert len(dataset.classnames) == num_classes == dataset.num_classes
  assert dataset.split_sizes == (train, val, test)
  assert dataset.test_split
  # A held-out validation split exists exactly when Table 3 lists one.
  assert (dataset.val_split is not None) == (val > 0)
  assert dataset.train_split is not None


@pytest.mark.parametrize("name", PAPER_ORDER)
def test_prompts_match_table_4(name):
  prompts = benchmarks.zero_shot_dataset(name).prompts
  assert len(prompts) == TABLE_4_PROMPT_COUNTS[name]
  assert len(set(prompts)) == len(prompts)
  for prompt in prompts:
    assert prompt.count("{}") == 1, prompt
    assert prompt.format("x") != prompt
  if name in TABLE_4_SAMPLES:
    assert TABLE_4_SAMPLES[name] in prompts


@pytest.mark.parametrize("name", PAPER_ORDER)
def test_class_names_are_unique_nonempty_strings(name):
  names = benchmarks.zero_shot_dataset(name).classnames
  assert all(isinstance(n, str) and n.strip() == n and n for n in names)
  positions = {}
  for index, class_name in enumerate(names):
    positions.setdefault(class_name, []).append(index)
  repeated = {n: tuple(p) for n, p in positions.items() if len(p) > 1}
  assert repeated == (IMAGENET_DUPLICATES if name == "imagenet" else {})


def _slice_bounds(split, total):
  """[start, stop) of a TFDS slice like "train[:90%]" or "train[5000:10000]"."""
  match = re.fullmatch(r"\w+\[(\d*)(%?):(\d*)(%?)\]", split)
  assert match, split
  start, start_pct, stop, stop_pct = match.groups()

  def boundary(value, is_pct, default):
    if not value:
      return default
    # TFDS rounds percent boundaries to the closest example.
    return round(total * int(value) / 100) if is_pct else int(value)

  return boundary(start, start_pct, 0), boundary(stop, stop_pct, total)


# Sizes of the TFDS train splits that the percent/index slices cut, as TFDS
# reports them for these builders.
TFDS_TRAIN_SIZES = {
  "food101": 75750,
  "cifar10": 50000,
  "cifar100": 50000,
  "cub": 5994,
  "sun397": 19850,
  "cars": 8144,
  "pets": 3680,
  "caltech101": 3060,
  "stl10": 5000,
  "eurosat": 27000,
  "resisc45": 31500,
  "mnist": 60000,
  "clevr_count": 70000,
}


@pytest.mark.parametrize("name", sorted(TFDS_TRAIN_SIZES))
def test_sliced_splits_have_table_3_sizes_and_do_not_overlap(name):
  dataset = benchmarks.zero_shot_dataset(name)
  total = TFDS_TRAIN_SIZES[name]
  splits = (dataset.train_split, dataset.val_split, dataset.test_split)
  covered = np.zeros(total, dtype=np.int64)
  for split, size in zip(splits, dataset.split_sizes):
    if not split.startswith("train["):
      continue  # an official split of its own (test, validation)
    start, stop = _slice_bounds(split, total)
    assert stop - start == size, split
    covered[start:stop] += 1
  assert covered.max() == 1


def test_retrieval_sets():
  coco = benchmarks.retrieval_dataset("coco")
  flickr = benchmarks.retrieval_dataset("flickr30k")
  assert (coco.num_images, coco.num_captions) == (5000, 25000)
  assert (flickr.num_images, flickr.num_captions) == (1000, 5000)
  for dataset in (coco, flickr):
    assert dataset.num_captions == dataset.num_images * dataset.captions_per_image
  assert coco.tfds_name == "coco_captions" and coco.split == "test"
  assert flickr.tfds_name is None
  assert tuple(benchmarks.RETRIEVAL) == ("coco", "flickr30k")


def test_unknown_names_list_the_valid_ones():
  with pytest.raises(KeyError, match="food101.*sst2"):
    benchmarks.zero_shot_dataset("food-101")
  with pytest.raises(KeyError, match="coco, flickr30k"):
    benchmarks.retrieval_dataset("flickr8k")


def test_default_prompts_have_one_slot():
  assert benchmarks.DEFAULT_PROMPTS
  assert all(p.count("{}") == 1 for p in benchmarks.DEFAULT_PROMPTS)


def _clevr_example(num_objects):
  # The decoded TFDS clevr "objects" Sequence: one entry per object per field.
  rng = np.random.default_rng(num_objects)
  return {
    "image": np.zeros((4, 4, 3), np.uint8),
    "objects": {
      "color": rng.integers(0, 8, num_objects),
      "shape": rng.integers(0, 3, num_objects),
      "3d_coords": rng.normal(size=(num_objects, 3)).astype(np.float32),
    },
  }


@pytest.mark.parametrize("num_objects", range(3, 11))
def test_clevr_count_label_names_the_object_count(num_objects):
  dataset = benchmarks.zero_shot_dataset("clevr_count")
  transform = benchmarks.LABEL_TRANSFORMS[dataset.label_transform]
  label = transform(_clevr_example(num_objects))
  # The class name of the label is the object count written out.
  assert dataset.classnames[label] == str(num_objects)


@pytest.mark.parametrize("num_objects", [0, 2, 11])
def test_clevr_count_rejects_counts_outside_the_classes(num_objects):
  with pytest.raises(ValueError, match="objects"):
    benchmarks.clevr_count_label(_clevr_example(num_objects))


def test_only_clevr_derives_its_label():
  transforms = {
    d.name: d.label_transform for d in benchmarks.ZERO_SHOT.values() if d.label_transform
  }
  assert transforms == {"clevr_count": "clevr_count"}
  assert set(benchmarks.LABEL_TRANSFORMS) == {"clevr_count"}


def test_classnames_asset_is_package_data():
  asset = importlib.resources.files("hyperbolic_vl.evaluators").joinpath(
    "assets", benchmarks.CLASSNAMES_ASSET
  )
  lists = json.loads(asset.read_text(encoding="utf-8"))
  assert set(lists) == set(PAPER_ORDER)
  for name in PAPER_ORDER:
    assert tuple(lists[name]) == benchmarks.ZERO_SHOT[name].classnames
  license_file = asset.parent / "CLASSNAMES_LICENSE.txt"
  assert "MIT License" in license_file.read_text(encoding="utf-8")
  # The wheel carries the asset: pyproject's package-data globs match it.
  root = pathlib.Path(benchmarks.__file__).resolve().parents[3]
  pyproject = tomllib.loads((root / "pyproject.toml").read_text())
  globs = pyproject["tool"]["setuptools"]["package-data"]["hyperbolic_vl"]
  for file_name in (benchmarks.CLASSNAMES_ASSET, "CLASSNAMES_LICENSE.txt"):
    path = f"evaluators/assets/{file_name}"
    assert any(fnmatch.fnmatch(path, g) for g in globs), path


# TFDS's own label names (available without downloading for these builders)
# normalised to letters and digits; our names must name the same label index.
def _normalise(name):
  return re.sub(r"[^a-z0-9]", "", name.lower())


# Where CLIP's curated name differs from TFDS's label name (renames, plurals),
# a spot check of label index -> (TFDS name, our name) pins the order.
RENAMED_SPOT_CHECKS = {
  "caltech101": {
    1: ("airplanes", "airplane"),
    4: ("background_google", "background"),
    16: ("car_side", "side of a car"),
    37: ("faces", "off-center face"),
    38: ("faces_easy", "centered face"),
    57: ("leopards", "leopard"),
    66: ("motorbikes", "motorbike"),
    101: ("yin_yang", "yin and yang symbol"),
  },
  "eurosat": {
    0: ("AnnualCrop", "annual crop land"),
    2: ("HerbaceousVegetation", "brushland or shrubland"),
    9: ("SeaLake", "lake or sea"),
  },
  "flowers": {
    59: ("pink-yellow dahlia?", "pink and yellow dahlia"),
    92: ("ball moss", "air plant"),
  },
}


@pytest.mark.parametrize(
  "name",
  [n for n, d in benchmarks.ZERO_SHOT.items() if d.tfds_name],
)
def test_tfds_builders_have_the_papers_classes(name, tmp_path):
  tfds = pytest.importorskip("tensorflow_datasets")
  dataset = benchmarks.zero_shot_dataset(name)
  builder = tfds.builder(dataset.tfds_name, data_dir=str(tmp_path))
  features = builder.info.features
  assert dataset.image_key in features
  if dataset.label_transform:
    assert "objects" in features
    return
  label = features[dataset.label_key]
  assert label.num_classes == dataset.num_classes
  tfds_names = list(label.names)
  if tfds_names[0] == "0" and name not in ("mnist",):
    return  # label names are only filled in when the data is prepared
  if name == "sun397":
    tfds_names = [n[len("/a/") :] for n in tfds_names]  # "/a/abbey" -> "abbey"
  renamed = RENAMED_SPOT_CHECKS.get(name, {})
  for index, (tfds_name, ours) in renamed.items():
    assert (tfds_names[index], dataset.classnames[index]) == (tfds_name, ours)
  if name in ("caltech101", "eurosat", "imagenet"):
    return  # CLIP renames most of these (ImageNet's TFDS names are synsets)
  mismatched = [
    (i, t, o)
    for i, (t, o) in enumerate(zip(tfds_names, dataset.classnames))
    if _normalise(t) != _normalise(o) and i not in renamed
  ]
  assert mismatched == []
