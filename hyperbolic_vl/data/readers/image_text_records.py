"""Random-access sources of real image-text data.

Both sources follow grain's RandomAccessDataSource protocol (``__len__`` and
``__getitem__``) and fail early with errors that name the file at fault:
data problems on a pod are far cheaper to fix at construction time than an
hour into training.
"""

from __future__ import annotations

import csv
import gzip
import io
import os
import pathlib
from typing import Any

import numpy as np
from absl import logging as absl_logging
from PIL import Image

from hyperbolic_vl import errors
from hyperbolic_vl.data.readers import tfds_import
from hyperbolic_vl.data.readers.tar_shards import BadSampleError, EncodedImage


def open_csv_text(path: pathlib.Path) -> io.StringIO:
  """A CSV file (gzip when it ends in .gz) as text for csv.reader.

  Decoded whole, so that bytes that are not UTF-8 stop the run at start-up
  with the file and line named, not as a UnicodeDecodeError mid-read; a
  byte-order mark is dropped (spreadsheets write one, and it would become
  part of the first column's name).
  """
  data = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
  try:
    return io.StringIO(data.decode("utf-8-sig"), newline="")
  except UnicodeDecodeError as error:
    line = data.count(b"\n", 0, error.start) + 1
    raise errors.DataError(
      f"{path}: line {line} is not UTF-8 (byte {data[error.start]:#04x} at offset "
      f"{error.start}); save the file as UTF-8"
    ) from None


class ImageTextCsvSource:
  """Image-text pairs listed in a CSV file, images in a folder.

  Each row names an image (a path relative to ``image_root``, or a URL whose
  last path component is the file name in ``image_root``, as in the
  HierarCaps CSVs) and a caption. Items are
  ``{"image": uint8 (H, W, 3) RGB, "caption": str}``; with ``decode=False``
  the image is an EncodedImage (the file's bytes), which the training
  pipeline decodes once it knows the crop (JPEG draft mode).
  """

  def __init__(
    self,
    csv_path: str | os.PathLike,
    image_root: str | os.PathLike,
    image_column: str = "image",
    caption_column: str = "caption",
    decode: bool = True,
  ):
    self.decode = decode
    self.csv_path = pathlib.Path(csv_path)
    self.image_root = pathlib.Path(image_root)
    if not self.csv_path.is_file():
      raise FileNotFoundError(f"image-text CSV not found: {self.csv_path}")
    if not self.image_root.is_dir():
      raise FileNotFoundError(f"image_root folder not found: {self.image_root}")
    with open_csv_text(self.csv_path) as f:
      reader = csv.DictReader(f)
      columns = reader.fieldnames or []
      missing = [c for c in (image_column, caption_column) if c not in columns]
      if missing:
        if not columns:
          raise errors.DataError(f"{self.csv_path} is empty: no header line, no rows")
        raise errors.DataError(
          f"{self.csv_path} has no column(s) {missing}; columns: {columns} (set "
          "input.data.image_column / caption_column to the names it uses)"
        )
      self._rows = [(row[image_column], row[caption_column]) for row in reader]

  def __len__(self) -> int:
    return len(self._rows)

  def image_path(self, index: int) -> pathlib.Path:
    reference = self._rows[index][0]
    if "://" in reference:
      reference = reference.rstrip("/").rsplit("/", 1)[-1]
    return self.image_root / reference

  def __getitem__(self, index: int) -> dict[str, Any]:
    index = int(index)
    if not 0 <= index < len(self._rows):
      raise IndexError(f"row {index} out of range for {len(self._rows)} rows")
    path = self.image_path(index)
    if not self.decode:
      try:
        data = path.read_bytes()
      except OSError as error:
        raise BadSampleError(
          f"cannot read image {path} (row {index} of {self.csv_path}): {error}"
        ) from error
      return {"image": EncodedImage(data, str(path)), "caption": self._rows[index][1]}
    try:
      with Image.open(path) as image:
        # convert() forces the full decode here, so truncated files fail now.
        pixels = np.asarray(image.convert("RGB"), dtype=np.uint8)
    except (OSError, ValueError, SyntaxError) as error:
      # PIL reports missing, truncated and unreadable files as OSError
      # subclasses (UnidentifiedImageError included).
      raise BadSampleError(
        f"cannot read image {path} (row {index} of {self.csv_path}): {error}"
      ) from error
    return {"image": pixels, "caption": self._rows[index][1]}

  def __repr__(self) -> str:
    return (
      f"ImageTextCsvSource(csv_path={str(self.csv_path)!r}, "
      f"image_root={str(self.image_root)!r}, rows={len(self._rows)})"
    )


def tfds_source(name: str, split: str, data_dir: str | os.PathLike | None = None):
  """Random access (array_record) to a prepared TFDS dataset.

  Never downloads: the dataset must already be prepared in ``data_dir`` with
  ``file_format=array_record`` (random access is what grain needs).
  """
  tfds = tfds_import.tensorflow_datasets()  # deferred: TensorFlow takes seconds to import

  where = f"data_dir={str(data_dir)!r}" if data_dir is not None else "the default TFDS data_dir"
  # Looking for a dataset that is not there, TFDS logs a WARNING per folder
  # it tried ("Variant folder ... has no dataset_info.json"); the one line
  # below says it better. Kept with --log_info (absl at INFO).
  verbosity = absl_logging.get_verbosity()
  if verbosity < absl_logging.INFO:
    absl_logging.set_verbosity(absl_logging.ERROR)
  try:
    builder = tfds.builder(name, data_dir=data_dir)
    prepared = builder.is_prepared()
  except tfds.core.registered.DatasetNotFoundError as error:
    raise ValueError(f"unknown TFDS dataset {name!r}") from error
  finally:
    absl_logging.set_verbosity(verbosity)
  prepare_hint = (
    f"prepare it on a machine with internet access with `tfds build "
    f"{name} --data_dir=<data_dir> --file_format=array_record` and "
    "copy the folder over"
  )
  if not prepared:
    raise FileNotFoundError(
      f"TFDS dataset {name!r} is not prepared in {where} "
      f"(looked for {builder.data_dir}); {prepare_hint}"
    )
  try:
    return builder.as_data_source(split=split)
  except NotImplementedError as error:
    raise ValueError(
      f"TFDS dataset {name!r} in {where} is stored as "
      f"{builder.info.file_format}, which has no random access; {prepare_hint}"
    ) from error
