"""The embedded synthetic world: procedurally generated scenes of simple shapes.

This is the project's default training and evaluation data. Every scene is a
pure function of ``(seed, split, index)``, so the world needs no files, no
downloads and no storage, and any example can be regenerated anywhere.

A scene holds 1-4 coloured shapes on a background. The largest object is the
*main* object; it is what the captions talk about. Captions come in four
tiers, most general first, and each tier is entailed by the next by
construction (the hierarchy that MERU, HierarCaps/Radial Embeddings and ATMG
measure)::

    T1  "a round shape"                                  (family of the main shape)
    T2  "a circle"                                       (shape)
    T3  "a red circle"                                   (colour + shape)
    T4  "a large red circle and two other shapes on a striped background"

Ground truth beyond captions: per-scene class labels (``labels``), object
boxes and shape labels for scene/object methods (HCL), negative captions
that contradict the positives tier by tier (HierarCaps), and zero-shot prompt
sets written in the same caption grammar.

Coordinates are normalised to the unit square, x to the right and y down, so
that scenes can be rasterised at any resolution and any crop window
(``render(scene, size, crop=...)``) without resampling.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Sequence

import numpy as np

# --------------------------------------------------------------------------
# Vocabulary of the world.
# --------------------------------------------------------------------------

# Three families of two shapes each: a balanced two-level hierarchy
# (family -> shape) for the hierarchy metrics.
SHAPE_FAMILIES: dict[str, tuple[str, ...]] = {
  "round": ("circle", "ring"),
  "pointed": ("triangle", "diamond"),
  "boxy": ("square", "cross"),
}
FAMILIES: tuple[str, ...] = tuple(SHAPE_FAMILIES)
SHAPES: tuple[str, ...] = tuple(shape for shapes in SHAPE_FAMILIES.values() for shape in shapes)
FAMILY_OF_SHAPE: dict[str, str] = {
  shape: family for family, shapes in SHAPE_FAMILIES.items() for shape in shapes
}

# Saturated colours: all backgrounds are grey-level, so chroma alone keeps
# every colour readable on every background.
COLOR_RGB: dict[str, tuple[int, int, int]] = {
  "red": (220, 30, 30),
  "green": (30, 180, 60),
  "blue": (40, 90, 235),
  "yellow": (245, 220, 30),
  "purple": (160, 50, 210),
  "orange": (250, 140, 20),
}
COLORS: tuple[str, ...] = tuple(COLOR_RGB)

SIZES: tuple[str, ...] = ("small", "medium", "large")
# Radii (half the side of the object's box) as fractions of the scene side,
# so that sizes do not depend on the rendering resolution. The smallest main
# object (0.15) is still ~10 px wide at 32 px, enough for a tiny ViT.
MAIN_RADIUS_RANGES: dict[str, tuple[float, float]] = {
  "small": (0.15, 0.18),
  "medium": (0.20, 0.24),
  "large": (0.26, 0.30),
}
# Distractors are always smaller than any main object, so "the largest
# object" (the main one) is unambiguous. They carry the size word "small".
DISTRACTOR_RADIUS_RANGE: tuple[float, float] = (0.06, 0.10)

BACKGROUNDS: tuple[str, ...] = ("black", "gray", "striped", "noisy")
COUNT_WORDS: tuple[str, ...] = ("one", "two", "three", "four")
MAX_OBJECTS: int = len(COUNT_WORDS)

CLASS_NAMES: dict[str, tuple[str, ...]] = {
  "shape": SHAPES,
  "color": COLORS,
  "count": COUNT_WORDS,
  "background": BACKGROUNDS,
  "size": SIZES,
}

# Split names map to distinct integers in the seed sequence, which makes the
# splits independent random streams over the same index range.
SPLIT_IDS: dict[str, int] = {"train": 0, "validation": 1, "test": 2}

NUM_TIERS: int = 4

# Rendering constants (all in scene units, i.e. fractions of the side).
_GRAY_LEVEL = 118.0
_STRIPE_PERIOD = 0.125  # along x + y
_STRIPE_DARK, _STRIPE_LIGHT = 60.0, 165.0
_NOISE_CELLS = 12  # noise is piecewise constant on a 12 x 12 scene grid
_NOISE_RANGE = (35.0, 190.0)
_RING_INNER_FRACTION = 0.45  # ring hole radius relative to the outer radius
_CROSS_ARM_FRACTION = 1.0 / 3.0  # arm half-width relative to the radius
_MIN_GAP = 0.02  # minimum free space between object boxes
_PLACEMENT_ATTEMPTS = 64


@dataclasses.dataclass(frozen=True)
class SceneObject:
  """One shape. ``center`` and ``radius`` are in normalised scene units.

  ``radius`` is half the side of the (square) box that the shape fills.
  """

  shape: str
  color: str
  size: str
  center: tuple[float, float]
  radius: float

  @property
  def box(self) -> tuple[float, float, float, float]:
    """(x0, y0, x1, y1), normalised; objects always lie inside the scene."""
    cx, cy = self.center
    r = self.radius
    return (cx - r, cy - r, cx + r, cy + r)

  @property
  def family(self) -> str:
    return FAMILY_OF_SHAPE[self.shape]


@dataclasses.dataclass(frozen=True)
class Scene:
  """A set of non-overlapping objects on a background.

  ``texture_seed`` fixes the pattern of the "noisy" background so that every
  crop and resolution of the scene shows the same texture.
  """

  objects: tuple[SceneObject, ...]
  background: str
  texture_seed: int = 0

  @property
  def main_index(self) -> int:
    """Index of the largest object (the first one on ties)."""
    radii = [obj.radius for obj in self.objects]
    return radii.index(max(radii))  # list.index: the first of equal maxima

  @property
  def main(self) -> SceneObject:
    return self.objects[self.main_index]

  @property
  def count(self) -> int:
    return len(self.objects)


# --------------------------------------------------------------------------
# Sampling.
# --------------------------------------------------------------------------


def scene_rng(seed: int, split: str, index: int, *stream: int) -> np.random.Generator:
  """A generator determined by (seed, split, index) and optional sub-streams."""
  if split not in SPLIT_IDS:
    raise ValueError(f"unknown split {split!r}; valid splits: {list(SPLIT_IDS)}")
  if seed < 0 or index < 0:
    raise ValueError(f"seed and index must be non-negative, got {seed}, {index}")
  return np.random.default_rng(
    np.random.SeedSequence([int(seed), SPLIT_IDS[split], int(index), *stream])
  )


def _box_gap(center_a, radius_a, center_b, radius_b) -> float:
  """Free space between two square boxes (negative when they overlap)."""
  chebyshev = max(abs(center_a[0] - center_b[0]), abs(center_a[1] - center_b[1]))
  return chebyshev - radius_a - radius_b


def _place(rng: np.random.Generator, radius: float, placed) -> tuple[float, float]:
  """Rejection-samples a centre whose box keeps clear of the placed boxes.

  Falls back to the least-overlapping candidate so sampling always ends.
  """
  best_center, best_gap = None, -math.inf
  for _ in range(_PLACEMENT_ATTEMPTS):
    center = tuple(float(v) for v in rng.uniform(radius, 1.0 - radius, size=2))
    gap = min((_box_gap(center, radius, c, r) for c, r in placed), default=math.inf)
    if gap >= _MIN_GAP:
      return center
    if gap > best_gap:
      best_center, best_gap = center, gap
  return best_center


def sample_scene(seed: int, split: str, index: int) -> Scene:
  """The scene number ``index`` of ``split`` in the world ``seed``."""
  rng = scene_rng(seed, split, index)
  count = int(rng.integers(1, MAX_OBJECTS + 1))
  size = SIZES[rng.integers(len(SIZES))]
  main_radius = float(rng.uniform(*MAIN_RADIUS_RANGES[size]))
  main_center = tuple(float(v) for v in rng.uniform(main_radius, 1.0 - main_radius, size=2))
  main = SceneObject(
    shape=SHAPES[rng.integers(len(SHAPES))],
    color=COLORS[rng.integers(len(COLORS))],
    size=size,
    center=main_center,
    radius=main_radius,
  )
  placed = [(main_center, main_radius)]
  distractors = []
  for _ in range(count - 1):
    radius = float(rng.uniform(*DISTRACTOR_RADIUS_RANGE))
    center = _place(rng, radius, placed)
    placed.append((center, radius))
    distractors.append(
      SceneObject(
        shape=SHAPES[rng.integers(len(SHAPES))],
        color=COLORS[rng.integers(len(COLORS))],
        size="small",
        center=center,
        radius=radius,
      )
    )
  # The main object goes to a random slot so that no consumer can rely on it
  # being first; ``Scene.main_index`` finds it.
  main_slot = int(rng.integers(count))
  objects = tuple(distractors[:main_slot] + [main] + distractors[main_slot:])
  background = BACKGROUNDS[rng.integers(len(BACKGROUNDS))]
  texture_seed = int(rng.integers(2**31))
  return Scene(objects=objects, background=background, texture_seed=texture_seed)


# --------------------------------------------------------------------------
# Rendering.
# --------------------------------------------------------------------------


def _signed_distance(shape: str, dx: np.ndarray, dy: np.ndarray, r: float) -> np.ndarray:
  """Signed distance (scene units, negative inside) to a shape at the origin.

  Exact inside and near edges, approximate far outside; only the band within
  a pixel of the edge matters, for anti-aliasing.
  """
  if shape == "circle":
    return np.hypot(dx, dy) - r
  if shape == "ring":
    mid = 0.5 * (1.0 + _RING_INNER_FRACTION) * r
    half_width = 0.5 * (1.0 - _RING_INNER_FRACTION) * r
    return np.abs(np.hypot(dx, dy) - mid) - half_width
  if shape == "square":
    return np.maximum(np.abs(dx), np.abs(dy)) - r
  if shape == "diamond":
    return (np.abs(dx) + np.abs(dy) - r) * (1.0 / math.sqrt(2.0))
  if shape == "triangle":
    # Apex at (0, -r), base from (-r, r) to (r, r): fills its box.
    slanted = (2.0 * np.abs(dx) - dy - r) * (1.0 / math.sqrt(5.0))
    return np.maximum(dy - r, slanted)
  if shape == "cross":
    ax, ay = np.abs(dx), np.abs(dy)
    arm = _CROSS_ARM_FRACTION * r
    return np.minimum(np.maximum(ax - r, ay - arm), np.maximum(ax - arm, ay - r))
  raise ValueError(f"unknown shape {shape!r}; valid shapes: {SHAPES}")


def _coverage(signed_distance: np.ndarray, pixel_extent: float) -> np.ndarray:
  """Fraction of a pixel inside the shape: analytic anti-aliasing.

  Anti-aliasing makes renders at different resolutions agree on average
  colour, and keeps small shapes from flickering in and out at 16-32 px.
  """
  # minimum/maximum rather than np.clip: same result, a fraction of the
  # per-call overhead on the small arrays used here.
  return np.minimum(np.maximum(0.5 - signed_distance / pixel_extent, 0.0), 1.0)


def _cell_overlaps(centers: np.ndarray, pixel_extent: float, cells: int) -> np.ndarray:
  """(pixels, cells) share of each pixel's extent covered by each grid cell."""
  low = centers[:, None] - 0.5 * pixel_extent
  high = centers[:, None] + 0.5 * pixel_extent
  edges = np.arange(cells + 1) / cells
  overlap = np.maximum(np.minimum(high, edges[None, 1:]) - np.maximum(low, edges[None, :-1]), 0.0)
  # Normalise per pixel: pixels at the scene border stick out of the grid.
  return overlap / np.maximum(overlap.sum(axis=1, keepdims=True), 1e-12)


def _render_background(
  scene: Scene, xs: np.ndarray, ys: np.ndarray, step_x: float, step_y: float
) -> np.ndarray:
  """(len(ys), len(xs), 3) float32 background for pixels centred at xs, ys."""
  pixel_extent = 0.5 * (step_x + step_y)
  shape = (ys.shape[0], xs.shape[0])
  if scene.background == "black":
    gray = np.zeros(shape, np.float32)
  elif scene.background == "gray":
    gray = np.full(shape, _GRAY_LEVEL, np.float32)
  elif scene.background == "striped":
    phase = (xs[None, :] + ys[:, None]) * (1.0 / _STRIPE_PERIOD)
    phase -= np.floor(phase)
    # Distance (perpendicular to the stripes) to the nearest stripe edge.
    distance = (np.abs(phase - 0.5) - 0.25) * (_STRIPE_PERIOD / math.sqrt(2.0))
    light = _coverage(distance, pixel_extent)
    gray = (_STRIPE_DARK + (_STRIPE_LIGHT - _STRIPE_DARK) * light).astype(np.float32)
  elif scene.background == "noisy":
    texture = (
      np.random.default_rng(scene.texture_seed)
      .uniform(*_NOISE_RANGE, size=(_NOISE_CELLS, _NOISE_CELLS))
      .astype(np.float32)
    )
    # Area sampling (each pixel averages the cells it covers) keeps the
    # texture consistent across resolutions; point sampling would alias.
    row_weights = _cell_overlaps(ys, step_y, _NOISE_CELLS)
    col_weights = _cell_overlaps(xs, step_x, _NOISE_CELLS)
    gray = (row_weights @ texture @ col_weights.T).astype(np.float32)
  else:
    raise ValueError(f"unknown background {scene.background!r}; valid: {BACKGROUNDS}")
  canvas = np.empty(shape + (3,), np.float32)
  canvas[...] = gray[..., None]
  return canvas


def _pixel_span(low: float, high: float, origin: float, step: float, size: int) -> tuple[int, int]:
  """[start, stop) of the pixels whose centres lie in [low, high]."""
  start = math.ceil((low - origin) / step - 0.5)
  stop = math.floor((high - origin) / step - 0.5) + 1
  return max(start, 0), min(stop, size)


def render(scene: Scene, size: int, crop: Sequence[float] | None = None) -> np.ndarray:
  """Rasterises ``scene`` into a (size, size, 3) uint8 RGB image.

  Args:
    scene: the scene.
    size: output side in pixels; any resolution works because the scene is
      vector geometry.
    crop: optional (x0, y0, x1, y1) window in normalised scene coordinates.
      The window is rendered at the full output resolution (stretched to a
      square when it is not one), which is random-resized-crop without
      resampling. ``None`` is the whole scene, i.e. (0, 0, 1, 1).
  """
  if size < 1:
    raise ValueError(f"size must be positive, got {size}")
  x0, y0, x1, y1 = (0.0, 0.0, 1.0, 1.0) if crop is None else (float(v) for v in crop)
  if not (x1 > x0 and y1 > y0):
    raise ValueError(f"crop must satisfy x1 > x0 and y1 > y0, got {crop}")
  step_x, step_y = (x1 - x0) / size, (y1 - y0) / size
  # Pixel centres in scene coordinates.
  xs = x0 + (np.arange(size, dtype=np.float64) + 0.5) * step_x
  ys = y0 + (np.arange(size, dtype=np.float64) + 0.5) * step_y
  pixel_extent = 0.5 * (step_x + step_y)
  canvas = _render_background(scene, xs, ys, step_x, step_y)
  for obj in scene.objects:
    cx, cy = obj.center
    reach = obj.radius + pixel_extent
    # Only the pixels near the object's box can change; slicing keeps the
    # cost proportional to the object's area, not the image's.
    c0, c1 = _pixel_span(cx - reach, cx + reach, x0, step_x, size)
    r0, r1 = _pixel_span(cy - reach, cy + reach, y0, step_y, size)
    if c0 >= c1 or r0 >= r1:
      continue
    dx = xs[None, c0:c1] - cx
    dy = ys[r0:r1, None] - cy
    alpha = _coverage(_signed_distance(obj.shape, dx, dy, obj.radius), pixel_extent)
    alpha = alpha[..., None].astype(np.float32)
    color = np.asarray(COLOR_RGB[obj.color], np.float32)
    window = canvas[r0:r1, c0:c1]
    canvas[r0:r1, c0:c1] = window + alpha * (color - window)
  # Every pixel is a convex combination of colours in [0, 255]: no clipping.
  return (canvas + 0.5).astype(np.uint8)


def render_region(scene: Scene, box: Sequence[float], size: int) -> np.ndarray:
  """Renders the window ``box`` (normalised xyxy) of ``scene`` at ``size`` px.

  Object crops (``object_boxes``) and multi-object regions (``union_box``)
  both come from here, at full resolution.
  """
  return render(scene, size, crop=box)


def object_boxes(scene: Scene) -> np.ndarray:
  """(n, 4) float32 normalised xyxy boxes, one per object, in scene order."""
  return np.asarray([obj.box for obj in scene.objects], np.float32).reshape(-1, 4)


def object_labels(scene: Scene) -> np.ndarray:
  """(n,) int32 shape index of every object, in scene order."""
  return np.asarray([SHAPES.index(obj.shape) for obj in scene.objects], np.int32)


def union_box(boxes: np.ndarray) -> np.ndarray:
  """(4,) float32 smallest box containing all (n, 4) xyxy ``boxes``."""
  boxes = np.asarray(boxes, np.float32).reshape(-1, 4)
  if boxes.shape[0] == 0:
    raise ValueError("union_box needs at least one box")
  return np.concatenate([boxes[:, :2].min(axis=0), boxes[:, 2:].max(axis=0)])


# --------------------------------------------------------------------------
# Language.
# --------------------------------------------------------------------------


def with_article(phrase: str) -> str:
  article = "an" if phrase[0] in "aeiou" else "a"
  return f"{article} {phrase}"


def _others_phrase(count: int) -> str:
  if count == 1:
    return " alone"
  others = count - 1
  noun = "shape" if others == 1 else "shapes"
  return f" and {COUNT_WORDS[others - 1]} other {noun}"


def _scene_caption(size: str, color: str, shape: str, count: int, background: str) -> str:
  """The most specific tier (T4) from its attributes."""
  return (
    f"{with_article(f'{size} {color} {shape}')}{_others_phrase(count)}"
    f" on {with_article(background)} background"
  )


def caption_tiers(scene: Scene) -> list[str]:
  """Four captions, most general first; tier i+1 entails tier i."""
  main = scene.main
  return [
    with_article(f"{main.family} shape"),
    with_article(main.shape),
    with_article(f"{main.color} {main.shape}"),
    _scene_caption(main.size, main.color, main.shape, scene.count, scene.background),
  ]


def _other(rng: np.random.Generator, values: Sequence, exclude):
  choices = [v for v in values if v != exclude]
  return choices[rng.integers(len(choices))]


def negative_tiers(scene: Scene, rng: np.random.Generator) -> list[str]:
  """Four captions that contradict ``caption_tiers(scene)`` tier by tier.

  T1: another family. T2: another shape. T3: the same shape in another
  colour. T4: the T4 caption with one of size / colour / count / background
  changed (the others kept), so the negative is hard.
  """
  main = scene.main
  size, color, count, background = main.size, main.color, scene.count, scene.background
  attribute = ("size", "color", "count", "background")[rng.integers(4)]
  if attribute == "size":
    size = _other(rng, SIZES, size)
  elif attribute == "color":
    color = _other(rng, COLORS, color)
  elif attribute == "count":
    count = _other(rng, range(1, MAX_OBJECTS + 1), count)
  else:
    background = _other(rng, BACKGROUNDS, background)
  return [
    with_article(f"{_other(rng, FAMILIES, main.family)} shape"),
    with_article(_other(rng, SHAPES, main.shape)),
    with_article(f"{_other(rng, COLORS, main.color)} {main.shape}"),
    _scene_caption(size, color, main.shape, count, background),
  ]


def labels(scene: Scene) -> dict[str, int]:
  """Class index of the main object / the scene for every kind in CLASS_NAMES."""
  main = scene.main
  return {
    "shape": SHAPES.index(main.shape),
    "color": COLORS.index(main.color),
    "count": scene.count - 1,
    "background": BACKGROUNDS.index(scene.background),
    "size": SIZES.index(main.size),
  }


def zero_shot_prompts(kind: str) -> list[list[str]]:
  """For every class of ``kind`` (CLASS_NAMES order), prompts in caption grammar.

  ``kind`` is a key of CLASS_NAMES, or "family" (the T1 level, in FAMILIES
  order). Class embeddings are usually the mean of the prompt embeddings.
  """
  if kind == "shape":
    return [
      [with_article(s), f"a picture of {with_article(s)}", f"a photo of {with_article(s)}"]
      for s in SHAPES
    ]
  if kind == "family":
    return [
      [with_article(f"{f} shape"), f"a picture of {with_article(f'{f} shape')}"]
      + [with_article(s) for s in SHAPE_FAMILIES[f]]
      for f in FAMILIES
    ]
  if kind == "color":
    # Colour words need a noun; averaging over all shapes marginalises it.
    return [
      [with_article(f"{c} {s}") for s in SHAPES] + [with_article(f"{c} shape")] for c in COLORS
    ]
  if kind == "count":
    prompts = []
    for count, word in enumerate(COUNT_WORDS, start=1):
      noun = "shape" if count == 1 else "shapes"
      prompts.append(
        [f"{word} {noun}", f"a picture of {word} {noun}", f"a shape{_others_phrase(count)}"]
      )
    return prompts
  if kind == "background":
    return [
      [
        f"a shape on {with_article(b)} background",
        f"a picture on {with_article(b)} background",
        with_article(f"{b} background"),
      ]
      for b in BACKGROUNDS
    ]
  if kind == "size":
    return [
      [with_article(f"{z} shape"), f"a picture of {with_article(f'{z} shape')}"]
      + [with_article(f"{z} {s}") for s in SHAPES]
      for z in SIZES
    ]
  raise ValueError(f"unknown kind {kind!r}; valid kinds: {list(CLASS_NAMES) + ['family']}")


def caption_corpus() -> list[str]:
  """Every sentence of the world's grammar: all tiers, negatives and prompts.

  Negatives are recombinations of the same attributes, so enumerating all
  tier captions covers them; this is the tokenizer's training text.
  """
  sentences = []
  sentences += [with_article(f"{f} shape") for f in FAMILIES]
  sentences += [with_article(s) for s in SHAPES]
  sentences += [with_article(f"{c} {s}") for c in COLORS for s in SHAPES]
  for size, color, shape, count, background in itertools.product(
    SIZES, COLORS, SHAPES, range(1, MAX_OBJECTS + 1), BACKGROUNDS
  ):
    sentences.append(_scene_caption(size, color, shape, count, background))
  for kind in list(CLASS_NAMES) + ["family"]:
    for class_prompts in zero_shot_prompts(kind):
      sentences += class_prompts
  # dict.fromkeys: de-duplicate while keeping a deterministic order.
  return list(dict.fromkeys(sentences))
