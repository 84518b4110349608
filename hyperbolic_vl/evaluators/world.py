"""Evaluator type "world": figures on the synthetic world's held-out split.

Figures (names as written to metrics.jsonl):
  eval/i2t_recall@{1,5,10}, eval/t2i_recall@{1,5,10}  (most specific caption;
      duplicate captions are one gallery item, see metrics/recall.py)
  eval/i2t_chance@5, eval/t2i_chance@5                (a random ranking)
  eval/zero_shot_accuracy        shape classes; eval/zero_shot_accuracy/<kind>
  eval/text_closer_fraction      text nearer the origin than its image
  eval/inside_cone_fraction      image inside its text's entailment cone
                                 (a product of spaces: ..._per_factor, a
                                 share of (pair, factor) entries)
  eval/mean_dist_origin/{image,text}
Scoring is the objective's own, through the Predictor (its score and prompt
ensembling):
Lorentzian inner product for MERU, cosine for CLIP, angles for ATMG. For
Euclidean models "distance to the origin" is the norm of the projected,
unnormalised feature and no cone exists.
"""

from __future__ import annotations

import numpy as np

from hyperbolic_vl.data import synthetic_world as world
from hyperbolic_vl.evaluators import registry
from hyperbolic_vl.evaluators.datasets import world_scenes
from hyperbolic_vl.evaluators.metrics import origin_distance, recall

RECALL_KS = (1, 5, 10)
SETTINGS = dict(split="test", num_examples=None, zero_shot_kinds=("shape", "color", "count"))


def prompt_tokens(tokenizer, kind: str) -> np.ndarray:
  """(C, P, L) token ids of the zero-shot prompts of one label kind.

  Classes with fewer prompts than the largest class repeat theirs cyclically
  so every class is an equal-size ensemble.
  """
  per_class = world.zero_shot_prompts(kind)
  width = max(len(p) for p in per_class)
  padded = [[prompts[i % len(prompts)] for i in range(width)] for prompts in per_class]
  flat = tokenizer.encode([p for prompts in padded for p in prompts])
  return flat.reshape(len(per_class), width, -1)


@registry.register(
  "world",
  settings=SETTINGS,
  description="retrieval, zero-shot and hierarchy figures on the synthetic world's held-out split",
)
class WorldEvaluator:
  """Loads the held-out split and prompts once; embeds them per call.

  Settings (`config.evals.<name>`): split, num_examples, batch_size,
  zero_shot_kinds.
  """

  def __init__(self, name: str, settings, run_input, tokenizer):
    del name
    self.batch_size = int(settings.get("batch_size", 256))
    self.kinds = tuple(settings.get("zero_shot_kinds", ("shape", "color", "count")))
    # Its figures need the world's shape/colour/count labels, which real
    # image-text data does not have.
    self.data = world_scenes.load_world_split(
      run_input,
      tokenizer,
      split=settings.get("split", "test"),
      num_examples=settings.get("num_examples", None),
      needed_by="the world evaluator",
    )
    self.prompts = {kind: prompt_tokens(tokenizer, kind) for kind in self.kinds}

  def __call__(self, predictor) -> dict[str, float]:
    image_emb = predictor.encode_images(self.data["image"])
    tokens = self.data["tokens"]
    text_emb = predictor.encode_tokens(tokens)

    results = {}
    # Retrieval with duplicate captions merged into one gallery item.
    first, relevant = recall.caption_relevance(tokens)
    gallery = text_emb[first]
    i2t_scores = predictor.similarity(image_emb, gallery)
    for k, v in recall.recall_at_k(i2t_scores, relevant, RECALL_KS).items():
      results[f"eval/i2t_recall@{k}"] = v
    t2i_scores = predictor.similarity_text_to_image(image_emb, gallery).T
    for k, v in recall.recall_at_k(t2i_scores, relevant.T, RECALL_KS).items():
      results[f"eval/t2i_recall@{k}"] = v
    results["eval/i2t_chance@5"] = recall.chance_recall_at_k(relevant, 5)
    results["eval/t2i_chance@5"] = recall.chance_recall_at_k(relevant.T, 5)

    for kind, prompt_ids in self.prompts.items():
      class_emb = predictor.class_embeddings_from_tokens(prompt_ids)
      scores = predictor.similarity(image_emb, class_emb)
      results[f"eval/zero_shot_accuracy/{kind}"] = recall.accuracy(
        scores, self.data[f"label/{kind}"]
      )
    if "shape" in self.prompts:
      results["eval/zero_shot_accuracy"] = results["eval/zero_shot_accuracy/shape"]

    order = origin_distance.text_image_order_figures(
      image_emb, text_emb, predictor.geometry, predictor.curv
    )
    results.update({f"eval/{k}": v for k, v in order.items()})
    return results
