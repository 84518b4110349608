"""HierarCaps-format test CSVs (id, captions as four ' => '-separated tiers,
image_url) and their images, as the hierarchy and ATMG evaluators read them
(`data.hierarcaps` parses the rows). A CSV path given in an evaluator's
settings wins; otherwise the run's `input.data.eval_path` / `image_root`."""

from __future__ import annotations

import numpy as np

from hyperbolic_vl.data.readers import hierarcaps
from hyperbolic_vl.evaluators import EvaluatorUnavailable


def csv_and_images(settings, run_input, what: str) -> tuple[str, str]:
  """(CSV path, image folder) from the settings, else the run's input.data."""
  data_config = run_input.data
  path = str(settings.get("path", "") or data_config.get("eval_path", ""))
  if not path:
    raise EvaluatorUnavailable(f"set path ({what}) or input.data.eval_path")
  image_root = str(settings.get("image_root", "") or data_config.get("image_root", ""))
  return path, image_root


def hierarcaps_items(csv_path: str, image_root: str, tokenizer, image_size: int, num_examples=None):
  """(data for `hierarchy.predictor_hierarchy_metrics`, the rows skipped as malformed)."""
  split = hierarcaps.load_test(csv_path, image_root)
  count = len(split) if num_examples is None else min(int(num_examples), len(split))
  if count == 0:
    raise EvaluatorUnavailable(f"no valid rows in {csv_path}")
  split.tiers, split.image_paths = split.tiers[:count], split.image_paths[:count]
  flat = [t for tiers in split.tiers for t in tiers]
  data = {
    "image": hierarcaps.load_images(split, image_size),
    "tier_tokens": np.asarray(tokenizer.encode(flat)).reshape(count, hierarcaps.NUM_TIERS, -1),
    # Rows of one image are one query with several reference hierarchies.
    "image_keys": [str(p) for p in split.image_paths],
  }
  return data, split.problems


def tier_chains(csv_path: str, image_root: str, image_size: int, num_examples=None):
  """(tiers: N lists of 4 texts, images (N, S, S, 3) or None without an image
  folder) of the first `num_examples` valid rows; at least 2 rows."""
  split = hierarcaps.load_test(csv_path, image_root or None)
  count = len(split) if num_examples is None else min(int(num_examples), len(split))
  if count < 2:
    malformed = f" ({len(split.problems)} malformed, {split.problems[0]})" if split.problems else ""
    raise EvaluatorUnavailable(f"fewer than 2 valid rows in {csv_path}{malformed}")
  split.tiers, split.image_paths = split.tiers[:count], split.image_paths[:count]
  images = hierarcaps.load_images(split, image_size) if image_root else None
  return split.tiers, images
