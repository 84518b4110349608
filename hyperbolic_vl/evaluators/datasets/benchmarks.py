"""Metadata of MERU's evaluation benchmarks: class names, prompts and splits.

The 20 zero-shot classification datasets of MERU's Table 2 (in its column
order) and the two retrieval sets of its Table 1. Splits and sizes follow
MERU's App. D Table 3, prompts its Table 4 ("our prompts" where MERU replaced
CLIP's). Class names are CLIP's curated names (see
``evaluators/assets/CLASSNAMES_LICENSE.txt``), stored in the label-index order of the
reader: a TFDS builder's ``ClassLabel`` order, or for the three datasets TFDS
has no builder for, the order of the dataset's own class list.

This module is pure metadata (Python and json only) so that configs and the
command line can list benchmarks without importing TensorFlow or JAX.

Known deviations and caveats:
  * MERU's own class-name lists follow CLIP's order, which swaps two labels of
    Food-101 ("cheesecake"/"cheese plate") and two of SUN397 ("jail cell"/"jail
    indoor") relative to the TFDS label numbering. Here the names follow the
    TFDS numbering, so every label gets its own name.
  * CLIP's ImageNet names contain two duplicates ("missile" at 657 and 744,
    "sunglasses" at 836 and 837); they are kept as published, as MERU does.
  * Table 3 does not list ImageNet: its sizes are ILSVRC-2012's (1,281,167
    train, 50,000 validation used as test) and it has no held-out validation
    split (MERU fits its linear probe on the full train split).
  * Table 3 says EuroSAT and RESISC45 splits are "randomly sampled": MERU takes
    consecutive slices of TFDS's single ``train`` split (whose order TFDS
    fixes), which is what these split strings do.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.resources
import json
from collections.abc import Callable, Mapping
from typing import Any

CLASSNAMES_ASSET = "classnames.json"


@dataclasses.dataclass(frozen=True)
class ZeroShotDataset:
  """One image classification benchmark.

  Attributes:
    name: key used in configs, on the command line and in result keys.
    title: the column title in MERU's tables.
    tfds_name: TFDS builder (with config) or None when TFDS has no builder;
      the dataset is then read from its release's files. Country211 and
      Rendered SST2 ship ``<split>/<class>/`` folders whose names (ISO 3166
      codes; negative/positive) sort by code point into ``classnames``
      order. FGVC Aircraft ships image lists
      (``data/images_variant_<split>.txt``: image id, variant name); its
      label is the variant's position in ``classnames``, which is the order
      of the release's ``data/variants.txt`` (names such as "F/A-18" cannot
      be folder names).
    test_split: split scored by zero-shot evaluation (Table 3 "Test").
    train_split: linear-probe training split, or None.
    val_split: linear-probe validation split (Table 3 "Val"), or None.
    split_sizes: (train, val, test) image counts from Table 3.
    classnames: one name per label index.
    prompts: templates with exactly one ``{}`` each, ensembled per class.
    image_key: feature holding the image.
    label_key: feature holding the class index (ignored with a transform).
    label_transform: key of ``LABEL_TRANSFORMS`` that computes the class index
      from the whole example, for datasets whose label is derived.
    manual_download: TFDS cannot download the source files itself; the user
      places them in TFDS's manual directory before ``tfds build``.
    classnames_source: where ``classnames`` come from (for reports).
  """

  name: str
  title: str
  tfds_name: str | None
  test_split: str
  train_split: str | None
  val_split: str | None
  split_sizes: tuple[int, int, int] | None
  classnames: tuple[str, ...]
  prompts: tuple[str, ...]
  image_key: str = "image"
  label_key: str = "label"
  label_transform: str | None = None
  manual_download: bool = False
  classnames_source: str = "clip"

  @property
  def num_classes(self) -> int:
    return len(self.classnames)


@dataclasses.dataclass(frozen=True)
class RetrievalDataset:
  """One image-text retrieval benchmark (MERU App. D.2).

  Attributes:
    name: key used in configs, on the command line and in result keys.
    title: the title in MERU's tables.
    tfds_name: TFDS builder or None when the set is read from a CSV with
      ``image, caption`` columns plus an image folder.
    split: TFDS split, or None for the CSV source.
    num_images: images in the evaluated set.
    num_captions: captions in the evaluated set (``captions_per_image`` per
      image: the few images with more captions keep their first ones).
    captions_per_image: captions kept per image.
    image_key: feature holding the image (TFDS source).
    caption_key: feature path of the caption strings, "/" separating nesting
      levels (TFDS source).
  """

  name: str
  title: str
  tfds_name: str | None
  split: str | None
  num_images: int
  num_captions: int
  captions_per_image: int = 5
  image_key: str = "image"
  caption_key: str = "captions/text"


# Prompt sets of MERU's Table 4, in the table's order.

# CLIP's 18 CIFAR templates, also used by MERU for CIFAR-10 and CIFAR-100.
CIFAR_PROMPTS = (
  "a photo of a {}.",
  "a blurry photo of a {}.",
  "a black and white photo of a {}.",
  "a low contrast photo of a {}.",
  "a high contrast photo of a {}.",
  "a bad photo of a {}.",
  "a good photo of a {}.",
  "a photo of a small {}.",
  "a photo of a big {}.",
  "a photo of the {}.",
  "a blurry photo of the {}.",
  "a black and white photo of the {}.",
  "a low contrast photo of the {}.",
  "a high contrast photo of the {}.",
  "a bad photo of the {}.",
  "a good photo of the {}.",
  "a photo of the small {}.",
  "a photo of the big {}.",
)

# "our prompts" prefix subreddit names, matching RedCaps captions.
PROMPTS: Mapping[str, tuple[str, ...]] = {
  "imagenet": (
    "i took a picture : itap of a {}.",
    "pics : a bad photo of the {}.",
    "pics : a origami {}.",
    "pics : a photo of the large {}.",
    "pics : a {} in a video game.",
    "pics : art of the {}.",
    "pics : a photo of the small {}.",
  ),
  "food101": ("food : {}.", "food porn : {}."),
  "cifar10": CIFAR_PROMPTS,
  "cifar100": CIFAR_PROMPTS,
  "cub": (
    "bird pics : {}.",
    "birding : {}.",
    "birds : {}.",
    "bird photography : {}.",
  ),
  "sun397": ("a photo of a {}.", "a photo of the {}."),
  "cars": (
    "a photo of a {}.",
    "a photo of the {}.",
    "a photo of my {}.",
    "i love my {}!",
    "a photo of my dirty {}.",
    "a photo of my clean {}.",
    "a photo of my new {}.",
    "a photo of my old {}.",
  ),
  "aircraft": (
    "a photo of a {}, a type of aircraft.",
    "a photo of the {}, a type of aircraft.",
  ),
  "dtd": (
    "pics : {} texture.",
    "pics : {} pattern.",
    "pics : {} thing.",
    "pics : this {} texture.",
    "pics : this {} pattern.",
    "pics : this {} thing.",
  ),
  "pets": ("a photo of a {}, a type of pet.",),
  "caltech101": (
    "a photo of a {}.",
    "a painting of a {}.",
    "a plastic {}.",
    "a sculpture of a {}.",
    "a sketch of a {}.",
    "a tattoo of a {}.",
    "a toy {}.",
    "a rendition of a {}.",
    "a embroidered {}.",
    "a cartoon {}.",
    "a {} in a video game.",
    "a plushie {}.",
    "a origami {}.",
    "art of a {}.",
    "graffiti of a {}.",
    "a drawing of a {}.",
    "a doodle of a {}.",
    "a photo of the {}.",
    "a painting of the {}.",
    "the plastic {}.",
    "a sculpture of the {}.",
    "a sketch of the {}.",
    "a tattoo of the {}.",
    "the toy {}.",
    "a rendition of the {}.",
    "the embroidered {}.",
    "the cartoon {}.",
    "the {} in a video game.",
    "the plushie {}.",
    "the origami {}.",
    "art of the {}.",
    "graffiti of the {}.",
    "a drawing of the {}.",
    "a doodle of the {}.",
  ),
  "flowers": ("flowers : {}.",),
  "stl10": ("a photo of a {}.", "a photo of the {}."),
  "eurosat": (
    "a centered satellite photo of {}.",
    "a centered satellite photo of a {}.",
    "a centered satellite photo of the {}.",
  ),
  "resisc45": (
    "satellite imagery of {}.",
    "aerial imagery of {}.",
    "satellite photo of {}.",
    "aerial photo of {}.",
    "satellite view of {}.",
    "aerial view of {}.",
    "satellite imagery of a {}.",
    "aerial imagery of a {}.",
    "satellite photo of a {}.",
    "aerial photo of a {}.",
    "satellite view of a {}.",
    "aerial view of a {}.",
    "satellite imagery of the {}.",
    "aerial imagery of the {}.",
    "satellite photo of the {}.",
    "aerial photo of the {}.",
    "satellite view of the {}.",
    "aerial view of the {}.",
  ),
  "country211": (
    "a photo i took in {}.",
    "a photo i took while visiting {}.",
    "a photo from my home country of {}.",
    "a photo from my visit to {}.",
    "a photo showing the country of {}.",
  ),
  "mnist": ('a photo of the number: "{}".',),
  "clevr_count": ("a photo of {} objects.",),
  "pcam": ("this is a photo of {}.",),
  "sst2": ("a {} review of a movie.",),
}

# Prompts for a TFDS dataset evaluated by name that is not one of the above.
DEFAULT_PROMPTS: tuple[str, ...] = ("a photo of a {}.",)

# CLEVR Counts (VTAB, CLIP) asks how many objects a scene holds; scenes have
# 3 to 10 objects. The class order puts 10 first, as CLIP's class list does,
# so class index i means CLEVR_COUNT_CLASSES[i] objects.
CLEVR_COUNT_CLASSES: tuple[int, ...] = (10, 3, 4, 5, 6, 7, 8, 9)


def clevr_count_label(example: Mapping[str, Any]) -> int:
  """Class index of a TFDS ``clevr`` example: its number of objects.

  ``example["objects"]`` is the decoded ``Sequence`` feature, a dict of
  per-object arrays that all have one entry per object.
  """
  objects = example["objects"]
  lengths = {len(values) for values in objects.values()}
  if len(lengths) != 1:
    raise ValueError(f"CLEVR objects fields disagree on the object count: {sorted(lengths)}")
  count = lengths.pop()
  if count not in CLEVR_COUNT_CLASSES:
    raise ValueError(
      f"CLEVR scene with {count} objects; CLEVR Counts classes are "
      f"{sorted(CLEVR_COUNT_CLASSES)} objects"
    )
  return CLEVR_COUNT_CLASSES.index(count)


LABEL_TRANSFORMS: dict[str, Callable[[Mapping[str, Any]], int]] = {
  "clevr_count": clevr_count_label,
}


@functools.cache
def load_classnames() -> dict[str, tuple[str, ...]]:
  """All class-name lists of the packaged asset, keyed by dataset name."""
  asset = importlib.resources.files("hyperbolic_vl.evaluators").joinpath("assets", CLASSNAMES_ASSET)
  lists = json.loads(asset.read_text(encoding="utf-8"))
  return {name: tuple(names) for name, names in lists.items()}


def _zero_shot(
  name: str,
  title: str,
  tfds_name: str | None,
  splits: tuple[str | None, str | None, str],
  split_sizes: tuple[int, int, int],
  **kwargs: Any,
) -> ZeroShotDataset:
  train_split, val_split, test_split = splits
  return ZeroShotDataset(
    name=name,
    title=title,
    tfds_name=tfds_name,
    test_split=test_split,
    train_split=train_split,
    val_split=val_split,
    split_sizes=split_sizes,
    classnames=load_classnames()[name],
    prompts=PROMPTS[name],
    **kwargs,
  )


# Splits are (train, val, test). Percent slices hold out Table 3's "Val" from
# TFDS's train split where the dataset has no validation split of its own;
# TFDS rounds slice boundaries to the nearest example, which gives exactly
# Table 3's counts (e.g. CUB: 80% of 5,994 -> 4,795 train, 1,199 val).
# TFDS has no builder for FGVC Aircraft, Country211 and Rendered SST2: they are
# read from image folders, and their split strings name the split folders of
# the official releases (Country211 and Rendered SST2 call validation
# "valid"; Aircraft's image lists are images_variant_{train,val,test}.txt).
_ZERO_SHOT_LIST = (
  _zero_shot(
    "imagenet",
    "ImageNet",
    "imagenet2012",
    ("train", None, "validation"),
    (1_281_167, 0, 50_000),
    manual_download=True,
  ),
  _zero_shot(
    "food101",
    "Food-101",
    "food101",
    ("train[:90%]", "train[90%:]", "validation"),
    (68175, 7575, 25250),
  ),
  _zero_shot(
    "cifar10",
    "CIFAR-10",
    "cifar10",
    ("train[:90%]", "train[90%:]", "test"),
    (45000, 5000, 10000),
  ),
  _zero_shot(
    "cifar100",
    "CIFAR-100",
    "cifar100",
    ("train[:90%]", "train[90%:]", "test"),
    (45000, 5000, 10000),
  ),
  _zero_shot(
    "cub",
    "CUB",
    "caltech_birds2011",
    ("train[:80%]", "train[80%:]", "test"),
    (4795, 1199, 5794),
    classnames_source="cub_classes_txt",
  ),
  _zero_shot(
    "sun397",
    "SUN397",
    # Official partition 1; TFDS drops one unreadable test image (19,849).
    "sun397/standard-part1-120k",
    ("train[:80%]", "train[80%:]", "test"),
    (15880, 3970, 19849),
  ),
  _zero_shot(
    "cars",
    "Cars",
    "cars196",
    ("train[:80%]", "train[80%:]", "test"),
    (6515, 1629, 8041),
  ),
  _zero_shot(
    "aircraft",
    "Aircraft",
    None,
    ("train", "val", "test"),
    (3334, 3333, 3333),
  ),
  _zero_shot(
    "dtd",
    "DTD",
    "dtd",
    ("train", "validation", "test"),
    (1880, 1880, 1880),
  ),
  _zero_shot(
    "pets",
    "Pets",
    "oxford_iiit_pet",
    ("train[:80%]", "train[80%:]", "test"),
    (2944, 736, 3669),
  ),
  _zero_shot(
    "caltech101",
    "Caltech-101",
    "caltech101",
    ("train[:80%]", "train[80%:]", "test"),
    (2448, 612, 6084),
  ),
  _zero_shot(
    "flowers",
    "Flowers",
    "oxford_flowers102",
    ("train", "validation", "test"),
    (1020, 1020, 6149),
  ),
  _zero_shot(
    "stl10",
    "STL-10",
    "stl10",
    ("train[:80%]", "train[80%:]", "test"),
    (4000, 1000, 8000),
  ),
  _zero_shot(
    "eurosat",
    "EuroSAT",
    "eurosat/rgb",
    ("train[:5000]", "train[5000:10000]", "train[10000:15000]"),
    (5000, 5000, 5000),
  ),
  _zero_shot(
    "resisc45",
    "RESISC45",
    "resisc45",
    ("train[:10%]", "train[10%:20%]", "train[20%:]"),
    (3150, 3150, 25200),
    manual_download=True,
  ),
  _zero_shot(
    "country211",
    "Country211",
    None,
    ("train", "valid", "test"),
    (31650, 10550, 21100),
  ),
  _zero_shot(
    "mnist",
    "MNIST",
    "mnist",
    ("train[:80%]", "train[80%:]", "test"),
    (48000, 12000, 10000),
  ),
  _zero_shot(
    "clevr_count",
    "CLEVR",
    # TFDS's CLEVR test split has no scene annotations, so its labelled
    # validation split provides the test images.
    "clevr",
    ("train[:4500]", "train[4500:5000]", "validation[:5000]"),
    (4500, 500, 5000),
    label_transform="clevr_count",
  ),
  _zero_shot(
    "pcam",
    "PCAM",
    "patch_camelyon",
    ("train", "validation", "test"),
    (262144, 32768, 32768),
  ),
  _zero_shot(
    "sst2",
    "SST2",
    None,
    ("train", "valid", "test"),
    (6920, 872, 1821),
  ),
)

ZERO_SHOT: dict[str, ZeroShotDataset] = {d.name: d for d in _ZERO_SHOT_LIST}

MERU_ZERO_SHOT_SUITE: tuple[str, ...] = tuple(ZERO_SHOT)

RETRIEVAL: dict[str, RetrievalDataset] = {
  # MERU scores COCO val2017 (5,000 images). TFDS's only caption builder,
  # coco_captions (config 2014), provides Karpathy's 5,000-image test split
  # instead, drawn from val2014: the common COCO retrieval benchmark, same
  # size, different images. For val2017 itself, use the CSV source.
  "coco": RetrievalDataset(
    name="coco",
    title="COCO",
    tfds_name="coco_captions",
    split="test",
    num_images=5000,
    num_captions=25000,
  ),
  # Karpathy's Flickr30K test split; TFDS has no Flickr30K builder.
  "flickr30k": RetrievalDataset(
    name="flickr30k",
    title="Flickr30K",
    tfds_name=None,
    split=None,
    num_images=1000,
    num_captions=5000,
  ),
}


def zero_shot_dataset(name: str) -> ZeroShotDataset:
  """The zero-shot benchmark ``name``; KeyError listing the valid names."""
  try:
    return ZERO_SHOT[name]
  except KeyError:
    raise KeyError(
      f"unknown zero-shot dataset {name!r}; valid names: {', '.join(ZERO_SHOT)}"
    ) from None


def retrieval_dataset(name: str) -> RetrievalDataset:
  """The retrieval benchmark ``name``; KeyError listing the valid names."""
  try:
    return RETRIEVAL[name]
  except KeyError:
    raise KeyError(
      f"unknown retrieval dataset {name!r}; valid names: {', '.join(RETRIEVAL)}"
    ) from None
