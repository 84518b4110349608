"""HySAC's quadruplet sources: the world's (`world_quadruplets`: the unsafe
image is the safe one with the marked attribute drawn, the unsafe caption
names it) and ViSU files (`visu`: release layout, image roots, missing
and corrupt images counted, caption-only ViSU-Text), built in the test."""

import json
import logging
import pathlib
import shutil

import numpy as np
import pytest
from paths import SHARED_DATA
from PIL import Image

from hyperbolic_vl import errors
from hyperbolic_vl.data import registry
from hyperbolic_vl.data import synthetic_quadruplets as quadruplets
from hyperbolic_vl.data import synthetic_world as world


class _Lookup:
  """A stand-in tokenizer: each distinct text gets an id, decodable exactly."""

  context_length = 4

  def __init__(self):
    self.ids: dict[str, int] = {}

  def encode(self, texts):
    rows = np.zeros((len(texts), self.context_length), np.int32)
    for row, text in enumerate(texts):
      rows[row, 0] = self.ids.setdefault(text, len(self.ids) + 1)
    return rows

  def decode(self, row) -> str:
    return {value: text for text, value in self.ids.items()}[int(row[0])]


def input_config(name, batch_size=8, image_size=16, **data):
  return {"batch_size": batch_size, "image_size": image_size, "data": {"name": name, **data}}


def iterator(config, tokenizer, seed=3, process_index=0, process_count=1):
  return registry.make_train_iterator(
    config, tokenizer, seed=seed, process_index=process_index, process_count=process_count
  )


# -- the world's quadruplets ----------------------------------------------------
def test_unsafe_caption_names_the_marked_attribute():
  assert quadruplets.unsafe_caption("a red circle") == "an unsafe red circle"
  assert (
    quadruplets.unsafe_caption("an orange ring alone on a gray background")
    == "an unsafe orange ring alone on a gray background"
  )


def test_world_quadruplets_differ_exactly_by_the_drawn_and_named_mark():
  tokenizer = _Lookup()
  batch = next(iterator(input_config("world_quadruplets", num_train=32), tokenizer))
  assert set(batch) == set(registry.get("world_quadruplets").batch_keys)
  assert batch["unsafe_image"].shape == batch["image"].shape == (8, 16, 16, 3)
  assert batch["unsafe_image"].dtype == np.uint8
  for row in range(8):
    safe, unsafe = batch["image"][row], batch["unsafe_image"][row]
    changed = np.any(safe != unsafe, axis=-1)
    # The mark changes a visible share of pixels, all to white, and nothing else.
    assert 0.02 < changed.mean() < 0.5, changed.mean()
    assert (unsafe[changed] == 255).all()
    caption = tokenizer.decode(batch["tokens"][row])
    assert tokenizer.decode(batch["unsafe_tokens"][row]) == quadruplets.unsafe_caption(caption)
    scene = world.sample_scene(0, "train", int(batch["index"][row]))
    assert caption == world.caption_tiers(scene)[-1]  # default: T4


def test_world_quadruplets_two_processes_concatenate_and_resume_exactly():
  config = input_config("world_quadruplets", num_train=32)
  tokenizer = _Lookup()
  whole = next(iterator(config, tokenizer))
  halves = [next(iterator(config, tokenizer, process_index=i, process_count=2)) for i in (0, 1)]
  for key in ("image", "unsafe_image", "unsafe_tokens", "index"):
    np.testing.assert_array_equal(np.concatenate([h[key] for h in halves]), whole[key])
  it = iterator(config, tokenizer)
  next(it)
  state = it.get_state()
  expected = next(it)
  resumed = iterator(config, tokenizer)
  resumed.set_state(state)
  np.testing.assert_array_equal(next(resumed)["unsafe_image"], expected["unsafe_image"])


def test_world_quadruplets_eval_split_has_both_halves():
  tokenizer = _Lookup()
  split = registry.load_eval_split(
    input_config("world_quadruplets"), tokenizer, "validation", num_examples=4
  )
  assert split["unsafe_image"].shape == split["image"].shape == (4, 16, 16, 3)
  for row in range(4):
    scene = world.sample_scene(0, "validation", row)
    np.testing.assert_allclose(
      split["unsafe_image"][row] * 255, quadruplets.render_unsafe(scene, 16), atol=1e-3
    )
    assert tokenizer.decode(split["unsafe_tokens"][row]) == quadruplets.unsafe_caption(
      tokenizer.decode(split["tokens"][row])
    )


# -- ViSU files -------------------------------------------------------------------
def write_visu(tmp_path: pathlib.Path, images, *, missing_unsafe=(), corrupt_safe=()):
  """A ViSU split in the release's layout: a dict keyed by row numbers,
  wrapped in {"info", "data"}; safe images as COCO val2017 files, unsafe
  images under their own root (nsfw_im_path absolute, as the release writes
  them on its cluster, resolved here by file name)."""
  coco, unsafe_root = tmp_path / "coco", tmp_path / "unsafe"
  (coco / "val2017").mkdir(parents=True)
  unsafe_root.mkdir()
  entries = {}
  for row, (safe_image, unsafe_image, safe, nsfw) in enumerate(images):
    coco_id = 1000 + row
    safe_path = coco / "val2017" / f"{coco_id:012d}.jpg"
    if row in corrupt_safe:
      safe_path.write_bytes(b"not a jpeg")
    else:
      # PNG bytes under COCO's .jpg name: decoded by content, and exact.
      Image.fromarray(safe_image).save(safe_path, format="PNG")
    if row not in missing_unsafe:
      Image.fromarray(unsafe_image).save(unsafe_root / f"gen_{row}.png")
    entries[str(row)] = {
      "coco_id": coco_id,
      "nsfw_im_path": f"/cluster/visu/train/gen_{row}.png",
      "safe": safe,
      "nsfw": nsfw,
    }
  path = tmp_path / "visu_train.json"
  path.write_text(json.dumps({"info": {"split": "train"}, "data": entries}))
  return dict(path=str(path), safe_image_root=str(coco), unsafe_image_root=str(unsafe_root))


def world_images(count, size=24):
  """(safe, unsafe, safe caption, unsafe caption) of world scenes, non-square
  (size x 2 size) so the centre crop is exercised."""
  out = []
  for index in range(count):
    scene = world.sample_scene(5, "train", index)
    safe = np.concatenate([world.render(scene, size)] * 2, axis=1)
    unsafe = np.concatenate([quadruplets.render_unsafe(scene, size)] * 2, axis=1)
    caption = world.caption_tiers(scene)[-1]
    out.append((safe, unsafe, caption, quadruplets.unsafe_caption(caption)))
  return out


def test_visu_reads_the_release_layout_with_centre_square_preprocessing(tmp_path):
  images = world_images(4)
  data = write_visu(tmp_path, images)
  tokenizer = _Lookup()
  batch = next(iterator(input_config("visu", batch_size=4, image_size=24, **data), tokenizer))
  for row, index in enumerate(batch["index"]):
    safe, unsafe, caption, nsfw = images[int(index)]
    assert tokenizer.decode(batch["tokens"][row]) == caption
    assert tokenizer.decode(batch["unsafe_tokens"][row]) == nsfw
    # The centre square of a (24, 48) image is its columns 12..36, kept at
    # 24 px (the resize is the identity).
    np.testing.assert_array_equal(batch["unsafe_image"][row], unsafe[:, 12:36])
    np.testing.assert_array_equal(batch["image"][row], safe[:, 12:36])
  assert int(batch["input/bad_samples"].sum()) == 0


def test_visu_missing_and_corrupt_images_are_counted_bad_samples(tmp_path, caplog):
  data = write_visu(tmp_path, world_images(6), missing_unsafe=(1,), corrupt_safe=(4,))
  tokenizer = _Lookup()
  config = input_config("visu", batch_size=6, image_size=16, **data)
  with caplog.at_level(logging.WARNING):
    batch = next(iterator(config, tokenizer))
  # Reported once, with what to prepare.
  warnings = [r.getMessage() for r in caplog.records if "images are missing" in r.message]
  assert len(warnings) == 1 and "not public" in warnings[0], warnings
  assert int(batch["input/bad_samples"].sum()) == 2
  assert 1 not in batch["index"].tolist() and 4 not in batch["index"].tolist()
  names = "\n".join(batch["input/bad_names"])
  assert "quadruplet 1 unsafe image: image not found" in names and "000000001004.jpg" in names


def test_visu_without_any_unsafe_image_says_what_to_prepare(tmp_path):
  data = write_visu(tmp_path, world_images(3), missing_unsafe=(0, 1, 2))
  with pytest.raises(errors.DataError, match="none of the 3 unsafe images.*not public"):
    iterator(input_config("visu", **data), _Lookup())


def test_visu_text_gives_a_caption_only_split(tmp_path):
  """ViSU-Text (the public captions, `safe`, `nsfw`, `tag`) as a CSV."""
  path = tmp_path / "visu_text_test.csv"
  path.write_text("safe,nsfw,tag\na dog on a couch,an unsafe dog,violence\nsky,dark sky,hate\n")
  tokenizer = _Lookup()
  config = input_config("visu", path=str(path))
  split = registry.load_eval_split(config, tokenizer, "test")
  assert set(split) == {"tokens", "unsafe_tokens", "index"}
  assert [tokenizer.decode(r) for r in split["unsafe_tokens"]] == ["an unsafe dog", "dark sky"]
  with pytest.raises(errors.DataError, match="captions only"):
    iterator(config, tokenizer)


def test_visu_eval_split_from_the_images_of_shared_data(tmp_path):
  """Real COCO photographs (../shared/data) as the safe images and their
  left-right mirrors as stand-in unsafe ones; skipped without the folder."""
  folder = SHARED_DATA / "hierarcaps_sample" / "images"
  if not folder.is_dir():
    pytest.skip(f"{folder} is absent")
  files = sorted(folder.glob("*.jpg"))[:3]
  coco, unsafe_root = tmp_path / "coco", tmp_path / "unsafe"
  (coco / "train2017").mkdir(parents=True)
  unsafe_root.mkdir()
  entries = []
  for row, file in enumerate(files):
    shutil.copy(file, coco / "train2017" / f"{row + 1:012d}.jpg")
    Image.open(file).convert("RGB").transpose(Image.Transpose.FLIP_LEFT_RIGHT).save(
      unsafe_root / f"{row}.png"
    )
    entries.append(
      {
        "coco_id": row + 1,
        "nsfw_im_path": f"{row}.png",
        "safe": f"photo {row}",
        "nsfw": f"unsafe photo {row}",
      }
    )
  path = tmp_path / "visu.json"
  path.write_text(json.dumps(entries))
  config = input_config(
    "visu",
    image_size=32,
    path=str(path),
    safe_image_root=str(coco),
    unsafe_image_root=str(unsafe_root),
  )
  split = registry.load_eval_split(config, _Lookup(), "test")
  assert split["image"].shape == split["unsafe_image"].shape == (3, 32, 32, 3)
  # A centred square of a mirrored photo is the mirrored centre square.
  np.testing.assert_allclose(split["unsafe_image"], split["image"][:, :, ::-1], atol=0.1)
