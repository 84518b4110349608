"""Evaluator type "hierarchy": HierarCaps metrics (precision, recall, tau_d;
metrics/hierarchy.py) of a model, on the world's held-out caption tiers or a
HierarCaps-format CSV.

The root of Euclidean models is the objective's (Radial Embeddings' learned
or mean root, through the Predictor) or, for other models, the model's own
unit-normalised empty-string embedding (`root="empty"`); `root="zero"` uses
the origin. Lorentz models always use the hyperboloid's origin.
"""

from __future__ import annotations

import numpy as np

from hyperbolic_vl.evaluators import registry, require_single_space
from hyperbolic_vl.evaluators.datasets import hierarcaps_csv, world_scenes
from hyperbolic_vl.evaluators.metrics import hierarchy as metrics
from hyperbolic_vl.evaluators.metrics.hierarchy import normalize

ROOTS = ("objective", "empty", "zero")
SOURCES = ("world", "hierarcaps")
SETTINGS = dict(
  source="world",
  path="",
  image_root="",
  split="test",
  num_examples=None,
  root="objective",
  method="thresholds",
  omit_first_prediction=False,
)


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
  require_single_space(predictor, "the hierarchy metrics (distances to the root, traversals)")
  image_emb = predictor.encode_images(data["image"])
  gallery_tokens, tier_index = metrics.unique_texts(data["tier_tokens"])
  gallery = predictor.encode_tokens(gallery_tokens)
  root_point = None
  if predictor.geometry != "lorentz":
    root_point = predictor.root_embedding() if root == "objective" else None
    if root == "zero":
      root_point = np.zeros(gallery.shape[-1], np.float64)
    elif root_point is None:
      empty = predictor.encode_tokens(predictor.tokenize([""]))[0]
      root_point = normalize(empty.astype(np.float64))
    root_point = np.asarray(root_point, np.float64)
  return metrics.hierarchy_metrics(
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


@registry.register(
  "hierarchy",
  settings=SETTINGS,
  description="HierarCaps precision / recall / tau_d (world caption tiers or a HierarCaps CSV)",
)
class HierarchyEvaluator:
  """Settings: source ("world" or "hierarcaps"), path / image_root (the
  HierarCaps test CSV and its images; default the run's input.data.eval_path
  and image_root), split, num_examples, root, method, omit_first_prediction.

  `skipped_rows` lists the CSV rows left out as malformed (none for the world).
  """

  def __init__(self, name: str, settings, run_input, tokenizer):
    del name
    self.settings = settings
    self.skipped_rows = []
    source = str(settings.get("source", "world"))
    if source == "world":
      self.data = world_scenes.load_world_split(
        run_input,
        tokenizer,
        split=settings.get("split", "test"),
        num_examples=settings.get("num_examples", None),
        needed_by="source='world' (use source='hierarcaps' with a test CSV)",
      )
    elif source == "hierarcaps":
      path, image_root = hierarcaps_csv.csv_and_images(settings, run_input, "a HierarCaps test CSV")
      self.data, self.skipped_rows = hierarcaps_csv.hierarcaps_items(
        path,
        image_root,
        tokenizer,
        int(run_input.image_size),
        settings.get("num_examples", None),
      )
    else:
      raise ValueError(f"source={source!r}; valid: {list(SOURCES)}")

  def __call__(self, predictor) -> dict[str, float]:
    return predictor_hierarchy_metrics(
      predictor,
      self.data,
      root=str(self.settings.get("root", "objective")),
      method=str(self.settings.get("method", "thresholds")),
      omit_first_prediction=bool(self.settings.get("omit_first_prediction", False)),
    )
