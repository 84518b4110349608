"""Evaluator type "world_boxes": HyCoCLIP's compositional order on the
synthetic world's held-out scenes.

For every object of the first `num_examples` held-out scenes (the world's
exact boxes): the whole scene image, its scene caption (T4), the object's
box crop (`world.render_region`) and its noun phrase ("a red circle", as
the `world_boxes` source names boxes). Figures (Lorentz models; the cones
of HyCoCLIP's entailment terms, each pair counted once per object):

  eval/boxes/image_inside_box_cone_fraction       the whole image inside its
      box crop's cone (the box entails the image it comes from)
  eval/boxes/caption_inside_phrase_cone_fraction  the caption inside its
      phrase's cone
  eval/boxes/box_inside_phrase_cone_fraction      the box crop inside its
      phrase's cone
  eval/boxes/image_inside_caption_cone_fraction   the image inside its
      caption's cone (MERU's figure, on these pairs)
  eval/boxes/mean_dist_origin/{phrase,caption,box,image}
      mean distance to the origin per level (most general first); the
      hierarchy HyCoCLIP trains puts them in increasing order

A product of Lorentz spaces (PHyCLIP) counts (pair, factor) entries in its
cone figures, named with the suffix `_per_factor`
(`origin_distance.cone_share_name`). Euclidean models get the distances
only (norms of the unnormalised features; no cones).
"""

from __future__ import annotations

import numpy as np

from hyperbolic_vl.data import synthetic_grounded as world_boxes_source
from hyperbolic_vl.data import synthetic_world as world
from hyperbolic_vl.evaluators import registry
from hyperbolic_vl.evaluators.datasets import world_scenes
from hyperbolic_vl.evaluators.metrics import origin_distance

SETTINGS = dict(split="test", num_examples=None)
DEFAULT_SCENES = 500
LEVELS = ("phrase", "caption", "box", "image")
# (figure, apex level, level inside its cone)
CONES = (
  ("image_inside_box_cone_fraction", "box", "image"),
  ("caption_inside_phrase_cone_fraction", "phrase", "caption"),
  ("box_inside_phrase_cone_fraction", "phrase", "box"),
  ("image_inside_caption_cone_fraction", "caption", "image"),
)


def grounded_scenes(seed: int, split: str, num_scenes: int, image_size: int) -> dict:
  """One row per object of held-out scenes 0..num_scenes-1.

  {"image", "box"} (M, S, S, 3) uint8: the object's whole scene and its box
  crop; {"caption", "phrase"}: M strings; "scene" (M,) the scene's index.
  """
  rows = {"image": [], "box": [], "caption": [], "phrase": [], "scene": []}
  for index in range(num_scenes):
    scene = world.sample_scene(seed, split, index)
    image = world.render(scene, image_size)
    caption = world.caption_tiers(scene)[-1]
    for obj in scene.objects:
      rows["image"].append(image)
      rows["box"].append(world.render_region(scene, obj.box, image_size))
      rows["caption"].append(caption)
      rows["phrase"].append(world_boxes_source.box_phrase(obj))
      rows["scene"].append(index)
  return {
    "image": np.stack(rows["image"]),
    "box": np.stack(rows["box"]),
    "caption": rows["caption"],
    "phrase": rows["phrase"],
    "scene": np.asarray(rows["scene"]),
  }


def compositional_figures(
  embeddings: dict[str, np.ndarray], geometry: str, curv: float | None
) -> dict[str, float]:
  """The figures of the module docstring from row-aligned (M, D) embeddings
  of the four levels (keys of LEVELS)."""
  figures = {}
  if geometry == "lorentz":
    for name, apex, inside in CONES:
      # Per (pair, factor) for a product of Lorentz spaces, and so named
      # (origin_distance.inside_cone, cone_share_name).
      inside_fraction = origin_distance.inside_cone(embeddings[apex], embeddings[inside], curv)
      figures[origin_distance.cone_share_name(name, curv)] = float(np.mean(inside_fraction))
  for level in LEVELS:
    distances = origin_distance.distance_to_origin(embeddings[level], geometry, curv)
    figures[f"mean_dist_origin/{level}"] = float(distances.mean())
  return figures


@registry.register(
  "world_boxes",
  settings=SETTINGS,
  description="HyCoCLIP's box/phrase entailment cones and distances per level on world scenes",
)
class WorldBoxesEvaluator:
  """Renders the held-out scenes' objects once; embeds them per call.

  Settings (`config.evals.<name>`): split, num_examples (scenes; default
  500, about 1250 objects), batch_size.
  """

  def __init__(self, name: str, settings, run_input, tokenizer):
    del name
    split = settings.get("split", "test")
    world_scenes.require_world_split(
      run_input, tokenizer, split=split, needed_by="the world_boxes evaluator"
    )
    rows = grounded_scenes(
      world_scenes.world_seed(run_input),
      split,
      int(settings.get("num_examples", None) or DEFAULT_SCENES),
      int(run_input.image_size),
    )
    self.images = {"image": rows["image"], "box": rows["box"]}
    self.tokens = {
      "caption": tokenizer.encode(rows["caption"]),
      "phrase": tokenizer.encode(rows["phrase"]),
    }

  def __call__(self, predictor) -> dict[str, float]:
    embeddings = {key: predictor.encode_images(value) for key, value in self.images.items()}
    embeddings.update({key: predictor.encode_tokens(value) for key, value in self.tokens.items()})
    figures = compositional_figures(embeddings, predictor.geometry, predictor.curv)
    return {f"eval/boxes/{key}": value for key, value in figures.items()}
