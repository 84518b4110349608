"""Writes the small in-repository fixtures used when ../shared/data is absent.

    python tests/data/make_fixtures.py

hierarcaps_mini/: six 64x64 JPEG photographs-in-miniature (smooth gradients
with a coloured disc, so JPEG decoding and resizing are exercised on real
JPEG bytes) and a CSV in the HierarCaps test format (id, captions joined by
" => ", image_url ending in the file name). traversal_texts.json: a text pool
in MERU's traversal format (captions, nouns, adjectives).
"""

import csv
import json
import pathlib

import numpy as np
from PIL import Image

HERE = pathlib.Path(__file__).resolve().parent

ROWS = [
  ("bird", "blue bird", "blue bird on a branch", "A blue bird sitting on a branch in autumn."),
  ("table", "table with plates", "table with three plates", "A table with three plates of food."),
  ("dog", "brown dog", "brown dog on the grass", "A brown dog running across the grass."),
  ("car", "red car", "red car on a street", "A red car parked on a quiet street."),
  ("cake", "chocolate cake", "chocolate cake on a plate", "A slice of chocolate cake on a plate."),
  ("boat", "small boat", "small boat on a lake", "A small white boat floating on a calm lake."),
]
COLOURS = [
  (40, 90, 220),
  (200, 170, 120),
  (140, 90, 40),
  (210, 30, 30),
  (90, 50, 20),
  (240, 240, 240),
]


def make_image(index: int) -> Image.Image:
  size = 64
  y, x = np.mgrid[0:size, 0:size] / (size - 1)
  background = np.stack([x * 255, y * 255, (1 - x) * 160 + 40], -1)
  disc = (x - 0.3 - 0.07 * index) ** 2 + (y - 0.5) ** 2 < 0.06
  background[disc] = COLOURS[index]
  return Image.fromarray(background.astype(np.uint8))


def main():
  folder = HERE / "hierarcaps_mini"
  (folder / "images").mkdir(parents=True, exist_ok=True)
  with open(folder / "hierarcaps_mini.csv", "w", newline="") as f:
    writer = csv.writer(f)
    writer.writerow(["id", "captions", "image_url"])
    for i, tiers in enumerate(ROWS):
      name = f"COCO_val2014_{i:012d}.jpg"
      make_image(i).save(folder / "images" / name, quality=85)
      writer.writerow([i, " => ".join(tiers), f"http://images.cocodataset.org/val2014/{name}"])
  pool = {
    "captions": [tiers[-1] for tiers in ROWS],
    "nouns": sorted({tiers[0] for tiers in ROWS} | {"animal", "food", "vehicle"}),
    "adjectives": ["blue", "brown", "red", "small", "white"],
  }
  (HERE / "traversal_texts.json").write_text(json.dumps(pool, indent=1) + "\n")


if __name__ == "__main__":
  main()
