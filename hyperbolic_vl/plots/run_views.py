"""Every picture of one trained run, from its own held-out data.

`run_figures(model)` embeds the first examples of the run's evaluation split
(through the data registry, so any source with one works: the synthetic
world, its tiers, HierarCaps, ...) and returns the figures by file stem.
`python -m hyperbolic_vl.plot` and the quick-start colab call it.

Captions as strings (for labels and traversal pools) exist for the
synthetic world, whose scenes are regenerated from their indices; other
sources are drawn from their token ids without labels, and their
traversals retrieve from MERU's pexels pool with MERU's prompts.
"""

from __future__ import annotations

import numpy as np

from hyperbolic_vl.data import registry as data_registry
from hyperbolic_vl.data import synthetic_world as world
from hyperbolic_vl.evaluators import world_boxes
from hyperbolic_vl.evaluators.datasets import world_scenes
from hyperbolic_vl.evaluators.metrics import traversal
from hyperbolic_vl.plots import embedding_views, layout, walk_views

# How many examples each picture shows (the histograms use all of them).
DISK_POINTS = 80
TRAVERSAL_IMAGES = 5
INTERPOLATION_STEPS = 8
CAPTION_POOL_SCENES = 40  # the world's traversal pool: every tier of these


class ViewsUnavailable(ValueError):
  """The run's model or data cannot give the views (the reason is the message)."""


def world_captions(model, data: dict) -> list[list[str]] | None:
  """The caption tiers of each example of a world evaluation split, or None
  for a source that is not the world."""
  if not all(key in data for key in world_scenes.WORLD_LABEL_KEYS) or "index" not in data:
    return None
  seed = world_scenes.world_seed(model.config.input)
  return [world.caption_tiers(world.sample_scene(seed, "test", int(i))) for i in data["index"]]


def run_space(model, image_emb: np.ndarray, text_emb: np.ndarray) -> layout.Space:
  """The run's space; a Euclidean run without a root of its own gets MERU's
  CLIP [ROOT] (App. G) from the embedded held-out images and texts (MERU
  uses training data; any large sample gives nearly the same mean)."""
  space = layout.Space.of(model)
  if not space.is_lorentz and space.root is None:
    space = layout.Space(space.geometry, None, traversal.clip_root(image_emb, text_emb))
  return space


def box_level_histograms(model, space: layout.Space, num_scenes: int, prefix: str = ""):
  """HyCoCLIP's four levels on the world's held-out scenes (one row per
  object: its noun phrase, the scene's caption, its box crop, the whole
  image), whose distances to the origin the paper orders phrase < caption <
  box < image."""
  rows = world_boxes.grounded_scenes(
    world_scenes.world_seed(model.config.input), "test", num_scenes, model.image_size
  )
  groups = {
    "phrases": model.encode_texts(rows["phrase"]),
    "captions": model.encode_texts(rows["caption"]),
    "box crops": model.encode_images(rows["box"]),
    "whole images": model.encode_images(rows["image"]),
  }
  return embedding_views.distance_histograms(
    space, groups, title=f"{prefix}{space.distance_name} per level, {num_scenes} held-out scenes"
  )


def run_figures(model, *, num_examples: int = 200, name: str = "") -> dict:
  """{file stem: figure} for a `hyperbolic_vl.load` model: disk_view,
  distance_histograms, traversals, interpolation, (Lorentz runs) cone and
  (runs on `world_boxes`, HyCoCLIP's data) box_levels.
  Raises `ViewsUnavailable` for a model without a text tower (HCL's image
  model) or a source without a held-out split to draw."""
  if not model.has_text_tower:
    raise ViewsUnavailable("the model has no text tower (an image-only model such as HCL's)")
  try:
    data = data_registry.load_eval_split(
      model.config.input, model.tokenizer, num_examples=num_examples
    )
  except data_registry.NoEvalSplitError as error:
    raise ViewsUnavailable(f"this run's data has no held-out split ({error})") from error
  images = np.asarray(data["image"])
  image_emb = model.encode_images(images)
  text_emb = model.encode_tokens(data["tokens"])
  space = run_space(model, image_emb, text_emb)
  captions = world_captions(model, data)
  prefix = f"{name}: " if name else ""
  figures = {}
  shown = slice(0, DISK_POINTS)
  figures["disk_view"] = embedding_views.disk_view(
    space,
    image_emb[shown],
    text_emb[shown],
    labels=[tiers[-1] for tiers in captions[shown]] if captions else None,
    title=f"{prefix}{len(image_emb[shown])} held-out images and their captions",
  )
  groups = {"images": image_emb}
  if "tier_tokens" in data:
    tier_tokens = np.asarray(data["tier_tokens"])
    for tier in range(tier_tokens.shape[1]):
      groups[f"caption tier {tier + 1}"] = model.encode_tokens(tier_tokens[:, tier])
  else:
    groups["captions"] = text_emb
  figures["distance_histograms"] = embedding_views.distance_histograms(
    space, groups, title=f"{prefix}{space.distance_name}, {len(image_emb)} held-out examples"
  )
  if captions and model.config.input.data.get("name") == "world_boxes":
    figures["box_levels"] = box_level_histograms(model, space, len(image_emb), prefix)
  if captions:
    pool = traversal.TextPool.of_captions(
      sorted({t for tiers in captions[:CAPTION_POOL_SCENES] for t in tiers})
    )
  else:
    pool = traversal.load_text_pool()
  pool_emb = model.encode_texts(list(pool.prompts))
  walks = [
    traversal.traverse(
      image_emb[i],
      pool_emb,
      list(pool.texts),
      geometry=space.geometry,
      curv=space.curv,
      root=space.root,
    )
    for i in range(min(TRAVERSAL_IMAGES, len(images)))
  ]
  figures["traversals"] = walk_views.traversal_strips(
    images[: len(walks)],
    {name or model.geometry: walks},
    image_titles=[tiers[-1] for tiers in captions[: len(walks)]] if captions else None,
  )
  if len(images) > 1:
    figures["interpolation"] = walk_views.interpolation_strip(
      space,
      image_emb[0],
      image_emb[1],
      texts=list(pool.texts),
      text_emb=pool_emb,
      images=images,
      image_emb=image_emb,
      steps=INTERPOLATION_STEPS,
      title=f"{prefix}geodesic from image 0 to image 1: nearest held-out image and text",
    )
  if space.is_lorentz:
    # The apex: a mid-level caption of example 0 (tier 3 of 4: general
    # enough to contain several images, far enough from the origin that its
    # cone is narrower than the half-plane it saturates to near the origin).
    if "tier_tokens" in data:
      tier = min(2, np.asarray(data["tier_tokens"]).shape[1] - 1)
      apex_tokens = np.asarray(data["tier_tokens"])[0, tier]
    else:
      tier, apex_tokens = -1, np.asarray(data["tokens"])[0]
    apex_emb = model.encode_tokens(apex_tokens[None])[0]
    apex_label = captions[0][tier] if captions else "the caption of example 0"
    figures["cone"] = embedding_views.cone_view(
      space.curv,
      apex_emb,
      image_emb,
      apex_label=f"cone of '{apex_label}'",
      highlight=np.array([tiers[tier] == apex_label for tiers in captions]) if captions else None,
      highlight_label=f"images of {apex_label}",
      title=f"{prefix}which held-out images the cone of '{apex_label}' contains",
    )
  return figures
