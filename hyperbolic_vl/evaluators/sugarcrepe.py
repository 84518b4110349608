"""Evaluator type "sugarcrepe": SugarCrepe's compositional image-text
matching (Hsieh et al. 2023), read from its published layout.

  path        the folder of its seven JSON files (the repository's `data/`):
              add_obj, add_att, replace_obj, replace_att, replace_rel,
              swap_obj, swap_att .json, each {id: {"filename", "caption",
              "negative_caption"}}
  image_root  COCO val2017 (the files the items' "filename" names)

An item is correct when the image scores strictly higher with its caption
than with its negative caption (`predictor.similarity`, the objective's own
score, so any objective works). Figures:
  sugarcrepe/<category>   accuracy per category
  sugarcrepe/overall      accuracy over every item (the count-weighted mean,
                          as PHyCLIP's run_sugarcrepe.py writes it)
  sugarcrepe/skipped      items left out: malformed, or image not found

Images: resize="squeeze" (default) squashes the whole image to the model's
square resolution, as PHyCLIP's script does (Resize((224, 224)), bicubic);
"crop" takes the centre square first, as SugarCrepe's own open_clip script
does (shorter side resized, centre crop) and as this project's
classification evaluators do.
"""

from __future__ import annotations

import json
import os

from hyperbolic_vl.evaluators import EvaluatorUnavailable, registry
from hyperbolic_vl.evaluators.datasets import images
from hyperbolic_vl.evaluators.metrics import ranked_labels

CATEGORIES = (
  "add_obj",
  "add_att",
  "replace_obj",
  "replace_att",
  "replace_rel",
  "swap_obj",
  "swap_att",
)
LAYOUT = (
  "SugarCrepe's data/ folder: add_obj.json, add_att.json, replace_obj.json, replace_att.json, "
  "replace_rel.json, swap_obj.json, swap_att.json"
)
SETTINGS = dict(
  path="", image_root="", categories=CATEGORIES, resize="squeeze", image_size=0, num_examples=None
)


_FIELDS = ("filename", "caption", "negative_caption")
MALFORMED = "lack the text fields " + ", ".join(_FIELDS)


def read_category(json_path: str, image_root: str, num_examples=None, skipped=None):
  """[(image path, caption, negative caption)] of one file; the items left
  out are counted in `skipped` (images.SkippedItems)."""
  skipped = images.SkippedItems("item", MALFORMED) if skipped is None else skipped
  try:
    with open(json_path, encoding="utf-8") as f:
      items = json.load(f)
  except json.JSONDecodeError as error:
    raise EvaluatorUnavailable(f"{json_path} is not JSON ({error}); expected {LAYOUT}") from None
  if not isinstance(items, dict):
    raise EvaluatorUnavailable(f"{json_path}: expected an object of items; expected {LAYOUT}")
  kept = []
  for key, item in items.items():
    if num_examples is not None and len(kept) >= int(num_examples):
      break
    fields = [item.get(k) if isinstance(item, dict) else None for k in _FIELDS]
    if not all(isinstance(v, str) and v for v in fields):
      skipped.malformed += 1
      if not skipped.example:
        keys = sorted(item) if isinstance(item, dict) else type(item).__name__
        skipped.example = f"{os.path.basename(json_path)} item {key!r} has {keys}"
      continue
    filename, caption, negative = fields
    image_path = os.path.join(image_root, filename)
    if not os.path.isfile(image_path):
      skipped.no_image += 1
      continue
    kept.append((image_path, caption, negative))
  return kept


@registry.register(
  "sugarcrepe",
  settings=SETTINGS,
  description="SugarCrepe accuracy per category (path=its data/ folder, image_root=COCO val2017)",
)
class SugarCrepeEvaluator:
  def __init__(self, name: str, settings, run_input, tokenizer=None):
    del name, tokenizer
    path, image_root = str(settings.path), str(settings.image_root)
    if not path or not os.path.isdir(path):
      raise EvaluatorUnavailable(f"sugarcrepe path={path!r} is not a folder; expected {LAYOUT}")
    if not image_root or not os.path.isdir(image_root):
      raise EvaluatorUnavailable(
        f"sugarcrepe image_root={image_root!r} is not a folder; expected COCO val2017 images"
      )
    if settings.resize not in ("squeeze", "crop"):
      raise ValueError(f"sugarcrepe resize={settings.resize!r}; valid: squeeze, crop")
    unknown = sorted(set(settings.categories) - set(CATEGORIES))
    if unknown:
      raise ValueError(f"sugarcrepe categories {unknown} unknown; valid: {list(CATEGORIES)}")
    missing = [
      c for c in settings.categories if not os.path.isfile(os.path.join(path, c + ".json"))
    ]
    if missing:
      raise EvaluatorUnavailable(
        f"sugarcrepe: {path} lacks {', '.join(m + '.json' for m in missing)}; expected {LAYOUT}"
      )
    self.items, skipped = {}, images.SkippedItems("item", MALFORMED)
    for category in settings.categories:
      kept = read_category(
        os.path.join(path, category + ".json"), image_root, settings.num_examples, skipped
      )
      if kept:
        self.items[category] = kept
    if not self.items:
      raise EvaluatorUnavailable(
        f"sugarcrepe: no usable item in {path}: {skipped.describe(image_root)}"
      )
    if skipped.total:
      print(f"sugarcrepe: skipped {skipped.total} item(s): {skipped.describe(image_root)}")
    self.skipped = skipped.total
    self.size = images.image_size(settings, run_input)
    self.resize = str(settings.resize)
    self.batch_size = int(settings.batch_size)

  def __call__(self, predictor) -> dict[str, float]:
    # Each COCO image once, whatever the number of items that use it.
    paths = sorted({p for items in self.items.values() for p, _, _ in items})
    row = {p: i for i, p in enumerate(paths)}
    image_emb = images.embed_image_files(predictor, paths, self.size, self.resize, self.batch_size)
    figures, correct_total, count_total = {}, 0, 0
    for category, items in self.items.items():
      rows = image_emb[[row[p] for p, _, _ in items]]
      positive = predictor.paired_similarity(rows, predictor.encode_texts([c for _, c, _ in items]))
      negative = predictor.paired_similarity(rows, predictor.encode_texts([n for _, _, n in items]))
      accuracy = ranked_labels.paired_accuracy(positive, negative)
      figures[f"sugarcrepe/{category}"] = accuracy
      correct_total += round(accuracy * len(items))  # a count: exact after rounding
      count_total += len(items)
    figures["sugarcrepe/overall"] = correct_total / count_total
    figures["sugarcrepe/skipped"] = float(self.skipped)
    return figures
