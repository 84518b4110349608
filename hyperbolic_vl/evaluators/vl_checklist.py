"""Evaluator type "vl_checklist": VL-Checklist's image-text contrast ("itc")
accuracy (Zhao et al. 2022), read from its published corpus layout.

  path        the VL-Checklist checkout: corpus/v1/<type>/<corpus>.yaml, each
              naming ANNO_PATH (a JSON list of [image, {"POS": [text],
              "NEG": [text]}], relative to path) and IMG_ROOT (the image
              folder, relative to image_root)
  image_root  the folder holding the IMG_ROOT folders (vg/, hake/, swig/);
              default: path

The defaults are PHyCLIP's configs/vl_checklist_config.yaml: types
Object/Location/{center,margin,mid} and Object/Size/{large,medium,small},
corpus vg_obj, MAX_NUM 2000 (the itc task keeps the first MAX_NUM / 2
samples of each corpus). A sample is correct when the image scores strictly
higher with its first POS text than with its first NEG text (VL-Checklist's
itc rule on PHyCLIP's probabilities [-s, s]); `predictor.similarity` gives
s, so any objective works. Samples whose image is absent are left out, as
VL-Checklist's loader does, and counted.

Figures:
  vl_checklist/<type>/<corpus>   accuracy, e.g. vl_checklist/Object/Size/large/vg_obj
  vl_checklist/<group>           mean over the group's types (Object/Location, Object/Size)
  vl_checklist/skipped           samples malformed or without their image

Images: squeezed to the model's square resolution (the release's
resize((224, 224)), bicubic). normalization="release" (default) reproduces
PHyCLIP's double normalisation: the release maps pixels to [-1, 1]
(pixelbert_transform's Normalize(0.5, 0.5)) and the model then applies its
own mean/std again; "project" feeds pixels in [0, 1], as every other
evaluator here does.
"""

from __future__ import annotations

import collections
import json
import os

import numpy as np

from hyperbolic_vl.evaluators import EvaluatorUnavailable, registry
from hyperbolic_vl.evaluators.datasets import images
from hyperbolic_vl.evaluators.metrics import ranked_labels

PHYCLIP_TYPES = (
  "Object/Location/center",
  "Object/Location/margin",
  "Object/Location/mid",
  "Object/Size/large",
  "Object/Size/medium",
  "Object/Size/small",
)
LAYOUT = (
  "a VL-Checklist checkout: corpus/v1/<type>/<corpus>.yaml with ANNO_PATH (JSON under the "
  "checkout) and IMG_ROOT (images under image_root)"
)
SETTINGS = dict(
  path="",
  image_root="",
  types=PHYCLIP_TYPES,
  corpora=("vg_obj",),
  max_num=2000,
  normalization="release",
  image_size=0,
)


def read_corpus_yaml(path: str) -> dict:
  """The flat `KEY: "value"` lines of a corpus file (all the published ones hold)."""
  values = {}
  with open(path, encoding="utf-8") as f:
    for line in f:
      key, sep, value = line.partition(":")
      if sep and key.strip() and not key.startswith("#"):
        values[key.strip()] = value.strip().strip("\"'")
  missing = {"ANNO_PATH", "IMG_ROOT"} - set(values)
  if missing:
    raise EvaluatorUnavailable(f"{path} lacks {sorted(missing)}; expected {LAYOUT}")
  return values


SAMPLE_LAYOUT = '[image, {"POS": [text, ...], "NEG": [text, ...]}]'


def read_samples(anno_path: str, image_folder: str, limit: int, skipped: images.SkippedItems):
  """[(image path, positive text, negative text)], the first `limit`
  samples whose image exists; those left out are counted in `skipped`."""
  try:
    with open(anno_path, encoding="utf-8") as f:
      rows = json.load(f)
  except (OSError, json.JSONDecodeError) as error:
    raise EvaluatorUnavailable(f"{anno_path}: {error}; expected {LAYOUT}") from None
  if not isinstance(rows, list):
    raise EvaluatorUnavailable(
      f"{anno_path} holds a JSON {type(rows).__name__}; expected a list of {SAMPLE_LAYOUT}"
    )
  kept = []
  for number, row in enumerate(rows):
    if len(kept) >= limit:
      break
    try:
      image, texts = row
      positive, negative = texts["POS"][0], texts["NEG"][0]
      assert isinstance(image, str) and isinstance(positive, str) and isinstance(negative, str)
    except (ValueError, TypeError, KeyError, IndexError, AssertionError):
      skipped.malformed += 1
      if not skipped.example:
        skipped.example = f"{os.path.basename(anno_path)} sample {number} is {str(row)[:80]}"
      continue
    image_path = os.path.join(image_folder, image)
    if not os.path.isfile(image_path):
      skipped.no_image += 1
      continue
    kept.append((image_path, positive, negative))
  return kept


@registry.register(
  "vl_checklist",
  settings=SETTINGS,
  description="VL-Checklist itc accuracy (path=its checkout, image_root=folder of vg/ hake/ swig/)",
)
class VLChecklistEvaluator:
  def __init__(self, name: str, settings, run_input, tokenizer=None):
    del name, tokenizer
    root = str(settings.path)
    if not root or not os.path.isdir(os.path.join(root, "corpus", "v1")):
      raise EvaluatorUnavailable(f"vl_checklist path={root!r} has no corpus/v1; expected {LAYOUT}")
    image_root = str(settings.image_root) or root
    if settings.normalization not in ("release", "project"):
      raise ValueError(
        f"vl_checklist normalization={settings.normalization!r}; valid: release, project"
      )
    self.samples, skipped = {}, images.SkippedItems("sample", f"are not {SAMPLE_LAYOUT}")
    for type_name in settings.types:
      for corpus in settings.corpora:
        corpus_file = os.path.join(root, "corpus", "v1", type_name, f"{corpus}.yaml")
        if not os.path.isfile(corpus_file):
          raise EvaluatorUnavailable(f"vl_checklist: {corpus_file} is absent; expected {LAYOUT}")
        entry = read_corpus_yaml(corpus_file)
        kept = read_samples(
          os.path.join(root, entry["ANNO_PATH"]),
          os.path.join(image_root, entry["IMG_ROOT"]),
          int(settings.max_num) // 2,
          skipped,
        )
        if kept:
          self.samples[f"{type_name}/{corpus}"] = kept
    under = f"the IMG_ROOT folders under {image_root}"
    if not self.samples:
      raise EvaluatorUnavailable(
        f"vl_checklist: no usable sample in {root}: {skipped.describe(under)}"
      )
    if skipped.total:
      print(f"vl_checklist: skipped {skipped.total} sample(s): {skipped.describe(under)}")
    self.skipped = skipped.total
    self.size = images.image_size(settings, run_input)
    self.release_normalization = settings.normalization == "release"
    self.batch_size = int(settings.batch_size)

  def encode(self, predictor):
    if not self.release_normalization:
      return predictor.encode_images
    # uint8 -> [0, 1] -> Normalize(0.5, 0.5): [-1, 1], before the model's own normalisation.
    return lambda batch: predictor.encode_pixel_values(
      np.asarray(batch, np.float32) / np.float32(127.5) - np.float32(1.0)
    )

  def __call__(self, predictor) -> dict[str, float]:
    paths = sorted({p for samples in self.samples.values() for p, _, _ in samples})
    row = {p: i for i, p in enumerate(paths)}
    image_emb = images.embed_image_files(
      predictor, paths, self.size, "squeeze", self.batch_size, encode=self.encode(predictor)
    )
    figures, groups = {}, collections.defaultdict(list)
    for key, samples in self.samples.items():
      rows = image_emb[[row[p] for p, _, _ in samples]]
      positive = predictor.paired_similarity(
        rows, predictor.encode_texts([t for _, t, _ in samples])
      )
      negative = predictor.paired_similarity(
        rows, predictor.encode_texts([t for _, _, t in samples])
      )
      figures[f"vl_checklist/{key}"] = ranked_labels.paired_accuracy(positive, negative)
      groups[key.rsplit("/", 2)[0]].append(figures[f"vl_checklist/{key}"])
    for group, values in groups.items():
      figures[f"vl_checklist/{group}"] = float(np.mean(values))
    figures["vl_checklist/skipped"] = float(self.skipped)
    return figures
