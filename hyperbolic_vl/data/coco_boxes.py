"""Object boxes for HCL: the synthetic world (exact) or a COCO-style instances JSON.

Both providers expose the same small interface, used by the HCL example maker:
  len(provider)                  number of scenes
  provider.boxes(i)              (n, 4) float32 normalised xyxy object boxes
  provider.labels(i)             (n,) int32 class of every object
  provider.render(i, box, size)  uint8 (size, size, 3) pixels of window `box`
  provider.open(i)               the scene once (one JPEG decode), whose
                                 .render(box, size) crops it any number of times

COCO boxes are [x, y, w, h] in pixels; crowd annotations and tiny boxes
(w * h <= min_area, 56 x 56 px as HCL's appendix) are dropped, and images
left with no box are skipped (counted in `skipped_images`).
"""

from __future__ import annotations

import json
import pathlib

import numpy as np
from PIL import Image

from hyperbolic_vl.data import world

HCL_MIN_BOX_AREA = 56 * 56  # pixels (HCL appendix: "small objects are always detrimental")


class WorldBoxes:
  """Scenes `split` of the synthetic world; crops rendered exactly (render_region)."""

  def __init__(self, world_seed: int = 0, split: str = "train", num_scenes: int = 100_000):
    self.world_seed, self.split, self.num_scenes = world_seed, split, num_scenes

  def __len__(self) -> int:
    return self.num_scenes

  def scene(self, index: int):
    return world.sample_scene(self.world_seed, self.split, int(index))

  def boxes(self, index: int) -> np.ndarray:
    return world.object_boxes(self.scene(index))

  def labels(self, index: int) -> np.ndarray:
    return world.object_labels(self.scene(index))

  def render(self, index: int, box, size: int) -> np.ndarray:
    return self.open(index).render(box, size)

  def open(self, index: int) -> _WorldScene:
    return _WorldScene(self.scene(index))


class _WorldScene:
  def __init__(self, scene):
    self.scene = scene

  def render(self, box, size: int) -> np.ndarray:
    return world.render_region(self.scene, np.asarray(box, np.float64), size)


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


class CocoBoxes:
  """COCO instances JSON (`images`, `annotations`, `categories`) + image folder."""

  def __init__(self, annotations_path, image_root, *, min_area: float = HCL_MIN_BOX_AREA):
    self.image_root = pathlib.Path(image_root)
    if not self.image_root.is_dir():
      raise FileNotFoundError(f"COCO image folder not found: {self.image_root}")
    with open(annotations_path) as f:
      data = json.load(f)
    categories = sorted(c["id"] for c in data.get("categories", []))
    self.category_index = {cid: i for i, cid in enumerate(categories)}
    per_image: dict[int, list] = {}
    for ann in data["annotations"]:
      x, y, w, h = ann["bbox"]
      if ann.get("iscrowd", 0) or w * h <= min_area or w <= 0 or h <= 0:
        continue
      per_image.setdefault(ann["image_id"], []).append((x, y, w, h, ann["category_id"]))
    self.items = []
    self.skipped_images = 0
    for image in data["images"]:
      anns = per_image.get(image["id"])
      if not anns:
        self.skipped_images += 1
        continue
      width, height = float(image["width"]), float(image["height"])
      boxes = np.asarray(
        [[x / width, y / height, (x + w) / width, (y + h) / height] for x, y, w, h, _ in anns],
        np.float32,
      ).clip(0, 1)
      labels = np.asarray([self.category_index.get(c, -1) for *_, c in anns], np.int32)
      self.items.append((self.image_root / image["file_name"], boxes, labels))

  def __len__(self) -> int:
    return len(self.items)

  def boxes(self, index: int) -> np.ndarray:
    return self.items[index][1]

  def labels(self, index: int) -> np.ndarray:
    return self.items[index][2]

  def render(self, index: int, box, size: int) -> np.ndarray:
    return self.open(index).render(box, size)

  def open(self, index: int) -> _DecodedImage:
    with Image.open(self.items[index][0]) as image:
      return _DecodedImage(image.convert("RGB"))
