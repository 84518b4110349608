"""HierarCaps metrics (precision, recall, tau_d; evaluators/hierarchy.py) of
a model, on the world's held-out caption tiers or a HierarCaps-format CSV.

The root of Euclidean models is the objective's (Radial Embeddings' learned
or mean root, through the Predictor) or, for other models, the model's own
unit-normalised empty-string embedding (`root="empty"`); `root="zero"` uses
the origin. Lorentz models always use the hyperboloid's origin.
"""

from __future__ import annotations

import numpy as np

from hyperbolic_vl.data import hierarcaps, pipeline
from hyperbolic_vl.evaluators import EvaluatorUnavailable, hierarchy

ROOTS = ("objective", "empty", "zero")


def hierarcaps_items(csv_path: str, image_root: str, tokenizer, image_size: int, num_examples=None):
  """(data dict for `predictor_hierarchy_metrics`, number of skipped rows)."""
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


def predictor_hierarchy_metrics(
  predictor,
  data: dict,
  *,
  root: str = "objective",
  prefix: str = "eval/hierarchy/",
  method: str = "thresholds",
  omit_first_prediction: bool = False,
) -> dict:
  """P, R, tau_d for data with "image", "tier_tokens" (N, tiers, L) and
  optionally "image_keys" (rows with equal keys are one image)."""
  if root not in ROOTS:
    raise ValueError(f"root={root!r}; valid: {list(ROOTS)}")
  image_emb = predictor.encode_images(data["image"])
  gallery_tokens, tier_index = hierarchy.unique_texts(data["tier_tokens"])
  gallery = predictor.encode_tokens(gallery_tokens)
  root_point = None
  if predictor.geometry != "lorentz":
    root_point = predictor.root_embedding() if root == "objective" else None
    if root == "zero":
      root_point = np.zeros(gallery.shape[-1], np.float64)
    elif root_point is None:
      empty = predictor.encode_tokens(predictor.tokenize([""]))[0]
      root_point = hierarchy.normalize(empty.astype(np.float64))
    root_point = np.asarray(root_point, np.float64)
  return hierarchy.hierarchy_metrics(
    image_emb,
    gallery,
    tier_index,
    geometry=predictor.geometry,
    root=root_point,
    curv=predictor.curv,
    image_keys=data.get("image_keys"),
    method=method,
    omit_first_prediction=omit_first_prediction,
    prefix=prefix,
  )


class HierarchyEvaluator:
  """Settings: source ("world" or "hierarcaps"), path / image_root (the
  HierarCaps test CSV and its images; default the run's input.data.eval_path
  and image_root), split, num_examples, root, method, omit_first_prediction."""

  def __init__(self, name: str, settings, run_config, tokenizer):
    del name
    self.settings = settings
    source = str(settings.get("source", "world"))
    data_config = run_config.input.data
    if source == "world":
      if data_config.get("name", "") != "world":
        raise EvaluatorUnavailable(
          f"source='world' needs input.data.name='world'; this run trains on "
          f"{data_config.get('name', '')!r} (use source='hierarcaps' with a test CSV)"
        )
      self.data = pipeline.load_eval_split(
        run_config.input,
        tokenizer,
        split=settings.get("split", "test"),
        num_examples=settings.get("num_examples", None),
      )
    elif source == "hierarcaps":
      path = str(settings.get("path", "") or data_config.get("eval_path", ""))
      if not path:
        raise EvaluatorUnavailable("set path (a HierarCaps test CSV) or input.data.eval_path")
      image_root = str(settings.get("image_root", "") or data_config.get("image_root", ""))
      self.data, _ = hierarcaps_items(
        path,
        image_root,
        tokenizer,
        int(run_config.input.image_size),
        settings.get("num_examples", None),
      )
    else:
      raise ValueError(f"source={source!r}; valid: ['world', 'hierarcaps']")

  def __call__(self, predictor) -> dict[str, float]:
    return predictor_hierarchy_metrics(
      predictor,
      self.data,
      root=str(self.settings.get("root", "objective")),
      method=str(self.settings.get("method", "thresholds")),
      omit_first_prediction=bool(self.settings.get("omit_first_prediction", False)),
    )
