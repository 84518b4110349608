"""HierarCaps (Alper & Averbuch-Elor, ECCV 2024) loaders.

Released files:
  test  `id, captions, image_url`        captions = "T1 => T2 => T3 => T4"
  train `positive, negative, image_url`  (optionally .csv.gz) four positive and
                                         four negative tiers, tier by tier
Tiers are most general first. The image of a row is the last path component
of `image_url`, looked up in an image folder (the MS-COCO files).

Malformed rows (wrong number of tiers, empty tiers, missing image) are never
guessed at: each is recorded as a `RowProblem` with its row number (1-based,
header excluded, as a spreadsheet shows data rows) and skipped, and the loader
logs them all. `strict=True` raises instead.

The synthetic world supplies the same structure (`world.caption_tiers`,
`world.negative_tiers`); data/tiers.py turns either into the text-only batches
the radial objective trains on.
"""

from __future__ import annotations

import csv
import dataclasses
import logging
import pathlib

import numpy as np
from PIL import Image

from hyperbolic_vl import errors
from hyperbolic_vl.data.readers import image_text_records as sources

SEPARATOR = " => "
NUM_TIERS = 4


@dataclasses.dataclass(frozen=True)
class RowProblem:
  row: int  # 1-based data row number (header not counted)
  reason: str

  def __str__(self) -> str:
    return f"row {self.row}: {self.reason}"


@dataclasses.dataclass
class HierarCapsSplit:
  """Parsed rows that passed every check, plus the rows that did not."""

  tiers: list[list[str]]  # (N, 4) positive tiers
  negatives: list[list[str]] | None  # (N, 4) for the train file, else None
  image_paths: list[pathlib.Path | None]
  ids: list[str]
  rows: list[int]  # the source row number of each kept item
  problems: list[RowProblem]

  def __len__(self) -> int:
    return len(self.tiers)


def split_tiers(text: str, separator: str = SEPARATOR) -> list[str]:
  """ "a => b => c => d" -> ["a", "b", "c", "d"]; raises ValueError if malformed."""
  if text is None:
    raise ValueError("missing caption field")
  tiers = [t.strip() for t in text.split(separator.strip())] if separator.strip() else []
  # Split on the bare arrow, then strip: tolerates "a=>b" spacing variants
  # while still counting tiers exactly.
  if len(tiers) != NUM_TIERS:
    raise ValueError(f"expected {NUM_TIERS} tiers separated by {separator!r}, got {len(tiers)}")
  if any(not t for t in tiers):
    raise ValueError("empty tier")
  return tiers


def image_file_name(reference: str) -> str:
  """The file name of an image reference (URL or relative path)."""
  reference = reference.strip()
  if "://" in reference:
    return reference.rstrip("/").rsplit("/", 1)[-1]
  return reference


def _load(
  csv_path,
  image_root,
  *,
  positive_column: str,
  negative_column: str | None,
  strict: bool,
  check_images: bool,
) -> HierarCapsSplit:
  csv_path = pathlib.Path(csv_path)
  if not csv_path.is_file():
    raise FileNotFoundError(f"HierarCaps CSV not found: {csv_path}")
  root = pathlib.Path(image_root) if image_root else None
  if root is not None and not root.is_dir():
    raise FileNotFoundError(f"HierarCaps image folder not found: {root}")
  split = HierarCapsSplit([], [] if negative_column else None, [], [], [], [])
  with sources.open_csv_text(csv_path) as f:
    reader = csv.DictReader(f)
    columns = reader.fieldnames or []
    needed = [positive_column] + ([negative_column] if negative_column else [])
    needed += ["image_url"] if root is not None else []
    if not columns:
      raise errors.DataError(f"{csv_path} is empty; expected a header row with {needed}")
    missing = [c for c in needed if c not in columns]
    if missing:
      raise errors.DataError(f"{csv_path} has no column(s) {missing}; columns: {columns}")
    for row_number, row in enumerate(reader, start=1):
      try:
        if None in row:  # DictReader puts surplus fields under the key None
          raise ValueError(f"{len(columns) + len(row[None])} fields, expected {len(columns)}")
        tiers = split_tiers(row[positive_column])
        negatives = split_tiers(row[negative_column]) if negative_column else None
        path = None
        if root is not None:
          name = image_file_name(row.get("image_url") or "")
          if not name:
            raise ValueError("empty image_url")
          path = root / name
          if check_images and not path.is_file():
            raise ValueError(f"image {path} not found")
      except ValueError as error:
        problem = RowProblem(row_number, str(error))
        if strict:
          raise ValueError(f"{csv_path}: {problem}") from error
        split.problems.append(problem)
        continue
      split.tiers.append(tiers)
      if negative_column:
        split.negatives.append(negatives)
      split.image_paths.append(path)
      split.ids.append(row.get("id", str(row_number)))
      split.rows.append(row_number)
  if split.problems:
    logging.warning(
      "%s: skipped %d malformed row(s):\n  %s",
      csv_path,
      len(split.problems),
      "\n  ".join(map(str, split.problems)),
    )
  return split


def load_test(
  csv_path, image_root, *, strict: bool = False, check_images: bool = True
) -> HierarCapsSplit:
  """The test CSV (`id, captions, image_url`) with images in `image_root`."""
  return _load(
    csv_path,
    image_root,
    positive_column="captions",
    negative_column=None,
    strict=strict,
    check_images=check_images,
  )


def load_train(
  csv_path, image_root=None, *, strict: bool = False, check_images: bool = True
) -> HierarCapsSplit:
  """The train CSV (`positive, negative, image_url`); images optional.

  The RE objective trains on text only, so `image_root=None` skips image
  resolution entirely.
  """
  return _load(
    csv_path,
    image_root,
    positive_column="positive",
    negative_column="negative",
    strict=strict,
    check_images=check_images,
  )


def load_image(path, size: int) -> np.ndarray:
  """Centre square crop resized to (size, size, 3) float32 in [0, 1]."""
  with Image.open(path) as image:
    image = image.convert("RGB")
    width, height = image.size
    side = min(width, height)
    left, top = (width - side) // 2, (height - side) // 2
    image = image.crop((left, top, left + side, top + side)).resize((size, size), Image.BICUBIC)
    return np.asarray(image, np.float32) / 255.0


def load_images(split: HierarCapsSplit, size: int) -> np.ndarray:
  return np.stack([load_image(p, size) for p in split.image_paths])
