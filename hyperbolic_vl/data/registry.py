"""Data sources by name: the trainer's and evaluators' only door to data.

TRANSITIONAL STUB (issue 17): dispatches `input.data.name` to today's
pipelines; the data registry replaces it with sources that register once.
"""

from __future__ import annotations

from hyperbolic_vl.data import coco_boxes, hierarcaps, pipeline, scene_objects


def make_train_iterator(input_config, tokenizer, *, seed, process_index=None, process_count=None):
  """A checkpointable iterator over this process's slice of training batches."""
  import jax  # pylint: disable=g-import-not-at-top

  process_index = jax.process_index() if process_index is None else process_index
  process_count = jax.process_count() if process_count is None else process_count
  data = input_config.data
  layout = dict(process_index=process_index, process_count=process_count)
  if data.name in ("world_tiers", "hierarcaps_tiers"):
    config = dict(input_config)
    config["data"] = dict(data, name="world" if data.name == "world_tiers" else "hierarcaps")
    import ml_collections  # pylint: disable=g-import-not-at-top

    return hierarcaps.make_tier_text_iterator(
      ml_collections.ConfigDict(config), tokenizer, seed=seed, **layout
    )
  if data.name in ("world_scene_objects", "coco_scene_objects"):
    if data.name == "world_scene_objects":
      provider = coco_boxes.WorldBoxes(
        int(data.get("world_seed", 0)), "train", int(data.get("num_train", 100_000))
      )
    else:
      provider = coco_boxes.CocoBoxes(data.path, data.image_root)
    return scene_objects.make_scene_object_iterator(
      provider,
      batch_size=input_config.batch_size,
      image_size=input_config.image_size,
      seed=seed,
      min_box_area=float(data.get("min_box_area", 0.0)),
      augment=data.get("augment", "moco_v2"),
      num_threads=int(input_config.get("num_threads", 1)),
      prefetch_batches=int(input_config.get("prefetch_batches", 2)),
      **layout,
    )
  return pipeline.make_train_iterator(input_config, tokenizer, seed=seed, **layout)


_EVAL_ALIASES = {"world_tiers": "world", "world_scene_objects": "world"}


def load_eval_split(input_config, tokenizer=None, split="test", num_examples=None):
  """A whole evaluation split in memory (see pipeline.load_eval_split)."""
  name = input_config.data.name
  if name in _EVAL_ALIASES:
    config = dict(input_config)
    config["data"] = dict(input_config.data, name=_EVAL_ALIASES[name])
    input_config = config
  return pipeline.load_eval_split(input_config, tokenizer, split=split, num_examples=num_examples)
