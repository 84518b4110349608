"""ViSU quadruplet files (HySAC's and Safe-CLIP's data set).

A ViSU split is a JSON file whose entries are
`{"coco_id": int, "nsfw_im_path": str, "safe": str, "nsfw": str}`, as a
dict keyed by the row number ("0", "1", ...), or wrapped as
`{"info": ..., "data": {...}}`, or as a list. The safe image is the COCO
image with that id, `<coco_root>/{train2017,val2017,test2017}/<12-digit
id>.jpg` (the first folder holding it, as the release searches); the unsafe
image is a generated image that ViSU does not publish, named by
`nsfw_im_path`. ViSU-Text (the public part, Hugging Face
`aimagelab/ViSU-Text`) has only the captions: `safe`, `nsfw`, `tag`.

A CSV with a header is read the same way: columns `safe` and `nsfw`, and
for images `coco_id` (or `safe_image`, a path under the safe root) and
`nsfw_im_path` (or `unsafe_image`).
"""

from __future__ import annotations

import csv
import dataclasses
import json
import os
import pathlib

from hyperbolic_vl import errors
from hyperbolic_vl.data.readers import image_text_records

COCO_FOLDERS = ("train2017", "val2017", "test2017")


@dataclasses.dataclass(frozen=True)
class Quadruplet:
  safe_caption: str
  unsafe_caption: str
  coco_id: int | None = None  # the safe image as a COCO id ...
  safe_image: str = ""  # ... or as a path under the safe-image root
  unsafe_image: str = ""  # a path (absolute, or under the unsafe-image root)
  tag: str = ""

  @property
  def has_images(self) -> bool:
    return (self.coco_id is not None or bool(self.safe_image)) and bool(self.unsafe_image)


def _entries_of_json(data, path) -> list[dict]:
  if isinstance(data, dict) and "data" in data:
    data = data["data"]
  if isinstance(data, dict):
    try:
      keys = sorted(data, key=int)
    except ValueError:
      raise errors.DataError(f"{path}: ViSU entries are keyed by row numbers") from None
    return [data[key] for key in keys]
  if isinstance(data, list):
    return data
  raise errors.DataError(f"{path}: expected a ViSU dict or list of entries, got {type(data)}")


def _quadruplet(entry: dict, where: str) -> Quadruplet:
  missing = [key for key in ("safe", "nsfw") if key not in entry]
  if missing:
    raise errors.DataError(f"{where} has no {missing}; keys: {sorted(entry)}")
  coco_id = entry.get("coco_id")
  coco_id = None if coco_id in (None, "") else int(coco_id)
  return Quadruplet(
    safe_caption=str(entry["safe"]),
    unsafe_caption=str(entry["nsfw"]),
    coco_id=coco_id,
    safe_image=str(entry.get("safe_image") or ""),
    unsafe_image=str(entry.get("nsfw_im_path") or entry.get("unsafe_image") or ""),
    tag=str(entry.get("tag") or ""),
  )


def read_quadruplets(path: str | os.PathLike) -> list[Quadruplet]:
  """Every entry of a ViSU JSON or CSV file, in row order."""
  path = pathlib.Path(path)
  if not path.is_file():
    raise errors.DataError(f"ViSU file not found: {path}")
  if path.suffix in (".csv", ".gz"):
    with image_text_records.open_csv_text(path) as f:
      entries = list(csv.DictReader(f))
  else:
    try:
      entries = _entries_of_json(json.loads(path.read_text("utf-8")), path)
    except json.JSONDecodeError as error:
      raise errors.DataError(f"{path}: not JSON ({error})") from None
  return [_quadruplet(entry, f"{path}: entry {i}") for i, entry in enumerate(entries)]


def coco_image_path(coco_root: pathlib.Path, coco_id: int) -> pathlib.Path | None:
  """The COCO 2017 image of this id under any split folder (or the root)."""
  name = f"{coco_id:012d}.jpg"
  for folder in (*COCO_FOLDERS, ""):
    candidate = coco_root / folder / name
    if candidate.is_file():
      return candidate
  return None


def safe_image_path(record: Quadruplet, root: pathlib.Path) -> pathlib.Path | None:
  if record.coco_id is not None:
    return coco_image_path(root, record.coco_id)
  path = root / record.safe_image
  return path if path.is_file() else None


def unsafe_image_path(record: Quadruplet, root: pathlib.Path | None) -> pathlib.Path | None:
  """An absolute path as written (the release stores them), else or when
  absent, the path (then its file name) under the unsafe-image root."""
  written = pathlib.Path(record.unsafe_image)
  candidates = [written] if written.is_absolute() else []
  if root is not None:
    candidates += [root / record.unsafe_image.lstrip("/"), root / written.name]
  for candidate in candidates:
    if candidate.is_file():
      return candidate
  return None
