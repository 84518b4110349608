"""Random access to image-text tar shards (webdataset / RedCaps layout).

A shard is a plain tar file whose members are grouped by key: ``KEY.jpg``
(or .jpeg/.png/.webp) holds the image, and ``KEY.json`` (a dict with a
caption field, ``caption`` by default) or ``KEY.txt`` the caption. This is the
webdataset convention, also used by MERU's RedCaps shards (one ``.jpg`` and one
``.json`` per example, the caption under ``caption``).

Tar files have no index, so a one-time scan records, per example, the byte
offsets and sizes of its image and caption members. The index is cached as
JSON (next to the shards, or in ``cache_dir`` when the shard folder is
read-only), keyed by each shard's path, size and modification time, so a
changed shard is re-indexed. With the index the shards are a random-access
source: grain shuffles globally, gives each process its slice, and resumes
exactly from its iterator state.

HyCoCLIP's grounded shards (a whole image, its caption and per box an image
crop and a phrase, as its GRIT preparation script writes them) have their
own scan and reader, GritShardSource, on the same index cache.

Bad images are a fact of web data. ``decode_image`` converts what it can to
8-bit RGB (CMYK, 16-bit, alpha, palette, greyscale) and raises
``BadSampleError`` for the rest (truncated, not an image); the training
pipeline skips and counts those.
"""

from __future__ import annotations

import dataclasses
import glob
import hashlib
import io
import json
import os
import pathlib
import re
import tarfile
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from PIL import Image

from hyperbolic_vl import errors, files

IMAGE_EXTENSIONS = ("jpg", "jpeg", "png", "webp")
CAPTION_EXTENSIONS = ("json", "txt")
_INDEX_VERSION = 1
_BRACE = re.compile(r"\{(\d+)\.\.(\d+)\}")


class BadSampleError(ValueError):
  """An example that cannot be used (its image does not decode)."""


def expand_pattern(pattern: str) -> list[str]:
  """Shard paths from a brace range (``shard-{000..099}.tar``), a glob, or a
  comma-separated list of either; zero padding follows the range's width."""
  paths = []
  for part in (p.strip() for p in pattern.split(",")):
    if not part:
      continue
    match = _BRACE.search(part)
    if match:
      first, last = match.group(1), match.group(2)
      width = len(first)
      for number in range(int(first), int(last) + 1):
        paths += expand_pattern(
          part[: match.start()] + str(number).zfill(width) + part[match.end() :]
        )
    elif any(c in part for c in "*?["):
      paths += sorted(glob.glob(part))
    else:
      paths.append(part)
  return paths


def decode_image(
  data: bytes,
  name: str = "",
  draft_size: Callable[[int, int], tuple[int, int]] | None = None,
) -> np.ndarray:
  """uint8 (H, W, 3) RGB from encoded bytes; BadSampleError when impossible."""
  return np.asarray(decode_rgb_image(data, name, draft_size), dtype=np.uint8)


def decode_rgb_image(
  data: bytes,
  name: str = "",
  draft_size: Callable[[int, int], tuple[int, int]] | None = None,
) -> Image.Image:
  """A decoded RGB PIL image (kept as PIL so that a crop and resize follow
  without copying the full-size pixels into NumPy and back).

  draft_size(width, height) -> the smallest (width, height) the caller needs
  the whole image decoded at. A JPEG is then decoded by libjpeg's DCT scaling
  at the coarsest of 1/2, 1/4, 1/8 that still gives at least that size, which
  skips most of the decode work when a crop is downscaled anyway.
  """
  try:
    # No `with`: the returned image must stay usable, and an in-memory
    # file holds no handle to release.
    image = Image.open(io.BytesIO(data))
    if draft_size is not None:
      wanted = draft_size(*image.size)
      if image.format == "JPEG" and image.mode in ("RGB", "L"):
        image.draft(image.mode, wanted)
    image.load()  # full decode now: truncated files fail here
    return _rgb_image(image)
  except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as error:
    # The message names the file and the kind of failure only: PIL's text can
    # hold object addresses, and names must be reproducible across runs.
    raise BadSampleError(f"{name} ({type(error).__name__})") from error


@dataclasses.dataclass(frozen=True)
class EncodedImage:
  """An image's file bytes, left encoded by a source so that the pipeline
  decodes it once it knows the crop (see decode_image's draft_size)."""

  data: bytes
  name: str

  def decode(self, draft_size: Callable[[int, int], tuple[int, int]] | None = None) -> np.ndarray:
    return decode_image(self.data, self.name, draft_size)

  def decode_rgb_image(
    self, draft_size: Callable[[int, int], tuple[int, int]] | None = None
  ) -> Image.Image:
    return decode_rgb_image(self.data, self.name, draft_size)


def _rgb_image(image: Image.Image) -> Image.Image:
  if image.mode == "RGB":
    return image
  if image.mode in ("I;16", "I;16B", "I;16L", "I"):
    # 16-bit greyscale: keep the top 8 bits (convert("RGB") would clip).
    pixels = np.asarray(image, dtype=np.uint32)
    shift = 8 if pixels.max(initial=0) > 255 else 0
    grey = (pixels >> shift).clip(0, 255).astype(np.uint8)
    return Image.fromarray(np.repeat(grey[..., None], 3, axis=-1))
  if image.mode == "P":
    image = image.convert("RGBA")
  if image.mode in ("RGBA", "LA"):
    # Transparent pixels become white, not whatever colour they hide.
    background = Image.new("RGB", image.size, (255, 255, 255))
    background.paste(image, mask=image.getchannel("A"))
    image = background
  return image.convert("RGB")


def _shard_fingerprint(path: str, layout: str = "") -> str:
  stat = os.stat(path)
  text = f"{os.path.abspath(path)}|{stat.st_size}|{stat.st_mtime_ns}|{_INDEX_VERSION}"
  if layout:
    # One shard may be indexed in two layouts; their caches must not collide.
    text += f"|{layout}"
  return hashlib.sha1(text.encode()).hexdigest()[:16]


def scan_shard(path: str) -> list[list[Any]]:
  """[key, image (offset, size, ext), caption (offset, size, ext)] per example
  that has both an image and a caption member, in tar order."""
  members: dict[str, dict[str, tuple[int, int, str]]] = {}
  order = []
  with tarfile.open(path, "r:") as tar:
    for info in tar:
      if not info.isfile():
        continue
      base = os.path.basename(info.name)
      if base.startswith("."):
        continue
      key, _, ext = info.name.partition(".")  # webdataset: key = up to the first dot
      ext = ext.lower()
      kind = (
        "image" if ext in IMAGE_EXTENSIONS else "caption" if ext in CAPTION_EXTENSIONS else None
      )
      if kind is None:
        continue
      if key not in members:
        members[key] = {}
        order.append(key)
      # json beats txt when a key has both.
      if kind in members[key] and ext == "txt":
        continue
      members[key][kind] = (info.offset_data, info.size, ext)
  return [
    [key, list(members[key]["image"]), list(members[key]["caption"])]
    for key in order
    if "image" in members[key] and "caption" in members[key]
  ]


def load_index(
  path: str,
  cache_dir: str | None = None,
  scan: Callable[[str], list[list[Any]]] = scan_shard,
  layout: str = "",
) -> list[list[Any]]:
  """The shard's index (`scan` of it, `layout` naming that scan), from the
  cache when its fingerprint matches."""
  fingerprint = _shard_fingerprint(path, layout)
  candidates = []
  if cache_dir:
    candidates.append(pathlib.Path(cache_dir) / f"{pathlib.Path(path).name}.{fingerprint}.idx.json")
  candidates.append(pathlib.Path(f"{path}.{fingerprint}.idx.json"))
  for candidate in candidates:
    if candidate.is_file():
      with open(candidate, encoding="utf-8") as f:
        return json.load(f)
  index = scan(path)
  for candidate in candidates:
    try:
      # Aside then renamed: concurrent hosts never read half a file.
      files.write_file_atomically(str(candidate), json.dumps(index))
      break
    except OSError:
      continue  # read-only location: try the next, else keep it in memory only
  return index


class TarShardSource:
  """Random-access image-text examples from tar shards.

  Items are ``{"image": uint8 (H, W, 3), "caption": str, "name": str}``;
  ``__getitem__`` raises BadSampleError for an image that cannot be decoded
  and for a caption that cannot be read. With ``decode=False`` the image is
  an EncodedImage, decoded (and its errors raised) by whoever crops it.
  """

  def __init__(
    self,
    pattern: str | Sequence[str],
    caption_key: str = "caption",
    cache_dir: str | os.PathLike | None = None,
    decode: bool = True,
  ):
    self.paths = _shard_paths(pattern)
    self.caption_key = caption_key
    self.decode = decode
    self._entries = []  # (shard number, key, image, caption)
    for shard, path in enumerate(self.paths):
      for key, image, caption in load_index(path, None if cache_dir is None else str(cache_dir)):
        self._entries.append((shard, key, tuple(image), tuple(caption)))
    if not self._entries:
      raise ValueError(f"tar shards {pattern!r} hold no image-caption pairs")

  def __len__(self) -> int:
    return len(self._entries)

  def name(self, index: int) -> str:
    shard, key, image, _ = self._entries[index]
    return f"{self.paths[shard]}:{key}.{image[2]}"

  def _read(self, shard: int, offset: int, size: int) -> bytes:
    # One open per read: safe across threads and forked workers.
    with open(self.paths[shard], "rb") as f:
      f.seek(offset)
      return f.read(size)

  def __getitem__(self, index: int) -> dict[str, Any]:
    index = int(index)
    if not 0 <= index < len(self._entries):
      raise IndexError(f"example {index} out of range for {len(self._entries)} examples")
    shard, _, image, caption = self._entries[index]
    name = self.name(index)
    encoded = EncodedImage(self._read(shard, image[0], image[1]), name)
    pixels = encoded if not self.decode else encoded.decode()
    text = self._read(shard, caption[0], caption[1]).decode("utf-8", errors="replace")
    if caption[2] == "json":
      try:
        text = json.loads(text)[self.caption_key]
      except (ValueError, KeyError, TypeError) as error:
        raise BadSampleError(f"{name}: no caption field {self.caption_key!r}") from error
    return {"image": pixels, "caption": str(text).strip(), "name": name}

  def __repr__(self) -> str:
    return f"TarShardSource(shards={len(self.paths)}, examples={len(self._entries)})"


# HyCoCLIP's grounded shards (its utils/prepare_GRIT_webdataset.py): per key,
# the whole image and its caption, the number of boxes, and per box NNN an
# image crop and its noun phrase (or referring expression):
#   KEY.child.jpg  KEY.child.txt  KEY.numparents.txt
#   KEY.parent000.jpg  KEY.parent000.txt  KEY.parent001.jpg ...
_GRIT_MEMBER = re.compile(r"^(child|parent(\d+))\.(\w+)$")
# Part of the index cache's fingerprint: "grit2" indexes record box numbers,
# numparents and keys without a box (the multi-box reading needs them).
GRIT_LAYOUT = "grit2"
# numparents as scanned: absent, or present but not an integer.
NUMPARENTS_ABSENT = -1
NUMPARENTS_UNREADABLE = -2


def _numparents(tar: tarfile.TarFile, info: tarfile.TarInfo) -> int:
  try:
    return int(tar.extractfile(info).read().decode("utf-8").strip())
  except (ValueError, UnicodeDecodeError, OSError, tarfile.TarError):
    return NUMPARENTS_UNREADABLE


def scan_grit_shard(path: str) -> list[list[Any]]:
  """[key, child image (offset, size, ext), child caption (offset, size),
  [[box image (offset, size, ext), box phrase (offset, size), box number], ...],
  numparents] per key with a whole image and a caption, in tar order; the
  complete boxes (image and phrase) in the order of their numbers; numparents
  the integer of KEY.numparents.txt, or NUMPARENTS_ABSENT / _UNREADABLE."""
  members: dict[str, dict[Any, list]] = {}
  numparents: dict[str, int] = {}
  with tarfile.open(path, "r:") as tar:
    for info in tar:
      if not info.isfile() or os.path.basename(info.name).startswith("."):
        continue
      key, _, field = info.name.partition(".")
      if field.lower() == "numparents.txt":
        numparents[key] = _numparents(tar, info)
        continue
      match = _GRIT_MEMBER.match(field.lower())
      if match is None:
        continue
      role = -1 if match.group(1) == "child" else int(match.group(2))
      ext = match.group(3)
      kind = "image" if ext in IMAGE_EXTENSIONS else "text" if ext == "txt" else None
      if kind is None:
        continue
      entry = members.setdefault(key, {}).setdefault(role, {})
      entry[kind] = (
        [info.offset_data, info.size, ext] if kind == "image" else [info.offset_data, info.size]
      )
  index = []
  for key, roles in members.items():
    child = roles.get(-1, {})
    boxes = [
      [roles[number]["image"], roles[number]["text"], number]
      for number in sorted(n for n in roles if n >= 0)
      if len(roles[number]) == 2
    ]
    if "image" in child and "text" in child:
      index.append(
        [key, child["image"], child["text"], boxes, numparents.get(key, NUMPARENTS_ABSENT)]
      )
  return index


def _shard_paths(pattern: str | Sequence[str]) -> list[str]:
  paths = expand_pattern(pattern) if isinstance(pattern, str) else list(pattern)
  if not paths:
    raise FileNotFoundError(f"no tar shards match {pattern!r}")
  missing = [p for p in paths if not os.path.isfile(p)]
  if missing:
    raise FileNotFoundError(f"tar shard(s) not found: {missing[:5]}")
  return paths


class GritShardSource:
  """Random access to grounded examples in HyCoCLIP's GRIT shard layout.

  ``source[i]`` is ``{"image": EncodedImage, "caption": str, "num_boxes": n,
  "name": str}`` (n complete boxes); ``source.box(i, k)`` is the k-th complete
  box's ``(EncodedImage, phrase)``, and ``source.first_boxes(i, n)`` the
  release's first n boxes by number (UNCHA). Only the boxes asked for are
  read. Images stay encoded: whoever crops them decodes them (and gets
  BadSampleError for an undecodable one).

  Keys without a complete box are left out unless ``keep_boxless`` (the
  multi-box reading keeps them, so that they are counted as bad samples).
  """

  def __init__(
    self,
    pattern: str | Sequence[str],
    cache_dir: str | os.PathLike | None = None,
    keep_boxless: bool = False,
  ):
    self.paths = _shard_paths(pattern)
    self._entries = []  # (shard number, key, image, caption, boxes, numparents)
    samples = 0
    for shard, path in enumerate(self.paths):
      index = load_index(
        path, None if cache_dir is None else str(cache_dir), scan_grit_shard, GRIT_LAYOUT
      )
      samples += len(index)
      for key, image, caption, boxes, numparents in index:
        if boxes or keep_boxless:
          self._entries.append((shard, key, tuple(image), tuple(caption), boxes, numparents))
    if not any(entry[4] for entry in self._entries):
      # Every sample would be skipped as bad: the shards as a whole are unusable.
      held = f"{samples} samples, none with" if samples else "no sample with"
      raise errors.DataError(
        f"tar shards {pattern!r} hold {held} a box: a grounded example needs KEY.child.jpg, "
        "KEY.child.txt and at least one KEY.parentNNN.jpg/.txt pair (HyCoCLIP's "
        "prepare_GRIT_webdataset.py layout)"
      )

  def __len__(self) -> int:
    return len(self._entries)

  def _read(self, shard: int, offset: int, size: int) -> bytes:
    with open(self.paths[shard], "rb") as f:
      f.seek(offset)
      return f.read(size)

  def _text(self, shard: int, member) -> str:
    return self._read(shard, member[0], member[1]).decode("utf-8", errors="replace").strip()

  def _entry(self, index: int):
    index = int(index)
    if not 0 <= index < len(self._entries):
      raise IndexError(f"example {index} out of range for {len(self._entries)} examples")
    return self._entries[index]

  def __getitem__(self, index: int) -> dict[str, Any]:
    shard, key, image, caption, boxes, _ = self._entry(index)
    name = f"{self.paths[shard]}:{key}.child.{image[2]}"
    return {
      "image": EncodedImage(self._read(shard, image[0], image[1]), name),
      "caption": self._text(shard, caption),
      "num_boxes": len(boxes),
      "name": name,
    }

  def _box(self, shard: int, key: str, box) -> tuple[EncodedImage, str]:
    image, phrase, number = box
    name = f"{self.paths[shard]}:{key}.parent{number:03d}.{image[2]}"
    return EncodedImage(self._read(shard, image[0], image[1]), name), self._text(shard, phrase)

  def box(self, index: int, number: int) -> tuple[EncodedImage, str]:
    shard, key, _, _, boxes, _ = self._entry(index)
    return self._box(shard, key, boxes[number])

  def first_boxes(self, index: int, max_boxes: int) -> list[tuple[EncodedImage, str]]:
    """Boxes 0 .. min(max_boxes, numparents) - 1 by number, as UNCHA's
    released loader reads them (no draw). BadSampleError when the example
    has no box, its numparents is unreadable, or one of those boxes lacks its
    image or phrase. Without numparents.txt the numbered boxes count."""
    shard, key, _, _, boxes, numparents = self._entry(index)
    where = f"{self.paths[shard]}:{key}"
    if numparents == NUMPARENTS_UNREADABLE:
      raise BadSampleError(f"{where}.numparents.txt is not an integer")
    if numparents == NUMPARENTS_ABSENT:
      numparents = 1 + max((box[2] for box in boxes), default=-1)
    by_number = {box[2]: box for box in boxes}
    limit = min(max_boxes, numparents)
    if limit <= 0:
      raise BadSampleError(f"{where}: no box (numparents {numparents})")
    missing = [number for number in range(limit) if number not in by_number]
    if missing:
      raise BadSampleError(f"{where}.parent{missing[0]:03d}: box image or phrase missing")
    return [self._box(shard, key, by_number[number]) for number in range(limit)]

  def __repr__(self) -> str:
    return f"GritShardSource(shards={len(self.paths)}, examples={len(self._entries)})"
