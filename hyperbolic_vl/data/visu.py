"""ViSU quadruplets (`input.data.name="visu"`): HySAC's training data.

Each example is (safe image, safe caption, unsafe image, unsafe caption)
from a ViSU JSON or CSV (data/readers/visu_records.py): the safe image a
COCO image found under `safe_image_root` (its train2017, val2017 and
test2017 folders), the unsafe image found under `unsafe_image_root`.
Images are preprocessed as the release's CLIPProcessor does, without
augmentation: the centre square, resized bicubically to `input.image_size`
(CLIP's resize-shorter-side-then-centre-crop); pixel statistics are the
model's (`model.pixel_stats`). Batches carry `image`, `tokens`,
`unsafe_image`, `unsafe_tokens` and `index`.

ViSU's unsafe images are not public. At start-up the source looks every
unsafe image up once: when none is there it stops with one line saying
what to prepare; when some are missing it says how many, once, and each
such quadruplet (like one whose image does not decode) is skipped, replaced
by the next, and counted (`input/bad_samples`).

Evaluation splits read `eval_path` (default `path`). A file of captions
only (ViSU-Text: `safe`, `nsfw`, `tag`) gives a caption-only split:
`tokens` and `unsafe_tokens`, no images.
"""

from __future__ import annotations

import dataclasses
import logging
import pathlib
from typing import Any

import numpy as np

from hyperbolic_vl import errors
from hyperbolic_vl.data import image_text, pipeline, registry, transforms
from hyperbolic_vl.data.readers import tar_shards
from hyperbolic_vl.data.readers import visu_records as records_lib
from hyperbolic_vl.data.settings import SourceSettings

PREPARE_UNSAFE_IMAGES = (
  "ViSU's unsafe images are not public: generate or obtain them, put them under "
  "input.data.unsafe_image_root so that each entry's nsfw_im_path (or its file name) "
  "resolves there, or train on the synthetic world (data=world_quadruplets)"
)


@dataclasses.dataclass(frozen=True)
class VisuSettings(SourceSettings):
  source = "visu"
  path: str = ""  # the training split's ViSU JSON or CSV
  eval_path: str = ""  # the evaluation split's (default: path); ViSU-Text for captions only
  safe_image_root: str = ""  # COCO 2017: train2017/, val2017/, test2017/
  unsafe_image_root: str = ""  # the generated unsafe images
  num_train: int = 0  # cap on the training quadruplets; 0: all
  num_eval: int = 0  # default size of an evaluation split; 0: all


def load_image(path: pathlib.Path | None, name: str, image_size: int) -> np.ndarray:
  """uint8 (size, size, 3): the centre square, bicubic (CLIPProcessor's
  resize and centre crop); BadSampleError when missing or undecodable."""
  if path is None:
    raise tar_shards.BadSampleError(f"{name}: image not found")
  try:
    data = path.read_bytes()
  except OSError as error:
    raise tar_shards.BadSampleError(f"{name}: {errors.one_line(error)}") from None
  image = tar_shards.decode_image(data, str(path))
  return transforms.resize_window(image, transforms.center_square_box(image), image_size)


@dataclasses.dataclass(frozen=True)
class ResolvedQuadruplets:
  """The records with their image paths resolved once (None: missing)."""

  records: list
  safe_paths: list
  unsafe_paths: list

  def __len__(self) -> int:
    return len(self.records)

  def images(self, index: int, image_size: int) -> tuple[np.ndarray, np.ndarray]:
    name = f"quadruplet {index}"
    safe = load_image(self.safe_paths[index], f"{name} safe image", image_size)
    unsafe = load_image(self.unsafe_paths[index], f"{name} unsafe image", image_size)
    return safe, unsafe


def resolve(settings: VisuSettings, path: str, limit: int) -> ResolvedQuadruplets:
  """Reads a ViSU file with images and looks every image up once; stops
  with one line when the roots are wrong or no unsafe image is there."""
  records = records_lib.read_quadruplets(path)[: limit or None]
  if not records:
    raise errors.DataError(f"ViSU file {path} has no entries")
  if not records[0].has_images:
    raise errors.DataError(
      f"{path} holds captions only (ViSU-Text); training needs the ViSU JSON with "
      "coco_id and nsfw_im_path"
    )
  safe_root = pathlib.Path(image_text.required_setting(settings, "safe_image_root"))
  unsafe_root = pathlib.Path(image_text.required_setting(settings, "unsafe_image_root"))
  for key, root in (("safe_image_root", safe_root), ("unsafe_image_root", unsafe_root)):
    if not root.is_dir():
      raise errors.DataError(f"input.data.{key} is not a folder: {root}")
  safe_paths = [records_lib.safe_image_path(r, safe_root) for r in records]
  unsafe_paths = [records_lib.unsafe_image_path(r, unsafe_root) for r in records]
  missing_unsafe = sum(p is None for p in unsafe_paths)
  if missing_unsafe == len(records):
    raise errors.DataError(
      f"none of the {len(records)} unsafe images of {path} is under {unsafe_root} "
      f"(first: {records[0].unsafe_image!r}). {PREPARE_UNSAFE_IMAGES}"
    )
  missing_safe = sum(p is None for p in safe_paths)
  if missing_safe == len(records):
    raise errors.DataError(
      f"none of the {len(records)} safe images of {path} is under {safe_root} "
      f"(looked in {', '.join(records_lib.COCO_FOLDERS)} and the folder itself)"
    )
  if missing_unsafe or missing_safe:
    logging.warning(
      "visu %s: %d of %d unsafe and %d safe images are missing; those quadruplets are "
      "skipped and counted as bad samples. %s",
      path,
      missing_unsafe,
      len(records),
      missing_safe,
      PREPARE_UNSAFE_IMAGES if missing_unsafe else "",
    )
  return ResolvedQuadruplets(records, safe_paths, unsafe_paths)


@dataclasses.dataclass(frozen=True)
class VisuTrainExample:
  """(epoch, index) -> quadruplet `index`; a missing or undecodable image
  replaces it by the next one, its name reported for counting."""

  quadruplets: ResolvedQuadruplets
  image_size: int

  def __call__(self, epoch: int, index: int) -> dict[str, Any]:
    del epoch  # no augmentation, as the release
    bad_names = []
    for _ in range(image_text.MAX_BAD_IN_A_ROW):
      try:
        safe, unsafe = self.quadruplets.images(index, self.image_size)
        break
      except tar_shards.BadSampleError as error:
        bad_names.append(str(error))
        index = (index + 1) % len(self.quadruplets)
    else:
      raise errors.DataError(
        f"{image_text.MAX_BAD_IN_A_ROW} bad ViSU quadruplets in a row, first: {bad_names[:3]}"
      )
    record = self.quadruplets.records[index]
    return {
      "image": safe,
      "caption": record.safe_caption,
      "unsafe_image": unsafe,
      "unsafe_caption": record.unsafe_caption,
      "index": index,
      "bad_names": bad_names,
    }


@registry.register
class VisuSource(registry.DataSource):
  """ViSU quadruplets: safe and unsafe images with their captions."""

  name = "visu"
  eval_source = "visu"
  Settings = VisuSettings
  batch_keys = (
    "image",
    "tokens",
    "unsafe_image",
    "unsafe_tokens",
    "index",
    "input/bad_samples",
    "input/bad_names",
  )

  def num_train_examples(self, settings):
    path = image_text.required_setting(settings, "path")
    count = len(records_lib.read_quadruplets(path))
    return min(count, settings.num_train or count)

  def train_iterator(self, input_settings, settings, tokenizer, *, seed, **layout):
    pipeline.check_layout(input_settings.batch_size, seed=seed, **layout)
    tokenizer = input_settings.resolve_tokenizer(tokenizer)
    path = image_text.required_setting(settings, "path")
    quadruplets = resolve(settings, path, settings.num_train)
    make_example = VisuTrainExample(quadruplets, input_settings.need_image_size())
    encoder = transforms.CachedEncoder(tokenizer, cache=False)
    return pipeline.example_input(
      make_example, encoder, len(quadruplets), input_settings, seed=seed, **layout
    )

  def eval_split(self, input_settings, settings, tokenizer, split, num_examples):
    """tokens, unsafe_tokens, index; with images also image and
    unsafe_image (N, H, W, 3) float32 in [0, 1]. Quadruplets with a missing
    or undecodable image are left out."""
    tokenizer = input_settings.resolve_tokenizer(tokenizer)
    path = settings.eval_path or image_text.required_setting(settings, "path")
    records = records_lib.read_quadruplets(path)
    if num_examples is None:
      num_examples = settings.num_eval or len(records)
    records = records[:num_examples]
    if not records:
      raise errors.DataError(f"ViSU file {path} has no entries")
    if not records[0].has_images:
      return {
        "tokens": tokenizer.encode([r.safe_caption for r in records]),
        "unsafe_tokens": tokenizer.encode([r.unsafe_caption for r in records]),
        "index": np.arange(len(records), dtype=np.int64),
      }
    quadruplets = resolve(settings, path, num_examples)
    image_size = input_settings.need_image_size()
    kept, safe_images, unsafe_images = [], [], []
    for index, record in enumerate(quadruplets.records):
      try:
        safe, unsafe = quadruplets.images(index, image_size)
      except tar_shards.BadSampleError:
        continue
      kept.append(record)
      safe_images.append(safe)
      unsafe_images.append(unsafe)
    scale = np.float32(1.0 / 255.0)
    return {
      "image": np.stack(safe_images).astype(np.float32) * scale,
      "tokens": tokenizer.encode([r.safe_caption for r in kept]),
      "unsafe_image": np.stack(unsafe_images).astype(np.float32) * scale,
      "unsafe_tokens": tokenizer.encode([r.unsafe_caption for r in kept]),
      "index": np.arange(len(kept), dtype=np.int64),
    }
