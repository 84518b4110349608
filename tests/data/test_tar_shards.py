"""Tar-shard input: index, bad-sample policy, per-process slices, exact resume."""

import io
import json
import pathlib
import tarfile

import jax
import numpy as np
import pytest
from paths import HIERARCAPS_MINI, SHARED_DATA
from PIL import Image

from configs import meru as meru_config
from hyperbolic_vl.data import image_text, registry, transforms
from hyperbolic_vl.data import tokenizer as tokenizer_lib
from hyperbolic_vl.data.readers import tar_shards
from hyperbolic_vl.runs import metrics_io
from hyperbolic_vl.tools import input_throughput
from hyperbolic_vl.training import input_health, loop

SAMPLE_IMAGES = SHARED_DATA / "hierarcaps_sample" / "images"
# Example order across the two shards; "truncated" and "not_an_image" cannot
# be decoded, the others can (after conversion). Each bad example is followed
# by a good one, so every pass over the data skips exactly two examples.
LAYOUT = [
  ["good", "good", "truncated", "good", "good", "alpha_png", "good", "good"],
  ["good", "cmyk", "good", "not_an_image", "good", "good", "good", "good"],
]
BAD_PER_EPOCH = 2
NUM_EXAMPLES = 16


def _jpeg_bytes(image: Image.Image, **kwargs) -> bytes:
  buffer = io.BytesIO()
  image.save(buffer, format="JPEG", quality=90, **kwargs)
  return buffer.getvalue()


def _good_images():
  """Small RGB images: the HierarCaps sample's COCO photos when present."""
  if SAMPLE_IMAGES.is_dir():
    files = sorted(SAMPLE_IMAGES.glob("*.jpg"))[:NUM_EXAMPLES]
    if len(files) >= NUM_EXAMPLES:
      for path in files:
        with Image.open(path) as image:
          yield image.convert("RGB").resize((40, 30))
      return
  rng = np.random.default_rng(0)
  for _ in range(NUM_EXAMPLES):
    yield Image.fromarray(rng.integers(0, 256, (30, 40, 3), dtype=np.uint8))


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
  info = tarfile.TarInfo(name)
  info.size = len(data)
  tar.addfile(info, io.BytesIO(data))


def build_shards(folder: pathlib.Path) -> str:
  images = _good_images()
  count = 0
  for shard, kinds in enumerate(LAYOUT):
    with tarfile.open(folder / f"shard-{shard:06d}.tar", "w") as tar:
      for kind in kinds:
        image = next(images)
        key = f"{count:05d}"
        if kind == "truncated":
          name, data = f"{key}.jpg", _jpeg_bytes(image)[:300]
        elif kind == "alpha_png":
          rgba = image.convert("RGBA")
          rgba.putalpha(128)
          buffer = io.BytesIO()
          rgba.save(buffer, format="PNG")
          name, data = f"{key}.png", buffer.getvalue()
        elif kind == "cmyk":
          name, data = f"{key}.jpg", _jpeg_bytes(image.convert("CMYK"))
        elif kind == "not_an_image":
          name, data = f"{key}.jpg", b"this is a caption file, not a JPEG\n"
        else:
          name, data = f"{key}.jpg", _jpeg_bytes(image)
        _add(tar, name, data)
        caption = f"a red circle number {count}"
        if count % 2:
          _add(tar, f"{key}.txt", caption.encode())
        else:  # RedCaps / webdataset style: json with extra fields
          _add(tar, f"{key}.json", json.dumps({"caption": caption, "subreddit": "pics"}).encode())
        count += 1
  return str(folder / "shard-{000000..000001}.tar")


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
  return build_shards(tmp_path_factory.mktemp("shards"))


def test_index_and_decoding(shards, tmp_path):
  paths = tar_shards.expand_pattern(shards)
  assert [pathlib.Path(p).name for p in paths] == ["shard-000000.tar", "shard-000001.tar"]
  assert tar_shards.expand_pattern(shards.replace("{000000..000001}", "*")) == paths
  source = tar_shards.TarShardSource(shards, cache_dir=tmp_path / "cache")
  assert len(source) == NUM_EXAMPLES
  # The index is cached (keyed by path, size and mtime) and reused.
  assert len(list((tmp_path / "cache").glob("*.idx.json"))) == 2
  assert len(tar_shards.TarShardSource(shards, cache_dir=tmp_path / "cache")) == NUM_EXAMPLES
  bad = []
  for index in range(len(source)):
    try:
      item = source[index]
    except tar_shards.BadSampleError:
      bad.append(index)
      continue
    assert item["image"].dtype == np.uint8 and item["image"].shape == (30, 40, 3)
    assert item["caption"] == f"a red circle number {index}"
  assert bad == [2, 11]
  # Half-transparent PNG: composited on white, so every pixel is >= 127.
  assert source[5]["image"].min() >= 127


def _input_config(shards, batch_size=8):
  return {
    "batch_size": batch_size,
    "image_size": 16,
    "data": {"name": "tar_shards", "path": shards},
    "tokenizer": {"name": "world_sentencepiece", "context_length": 32},
  }


def test_process_slices_concatenate_to_the_single_process_batch(shards, tmp_path):
  tokenizer = tokenizer_lib.world_tokenizer(context_length=32, cache_dir=tmp_path)
  config = _input_config(shards)
  single = registry.make_train_iterator(config, tokenizer, seed=3, process_index=0, process_count=1)
  halves = [
    registry.make_train_iterator(config, tokenizer, seed=3, process_index=i, process_count=2)
    for i in range(2)
  ]
  total_bad = 0
  for _ in range(4):  # two epochs
    whole = next(single)
    parts = [next(half) for half in halves]
    assert whole["image"].shape[0] == 8 and parts[0]["image"].shape[0] == 4
    for key in whole:
      np.testing.assert_array_equal(
        np.concatenate([p[key] for p in parts]), whole[key], err_msg=key
      )
    total_bad += int(whole["input/bad_samples"].sum())
  assert total_bad == 2 * BAD_PER_EPOCH


def _train_config(shards, **overrides):
  config = meru_config.get_config("data=tar_shards")
  with config.unlocked():
    config.input.batch_size = 8
    config.input.image_size = 16
    config.input.data.path = shards
    config.input.max_bad_fraction = 0.5
    config.total_steps = 20
    config.ckpt_steps = 10
    config.log_training_steps = 1
    config.optim.warmup_steps = 2
    for key, value in overrides.items():
      target = config
      *parents, leaf = key.split(".")
      for parent in parents:
        target = target[parent]
      target[leaf] = value
  return config


def _bad_samples_logged(workdir) -> float:
  per_step = {r["step"]: r.get("train/input/bad_samples") for r in metrics_io.read_metrics(workdir)}
  return sum(v for v in per_step.values() if v is not None)


@pytest.mark.slow  # three 10-20 step MERU runs: ~2 min on a busy 2-core machine
def test_meru_trains_on_shards_with_bad_files_and_resumes_exactly(shards, tmp_path):
  config = _train_config(shards)
  full = loop.train(config, str(tmp_path / "full"))
  assert full.step == 20
  # 20 steps x 8 = 160 examples = 10 passes over 16, two bad files per pass.
  assert _bad_samples_logged(str(tmp_path / "full")) == 10 * BAD_PER_EPOCH
  assert loop.train(config, str(tmp_path / "resumed"), stop_at_step=10).step == 10
  resumed = loop.train(config, str(tmp_path / "resumed"))
  assert resumed.step == 20
  assert _bad_samples_logged(str(tmp_path / "resumed")) == 10 * BAD_PER_EPOCH
  # Same machine, same programs, same data: the parameters agree bitwise.
  jax.tree.map(
    np.testing.assert_array_equal,
    jax.device_get(full.state["params"]),
    jax.device_get(resumed.state["params"]),
  )


def test_bad_fraction_limit_stops_with_the_file_names(shards, tmp_path):
  tokenizer = tokenizer_lib.world_tokenizer(context_length=32, cache_dir=tmp_path)
  iterator = registry.make_train_iterator(
    _input_config(shards), tokenizer, seed=0, process_index=0, process_count=1
  )
  # 0.1% of the 1000-example floor tolerates one bad file; the second stops.
  health = input_health.InputHealth(max_bad_fraction=0.001)
  with pytest.raises(input_health.BadInputError, match=r"shard-00000\d\.tar:000(02|11)\.jpg \("):
    for _ in range(2):  # one pass over the data: both bad files
      batch = next(iterator)
      health.update(batch)
      assert "input/bad_samples" not in batch  # popped before the device
  assert health.bad == 2


def test_input_benchmark_reads_whole_batches_from_the_shards(shards):
  config = _train_config(shards)
  result = input_throughput.measure_input(config, steps=2, warmup=1)
  assert result["batch_size"] == 8
  assert result["images_per_sec"] == pytest.approx(8 / result["seconds_per_batch"])


def _large_jpeg(width=640, height=480) -> bytes:
  """A photo-like JPEG large enough for DCT scaling (a fixture photo, upscaled)."""
  root = HIERARCAPS_MINI / "images"
  photo = Image.open(sorted(root.glob("*.jpg"))[0]).convert("RGB")
  buffer = io.BytesIO()
  photo.resize((width, height), Image.Resampling.BICUBIC).save(buffer, "JPEG", quality=95)
  return buffer.getvalue()


def test_draft_decoding_picks_the_coarsest_scale_that_covers_the_request():
  data = _large_jpeg()
  full = tar_shards.decode_image(data, "x")
  assert full.shape == (480, 640, 3)
  # libjpeg scales by 1/2, 1/4, 1/8: the coarsest that keeps >= the request.
  for wanted, expected in [
    ((640, 480), (480, 640)),
    ((300, 200), (240, 320)),
    ((150, 100), (120, 160)),
    ((10, 10), (60, 80)),
  ]:
    drafted = tar_shards.decode_image(data, "x", draft_size=lambda w, h, wanted=wanted: wanted)
    assert drafted.shape[:2] == expected, wanted


def test_training_crop_from_encoded_bytes_matches_the_full_decode():
  """The crop window is drawn from the file's size before decoding, so it is
  the one a full decode gives; only the pixels differ, by DCT-domain scaling
  instead of PIL's bicubic low-pass over the dropped resolution."""
  data = _large_jpeg()
  size = 32
  example = image_text.RealTrainExample(
    source=None, augment_seed=0, image_size=size, cumulative_tier_weights=np.array([1.0])
  )
  reduced = 0
  for seed in range(20):
    encoded = tar_shards.EncodedImage(data, "x")
    drafted, crop = example._image_and_crop(encoded, np.random.default_rng(seed))
    full, full_crop = example._image_and_crop(encoded.decode(), np.random.default_rng(seed))
    assert crop == full_crop
    # The drafted image still puts at least `size` pixels across the crop.
    width, height = drafted.size
    assert (crop[2] - crop[0]) * width >= size - 1e-6
    assert (crop[3] - crop[1]) * height >= size - 1e-6
    reduced += width < 640
    a = transforms.resize_window(drafted, crop, size).astype(np.float64)
    b = transforms.resize_window(full, crop, size).astype(np.float64)
    # Measured on COCO photos: 0.9-1.1 grey levels on average (max 2.6);
    # 4 levels flags a wrong window or a wrong scale, which give tens.
    assert np.abs(a - b).mean() < 4.0
  assert reduced == 20  # a 32-px crop of a 640x480 photo always allows DCT scaling
