"""The synthetic world's held-out scenes, as evaluators need them.

Evaluators read the run's own data only through the data registry
(`data.registry.load_eval_split`). A run can use the world's labelled figures
when its data source gives the world's held-out split: `world` itself, and
the sources drawn from it (`world_tiers`, `world_scene_objects`, ...). Which
sources do is the data registry's to say, not a list of names here: a source
without an evaluation split raises ValueError (`NoEvalSplitError`), one of
real images gives no world labels; either way the evaluator is unavailable
on this run's data.

Evaluators that render more than the split holds (HCL's object crops, ATMG's
region chains) draw the same scenes again from `input.data.world_seed`.
"""

from __future__ import annotations

import numpy as np

from hyperbolic_vl.data import registry as data_registry
from hyperbolic_vl.data import synthetic_world as world
from hyperbolic_vl.evaluators import EvaluatorUnavailable

# A held-out split with these keys is the world's (see data.registry.load_eval_split).
WORLD_LABEL_KEYS = ("label/shape",)


def _load(run_input, tokenizer, split: str, num_examples, needed_by: str) -> dict:
  data_name = run_input.data.get("name", "")
  why = (
    f"{needed_by} needs the synthetic world's labelled held-out split "
    f"(input.data.name='world' or a source drawn from it); this run trains on "
    f"input.data.name={data_name!r}"
  )
  try:
    data = data_registry.load_eval_split(
      run_input, tokenizer, split=split, num_examples=num_examples
    )
  except (ValueError, OSError) as error:  # no evaluation split (NoEvalSplitError), unreadable
    raise EvaluatorUnavailable(f"{why}: {error}") from error
  missing = [key for key in WORLD_LABEL_KEYS if key not in data]
  if missing:
    raise EvaluatorUnavailable(f"{why}, whose held-out split has no {', '.join(missing)}")
  return data


def require_world_split(run_input, tokenizer, *, split: str = "test", needed_by: str) -> None:
  """Raises EvaluatorUnavailable unless the run's data gives the world's
  held-out split (reads one example to find out)."""
  _load(run_input, tokenizer, split, 1, needed_by)


def load_world_split(
  run_input, tokenizer, *, split: str = "test", num_examples=None, needed_by: str
) -> dict:
  """The run's world held-out split (`data.registry.load_eval_split`'s world keys),
  or EvaluatorUnavailable saying why this run's data has none. A single
  example is read first, so a run on real data does not load its whole
  evaluation split only to find no world labels in it."""
  require_world_split(run_input, tokenizer, split=split, needed_by=needed_by)
  return _load(run_input, tokenizer, split, num_examples, needed_by)


def world_seed(run_input) -> int:
  """The seed the run's world scenes are drawn from (`input.data.world_seed`)."""
  return int(run_input.data.get("world_seed", 0))


# -- HCL: whole scenes and their object crops -----------------------------------
def scenes_and_object_crops(seed: int, split: str, num: int, image_size: int) -> dict:
  """Held-out scenes 0..num-1 and a crop per object, rendered at `image_size`.

  {"scenes" (N, S, S, 3) float32 in [0, 1], "counts" (N,) objects per scene,
  "crops" (M, S, S, 3), "crop_labels" (M,) shape index, "crop_scene" (M,)}.
  """
  scenes, crops, crop_labels, crop_scene, counts = [], [], [], [], []
  for index in range(num):
    scene = world.sample_scene(seed, split, index)
    scenes.append(world.render(scene, image_size))
    counts.append(scene.count)
    for box, label in zip(world.object_boxes(scene), world.object_labels(scene)):
      crops.append(world.render_region(scene, box, image_size))
      crop_labels.append(label)
      crop_scene.append(index)
  to_float = lambda a: np.stack(a).astype(np.float32) / 255.0
  return {
    "scenes": to_float(scenes),
    "counts": np.asarray(counts),
    "crops": to_float(crops),
    "crop_labels": np.asarray(crop_labels),
    "crop_scene": np.asarray(crop_scene),
  }


# -- ATMG: scene > region > object image chains ---------------------------------
IMAGE_LEVELS = ("scene", "region", "object")


def region_box(object_box, fraction: float) -> tuple[float, float, float, float]:
  """A square window strictly between an object's (square) box and the scene.

  Its half side is r + fraction (0.5 - r) (r: the object's half side; 0 the
  object box, 1 the scene); it is centred on the object and shifted back
  inside the unit square, which keeps the object inside it because its half
  side exceeds r.
  """
  if not 0.0 < fraction < 1.0:
    raise ValueError(f"region_fraction must be in (0, 1), got {fraction}")
  x0, y0, x1, y1 = (float(v) for v in object_box)
  radius = 0.5 * max(x1 - x0, y1 - y0)
  half = radius + fraction * (0.5 - radius)
  cx = min(max(0.5 * (x0 + x1), half), 1.0 - half)
  cy = min(max(0.5 * (y0 + y1), half), 1.0 - half)
  return (cx - half, cy - half, cx + half, cy + half)


def world_chains(seed: int, split: str, num: int, image_size: int, fraction: float):
  """(images (N, 3, S, S, 3) uint8 scene/region/object, tiers: N lists of 4 texts)."""
  images = np.zeros((num, len(IMAGE_LEVELS), image_size, image_size, 3), np.uint8)
  tiers = []
  for index in range(num):
    scene = world.sample_scene(seed, split, index)
    box = scene.main.box
    images[index, 0] = world.render(scene, image_size)
    images[index, 1] = world.render(scene, image_size, crop=region_box(box, fraction))
    images[index, 2] = world.render(scene, image_size, crop=box)
    tiers.append(world.caption_tiers(scene))
  return images, tiers
