"""Evaluator type "multilabel": zero-shot multi-label classification mAP on
PASCAL VOC 2007 or COCO, as UNCHA's table reports it.

UNCHA released no code for this figure (its evaluation has class names for
"voc" and "mscoco" and nothing else), so it is defined here from the
standard benchmarks: each image is scored against every class's zero-shot
classifier (`predictor.class_embeddings`, the objective's prompt ensembling,
then `predictor.similarity`); per class, the average precision of those
scores over the test images; mAP is the mean over classes.

  dataset=voc2007  path = the VOC2007 folder (VOCdevkit/VOC2007) with
                   ImageSets/Main/<class>_<split>.txt (image id, 1 / -1 / 0
                   for difficult) and JPEGImages/; difficult images are left
                   out of their class's ranking, as the devkit does. A
                   malformed line, an empty class file or class files that
                   list different images are refused in one line (an
                   unread mark is no "negative"); images absent from
                   JPEGImages/ are skipped and counted
  dataset=coco     path = an instances_<split>.json (COCO's annotations),
                   image_root = its image folder; an image's classes are
                   the categories of its boxes; images without a box are
                   skipped and counted (a file with no box at all is
                   refused: it is not an instances file)

ap="standard" (default): the non-interpolated AP (the precision at each
positive's score, ties grouped), what COCO multi-label work reports;
ap="voc07": the VOC 2007 devkit's 11-point interpolated AP.

Figures: multilabel/<dataset>/map, multilabel/<dataset>/skipped.
Images: centre square then resize (this project's classification
transform, MERU's and UNCHA's zero-shot one); resize="squeeze" squashes.
"""

from __future__ import annotations

import json
import os

import numpy as np

from hyperbolic_vl.evaluators import EvaluatorUnavailable, registry
from hyperbolic_vl.evaluators.datasets import images
from hyperbolic_vl.evaluators.metrics import ranked_labels

VOC_CLASSES = (
  "aeroplane",
  "bicycle",
  "bird",
  "boat",
  "bottle",
  "bus",
  "car",
  "cat",
  "chair",
  "cow",
  "diningtable",
  "dog",
  "horse",
  "motorbike",
  "person",
  "pottedplant",
  "sheep",
  "sofa",
  "train",
  "tvmonitor",
)
# The devkit's file names run words together; prompts read better spelt out.
VOC_PROMPT_NAMES = {
  "diningtable": "dining table",
  "pottedplant": "potted plant",
  "tvmonitor": "tv monitor",
}
VOC_LAYOUT = "VOC2007 folder with ImageSets/Main/<class>_<split>.txt and JPEGImages/"
COCO_LAYOUT = "COCO annotations/instances_<split>.json with image_root = its image folder"
SETTINGS = dict(
  dataset="voc2007",
  path="",
  image_root="",
  split="test",
  prompts=("a photo of a {}.",),
  classnames=(),
  ap="standard",
  resize="crop",
  image_size=0,
  num_examples=None,
)


def read_voc(root: str, split: str):
  """(image paths, labels (N, C) bool, difficult (N, C) bool, classnames, skipped)."""
  main = os.path.join(root, "ImageSets", "Main")
  files = [os.path.join(main, f"{c}_{split}.txt") for c in VOC_CLASSES]
  absent = [f for f in files if not os.path.isfile(f)]
  if absent:
    raise EvaluatorUnavailable(f"multilabel voc2007: {absent[0]} is absent; expected {VOC_LAYOUT}")
  marks: dict[str, np.ndarray] = {}
  first_ids = None
  for column, path in enumerate(files):
    ids = read_voc_class_file(path, split)
    if first_ids is None:
      first_ids = set(ids)
    elif set(ids) != first_ids:  # a mark left out would count as "negative"
      odd = sorted(set(ids) ^ first_ids)
      raise EvaluatorUnavailable(
        f"multilabel voc2007: {path} lists other images than {files[0]} "
        f"({len(odd)} differ, e.g. {odd[0]}); expected every class file to list the "
        f"{split} images"
      )
    for image_id, mark in ids.items():
      marks.setdefault(image_id, np.full(len(VOC_CLASSES), -1, np.int8))[column] = mark
  ids = sorted(marks)
  paths = [os.path.join(root, "JPEGImages", f"{i}.jpg") for i in ids]
  present = [os.path.isfile(p) for p in paths]
  table = np.stack([marks[i] for i in ids]) if ids else np.zeros((0, len(VOC_CLASSES)))
  table = table[present]
  names = [VOC_PROMPT_NAMES.get(c, c) for c in VOC_CLASSES]
  kept_paths = [p for p, ok in zip(paths, present) if ok]
  return kept_paths, table == 1, table == 0, names, len(ids) - len(kept_paths)


def read_voc_class_file(path: str, split: str) -> dict[str, int]:
  """{image id: 1, -1 or 0} of one ImageSets/Main/<class>_<split>.txt; a
  malformed line or an empty file is refused (one line naming it): a mark
  that cannot be read is no "negative"."""
  marks = {}
  with open(path, encoding="utf-8") as f:
    for number, line in enumerate(f, start=1):
      parts = line.split()
      if not parts:
        continue
      if len(parts) != 2 or parts[1] not in ("1", "-1", "0"):
        raise EvaluatorUnavailable(
          f"multilabel voc2007: {path} line {number} is {line.strip()!r}; "
          "expected '<image id> <1, -1 or 0>'"
        )
      marks[parts[0]] = int(parts[1])
  if not marks:
    raise EvaluatorUnavailable(
      f"multilabel voc2007: {path} is empty; expected a line '<image id> <1, -1 or 0>' "
      f"per {split} image"
    )
  return marks


def read_coco(annotations: str, image_root: str):
  """(image paths, labels (N, C) bool, None, classnames, skipped)."""
  try:
    with open(annotations, encoding="utf-8") as f:
      data = json.load(f)
    categories = sorted(data["categories"], key=lambda c: c["id"])
    column = {c["id"]: i for i, c in enumerate(categories)}
    classes: dict[int, set] = {}
    for box in data["annotations"]:
      classes.setdefault(box["image_id"], set()).add(column[box["category_id"]])
    image_files = [(im["id"], im["file_name"]) for im in data["images"]]
  except (OSError, ValueError, KeyError, TypeError) as error:
    raise EvaluatorUnavailable(
      f"multilabel coco: cannot read {annotations!r} ({error}); expected {COCO_LAYOUT}"
    ) from None
  if not classes:  # every image would be skipped as boxless: say so, not "no image"
    raise EvaluatorUnavailable(
      f"multilabel coco: {annotations} holds no annotations (boxes), so no image has a "
      f"class; expected COCO's instances file, not its image_info or captions file"
    )
  paths, rows, boxless, absent = [], [], 0, 0
  for image_id, file_name in sorted(image_files):
    path = os.path.join(image_root, file_name)
    if image_id not in classes or not os.path.isfile(path):
      boxless += image_id not in classes
      absent += image_id in classes
      continue
    paths.append(path)
    row = np.zeros(len(categories), bool)
    row[list(classes[image_id])] = True
    rows.append(row)
  if not paths:
    raise EvaluatorUnavailable(
      f"multilabel coco: none of the {len(image_files)} images of {annotations} is usable: "
      f"{boxless} have no box, {absent} with boxes are not in image_root={image_root!r}"
    )
  labels = np.stack(rows) if rows else np.zeros((0, len(categories)), bool)
  return paths, labels, None, [c["name"] for c in categories], boxless + absent


@registry.register(
  "multilabel",
  settings=SETTINGS,
  description="zero-shot multi-label mAP (dataset=voc2007 path=VOC2007, or coco path=instances JSON)",
)
class MultiLabelEvaluator:
  def __init__(self, name: str, settings, run_input, tokenizer=None):
    del name, tokenizer
    dataset, path = str(settings.dataset), str(settings.path)
    if settings.ap not in ("standard", "voc07"):
      raise ValueError(f"multilabel ap={settings.ap!r}; valid: standard, voc07")
    if dataset == "voc2007":
      if not os.path.isdir(path):
        raise EvaluatorUnavailable(
          f"multilabel path={path!r} is not a folder; expected {VOC_LAYOUT}"
        )
      read = read_voc(path, str(settings.split))
    elif dataset == "coco":
      if not os.path.isfile(path) or not os.path.isdir(str(settings.image_root)):
        raise EvaluatorUnavailable(
          f"multilabel path={path!r}, image_root={settings.image_root!r}; expected {COCO_LAYOUT}"
        )
      read = read_coco(path, str(settings.image_root))
    else:
      raise ValueError(f"multilabel dataset={dataset!r}; valid: voc2007, coco")
    self.paths, self.labels, self.ignore, classnames, self.skipped = read
    if settings.num_examples is not None:
      count = int(settings.num_examples)
      self.paths, self.labels = self.paths[:count], self.labels[:count]
      self.ignore = None if self.ignore is None else self.ignore[:count]
    if not self.paths:
      where = os.path.join(path, "JPEGImages") if dataset == "voc2007" else settings.image_root
      raise EvaluatorUnavailable(
        f"multilabel {dataset}: none of the {self.skipped} listed images is in {where}"
      )
    self.classnames = tuple(settings.classnames) or tuple(classnames)
    if len(self.classnames) != self.labels.shape[1]:
      raise ValueError(f"{len(self.classnames)} classnames for {self.labels.shape[1]} classes")
    self.prompts = tuple(settings.prompts)
    self.dataset, self.eleven_point = dataset, settings.ap == "voc07"
    self.size, self.resize = images.image_size(settings, run_input), str(settings.resize)
    self.batch_size = int(settings.batch_size)

  def scores(self, predictor) -> np.ndarray:
    """(N, C) zero-shot scores of every image against every class."""
    classes = predictor.class_embeddings(self.classnames, self.prompts)
    image_emb = images.embed_image_files(
      predictor, self.paths, self.size, self.resize, self.batch_size
    )
    return predictor.similarity(image_emb, classes)

  def __call__(self, predictor) -> dict[str, float]:
    result = ranked_labels.mean_average_precision(
      self.scores(predictor), self.labels, eleven_point=self.eleven_point, ignore=self.ignore
    )
    return {
      f"multilabel/{self.dataset}/map": result["map"],
      f"multilabel/{self.dataset}/skipped": float(self.skipped),
    }
