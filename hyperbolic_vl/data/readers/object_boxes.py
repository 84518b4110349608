"""Object boxes for HCL: the synthetic world (exact) or a COCO-style instances JSON.

Both providers expose the same small interface, used by the HCL example maker:
  len(provider)                  number of scenes
  provider.boxes(i)              (n, 4) float32 normalised xyxy object boxes
  provider.pixel_boxes(i)        (n, 4) int64 xyxy boxes in pixels, truncated
                                 as HCL's released loader (int(x * width))
  provider.pixel_size(i)         (width, height) of the scene in pixels
  provider.labels(i)             (n,) int32 class of every object
  provider.render(i, box, size)  uint8 (size, size, 3) pixels of window `box`
  provider.open(i)               the scene once (one JPEG decode), whose
                                 .render(box, size) (normalised window) and
                                 .render_pixels(box, size) (window in pixels)
                                 crop it any number of times

COCO boxes are [x, y, w, h] in pixels; crowd annotations and empty boxes are
dropped, and images left with no box are skipped (counted in
`skipped_images`). Small boxes stay: the example maker drops boxes under
56 x 56 px (data/scene_objects.py, `min_box_pixels`), as the released loader
does when it draws an example. The world has no pixels of its own: its
scenes are read as `pixels` x `pixels` images (512 by default: the smallest
world object, 0.12 of the side, is then 61 px wide, above the released
56 px filter, and main objects of 154-307 px fall either side of the
256 px below which the released loader widens the object window).
"""

from __future__ import annotations

import json
import pathlib

import numpy as np
from PIL import Image

from hyperbolic_vl.data import synthetic_world as world

HCL_MIN_BOX_AREA = 56 * 56  # pixels (HCL appendix: "small objects are always detrimental")
WORLD_SCENE_PIXELS = 512  # the world's nominal image side for HCL's pixel rules


class WorldBoxes:
  """Scenes `split` of the synthetic world; crops rendered exactly (render_region)."""

  def __init__(
    self,
    world_seed: int = 0,
    split: str = "train",
    num_scenes: int = 100_000,
    pixels: int = WORLD_SCENE_PIXELS,
  ):
    self.world_seed, self.split, self.num_scenes = world_seed, split, num_scenes
    self.pixels = int(pixels)

  def __len__(self) -> int:
    return self.num_scenes

  def scene(self, index: int):
    return world.sample_scene(self.world_seed, self.split, int(index))

  def boxes(self, index: int) -> np.ndarray:
    return world.object_boxes(self.scene(index))

  def pixel_boxes(self, index: int) -> np.ndarray:
    return np.floor(self.boxes(index).astype(np.float64) * self.pixels).astype(np.int64)

  def pixel_size(self, index: int) -> tuple[int, int]:
    del index
    return self.pixels, self.pixels

  def labels(self, index: int) -> np.ndarray:
    return world.object_labels(self.scene(index))

  def render(self, index: int, box, size: int) -> np.ndarray:
    return self.open(index).render(box, size)

  def open(self, index: int) -> _WorldScene:
    return _WorldScene(self.scene(index), self.pixels)


class _WorldScene:
  def __init__(self, scene, pixels: int):
    self.scene, self.pixels = scene, pixels

  def render(self, box, size: int) -> np.ndarray:
    return world.render_region(self.scene, np.asarray(box, np.float64), size)

  def render_pixels(self, box, size: int) -> np.ndarray:
    return self.render(np.asarray(box, np.float64) / self.pixels, size)


class _DecodedImage:
  """One decoded image; each crop is resized from it (HCL takes four)."""

  def __init__(self, image: Image.Image):
    self.image = image

  def render(self, box, size: int) -> np.ndarray:
    width, height = self.image.size
    x0, y0, x1, y1 = np.asarray(box, np.float64)
    crop = self.image.crop(
      (
        int(x0 * width),
        int(y0 * height),
        max(int(np.ceil(x1 * width)), int(x0 * width) + 1),
        max(int(np.ceil(y1 * height)), int(y0 * height) + 1),
      )
    )
    return np.asarray(crop.resize((size, size), Image.BICUBIC), np.uint8)

  def render_pixels(self, box, size: int) -> np.ndarray:
    """The window `box` (xyxy pixels, rounded to whole ones) resized to size."""
    x0, y0, x1, y1 = (int(round(float(v))) for v in box)
    crop = self.image.crop((x0, y0, max(x1, x0 + 1), max(y1, y0 + 1)))
    return np.asarray(crop.resize((size, size), Image.BICUBIC), np.uint8)


class CocoBoxes:
  """COCO instances JSON (`images`, `annotations`, `categories`) + image folder."""

  def __init__(self, annotations_path, image_root):
    self.image_root = pathlib.Path(image_root)
    if not self.image_root.is_dir():
      raise FileNotFoundError(f"COCO image folder not found: {self.image_root}")
    with open(annotations_path) as f:
      data = json.load(f)
    categories = sorted(data.get("categories", []), key=lambda c: c["id"])
    self.category_index = {c["id"]: i for i, c in enumerate(categories)}
    # Label i's name ("traffic light"): HyCoCLIP's COCO source's box phrase.
    self.category_names = [str(c.get("name", c["id"])) for c in categories]
    per_image: dict[int, list] = {}
    for ann in data["annotations"]:
      x, y, w, h = ann["bbox"]
      if ann.get("iscrowd", 0) or w <= 0 or h <= 0:
        continue
      per_image.setdefault(ann["image_id"], []).append((x, y, w, h, ann["category_id"]))
    self.items = []
    self.image_ids = []  # COCO image id of every item (captions are keyed by it)
    self.skipped_images = 0
    for image in data["images"]:
      anns = per_image.get(image["id"])
      if not anns:
        self.skipped_images += 1
        continue
      width, height = int(image["width"]), int(image["height"])
      corners = np.asarray([[x, y, x + w, y + h] for x, y, w, h, _ in anns], np.float64)
      size = np.asarray([width, height, width, height], np.float64)
      boxes = (corners / size).astype(np.float32).clip(0, 1)
      pixel_boxes = np.floor(np.clip(corners, 0, size)).astype(np.int64)
      labels = np.asarray([self.category_index.get(c, -1) for *_, c in anns], np.int32)
      self.items.append(
        (self.image_root / image["file_name"], boxes, labels, pixel_boxes, (width, height))
      )
      self.image_ids.append(image["id"])

  def __len__(self) -> int:
    return len(self.items)

  def image_path(self, index: int) -> pathlib.Path:
    return self.items[index][0]

  def boxes(self, index: int) -> np.ndarray:
    return self.items[index][1]

  def pixel_boxes(self, index: int) -> np.ndarray:
    return self.items[index][3]

  def pixel_size(self, index: int) -> tuple[int, int]:
    return self.items[index][4]

  def labels(self, index: int) -> np.ndarray:
    return self.items[index][2]

  def render(self, index: int, box, size: int) -> np.ndarray:
    return self.open(index).render(box, size)

  def open(self, index: int) -> _DecodedImage:
    with Image.open(self.items[index][0]) as image:
      return _DecodedImage(image.convert("RGB"))
