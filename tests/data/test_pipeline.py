"""Tokenizer, grain training iterator, evaluation splits and real-data sources."""

import csv
import json
import logging
import pathlib

import numpy as np
import pytest
import sentencepiece as spm
from paths import SHARED_DATA
from PIL import Image

from hyperbolic_vl.data import registry, transforms
from hyperbolic_vl.data import synthetic_world as world
from hyperbolic_vl.data import tokenizer as tokenizer_lib
from hyperbolic_vl.data.readers import image_text_records as sources

HIERARCAPS = SHARED_DATA / "hierarcaps_sample"


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
  return tmp_path_factory.mktemp("tokenizer_cache")


@pytest.fixture(scope="module")
def tokenizer(cache_dir):
  return tokenizer_lib.world_tokenizer(context_length=32, cache_dir=cache_dir)


def world_config(**overrides):
  config = {
    "batch_size": 8,
    "image_size": 16,
    "data": {"name": "world", "num_train": 1000, "num_eval": 12},
    "tokenizer": {"name": "world_sentencepiece", "context_length": 32},
  }
  config.update(overrides)
  return config


def take(iterator, num_batches):
  return [next(iterator) for _ in range(num_batches)]


def assert_batches_equal(a, b):
  assert a.keys() == b.keys()
  for key in a:
    np.testing.assert_array_equal(a[key], b[key], err_msg=key)


# --------------------------------------------------------------------------
# Tokenizer.
# --------------------------------------------------------------------------


def test_tokenizer_id_convention(tokenizer):
  assert tokenizer.vocab_size == 256
  assert (tokenizer.sot_id, tokenizer.eot_id, tokenizer.pad_id) == (254, 255, 0)
  tokens = tokenizer.encode(world.caption_corpus())
  assert tokens.dtype == np.int32 and tokens.shape[1] == 32
  assert (tokens[:, 0] == tokenizer.sot_id).all()
  eot_positions = np.argmax(tokens, axis=1)
  assert (tokens[np.arange(len(tokens)), eot_positions] == tokenizer.eot_id).all()
  after_eot = np.arange(32)[None, :] > eot_positions[:, None]
  assert (tokens[after_eot] == 0).all()
  assert (tokens[~after_eot] != 0).all(), "no padding before EOT"
  assert (tokens < tokenizer.vocab_size).all()


def test_tokenizer_round_trip(tokenizer):
  corpus = world.caption_corpus()
  assert tokenizer.decode(tokenizer.encode(corpus)) == corpus
  assert tokenizer.decode(tokenizer.encode(["a red circle"])[0]) == "a red circle"


def test_truncation_keeps_eot(cache_dir):
  short = tokenizer_lib.world_tokenizer(context_length=5, cache_dir=cache_dir)
  tokens = short.encode(["a large red circle and two other shapes on a striped background"])
  assert tokens.shape == (1, 5)
  assert tokens[0, 0] == short.sot_id and tokens[0, -1] == short.eot_id
  assert short.decode(tokens[0]) == "a large red"
  with pytest.raises(TypeError):
    short.encode("a red circle")


def test_world_tokenizer_is_cached(cache_dir, tokenizer, monkeypatch):
  def fail(*args, **kwargs):
    raise AssertionError("trained again instead of loading from the cache")

  monkeypatch.setattr(spm.SentencePieceTrainer, "train", fail)
  again = tokenizer_lib.world_tokenizer(context_length=32, cache_dir=cache_dir)
  assert again.model_path == tokenizer.model_path
  assert pathlib.Path(again.model_path).parent == pathlib.Path(cache_dir)
  texts = world.caption_corpus()[:50]
  np.testing.assert_array_equal(again.encode(texts), tokenizer.encode(texts))
  assert not list(pathlib.Path(cache_dir).glob("*.tmp")), "no temporary files left"


def test_world_tokenizer_training_is_deterministic(tmp_path, tokenizer):
  fresh = tokenizer_lib.world_tokenizer(context_length=32, cache_dir=tmp_path)
  assert (
    pathlib.Path(fresh.model_path).read_bytes() == pathlib.Path(tokenizer.model_path).read_bytes()
  )


def test_get_tokenizer(cache_dir, tokenizer, tmp_path):
  world_tok = tokenizer_lib.get_tokenizer(
    {"name": "world_sentencepiece", "context_length": 16, "cache_dir": str(cache_dir)}
  )
  assert world_tok.context_length == 16 and world_tok.vocab_size == tokenizer.vocab_size
  from_file = tokenizer_lib.get_tokenizer(
    {"name": "sentencepiece", "model_path": tokenizer.model_path, "context_length": 32}
  )
  np.testing.assert_array_equal(
    from_file.encode(["a blue ring"]), tokenizer.encode(["a blue ring"])
  )
  missing = tmp_path / "missing.model"
  with pytest.raises(FileNotFoundError, match="missing.model"):
    tokenizer_lib.get_tokenizer({"name": "sentencepiece", "model_path": str(missing)})
  with pytest.raises(FileNotFoundError, match="nowhere.gz"):
    tokenizer_lib.get_tokenizer({"name": "clip_bpe", "vocab_path": str(tmp_path / "nowhere.gz")})
  with pytest.raises(ValueError, match="world_sentencepiece"):
    tokenizer_lib.get_tokenizer({"name": "wordpiece"})


# --------------------------------------------------------------------------
# Training iterator on the world.
# --------------------------------------------------------------------------


def test_batch_shapes_and_dtypes(tokenizer):
  batch = next(
    registry.make_train_iterator(
      world_config(), tokenizer, seed=0, process_index=0, process_count=1
    )
  )
  expected = {
    "image": ((8, 16, 16, 3), np.uint8),  # scaled to [0, 1] on the device
    "tokens": ((8, 32), np.int32),
    "tier_tokens": ((8, 4, 32), np.int32),
    "neg_tier_tokens": ((8, 4, 32), np.int32),
    "index": ((8,), np.int64),
  }
  expected.update({f"label/{kind}": ((8,), np.int32) for kind in world.CLASS_NAMES})
  assert set(batch) == set(expected)
  for key, (shape, dtype) in expected.items():
    assert batch[key].shape == shape and batch[key].dtype == dtype, key
  assert batch["image"].max() > batch["image"].min()  # not a blank image
  assert (np.argmax(batch["tier_tokens"], -1) > 0).all()


def test_batches_agree_with_the_world(tokenizer):
  batch = next(
    registry.make_train_iterator(
      world_config(), tokenizer, seed=0, process_index=0, process_count=1
    )
  )
  for row, index in enumerate(batch["index"]):
    scene = world.sample_scene(0, "train", int(index))
    tiers = tokenizer.decode(batch["tier_tokens"][row])
    assert tiers == world.caption_tiers(scene)
    assert tokenizer.decode(batch["tokens"][row]) in tiers[1:], "tier 1 has weight 0"
    for kind, label in world.labels(scene).items():
      assert batch[f"label/{kind}"][row] == label


def test_tier_weights_select_the_training_caption(tokenizer):
  config = world_config()
  config["data"] = dict(config["data"], tier_weights=(0, 0, 0, 1))
  batch = next(
    registry.make_train_iterator(config, tokenizer, seed=0, process_index=0, process_count=1)
  )
  np.testing.assert_array_equal(batch["tokens"], batch["tier_tokens"][:, 3])
  config["data"] = dict(config["data"], tier_weights=(1, 1))
  with pytest.raises(ValueError, match="tier_weights"):
    registry.make_train_iterator(config, tokenizer, seed=0, process_index=0, process_count=1)


def test_iterator_is_deterministic_and_seeded(tokenizer):
  def first_batches(seed):
    return take(
      registry.make_train_iterator(
        world_config(), tokenizer, seed=seed, process_index=0, process_count=1
      ),
      2,
    )

  for a, b in zip(first_batches(0), first_batches(0)):
    assert_batches_equal(a, b)
  assert not np.array_equal(first_batches(0)[0]["index"], first_batches(1)[0]["index"])


def test_epochs_are_reshuffled_permutations(tokenizer):
  config = world_config(batch_size=5)
  config["data"] = dict(config["data"], num_train=10)
  batches = take(
    registry.make_train_iterator(config, tokenizer, seed=0, process_index=0, process_count=1), 4
  )
  epoch_0 = np.concatenate([b["index"] for b in batches[:2]])
  epoch_1 = np.concatenate([b["index"] for b in batches[2:]])
  assert sorted(epoch_0) == list(range(10)) and sorted(epoch_1) == list(range(10))
  assert not np.array_equal(epoch_0, epoch_1)


def test_processes_read_disjoint_slices_of_the_global_batch(tokenizer):
  config = world_config(batch_size=8)
  single = take(
    registry.make_train_iterator(config, tokenizer, seed=3, process_index=0, process_count=1), 3
  )
  shards = [
    take(
      registry.make_train_iterator(config, tokenizer, seed=3, process_index=p, process_count=2), 3
    )
    for p in range(2)
  ]
  for step in range(3):
    for key in single[step]:
      np.testing.assert_array_equal(
        np.concatenate([shards[0][step][key], shards[1][step][key]]),
        single[step][key],
        err_msg=f"step {step} {key}",
      )
  assert shards[0][0]["image"].shape[0] == 4
  with pytest.raises(ValueError, match="divisible"):
    registry.make_train_iterator(config, tokenizer, seed=0, process_index=0, process_count=3)


def test_get_state_set_state_resumes_identically(tokenizer):
  config = world_config()
  iterator = registry.make_train_iterator(
    config, tokenizer, seed=5, process_index=0, process_count=1
  )
  take(iterator, 3)
  state = json.loads(json.dumps(iterator.get_state()))  # must survive JSON
  expected = take(iterator, 3)
  resumed = registry.make_train_iterator(
    config, tokenizer, seed=5, process_index=0, process_count=1
  )
  resumed.set_state(state)
  for a, b in zip(take(resumed, 3), expected):
    assert_batches_equal(a, b)


def test_tokenizer_is_built_from_the_config(cache_dir, monkeypatch):
  monkeypatch.setenv(tokenizer_lib.CACHE_ENV_VAR, str(cache_dir))
  batch = next(
    registry.make_train_iterator(world_config(), None, seed=0, process_index=0, process_count=1)
  )
  assert batch["tokens"].shape == (8, 32)


def test_unknown_data_name_is_rejected(tokenizer):
  with pytest.raises(ValueError, match="image_text_csv"):
    registry.make_train_iterator(
      world_config(data={"name": "laion"}), tokenizer, seed=0, process_index=0, process_count=1
    )


# --------------------------------------------------------------------------
# Random resized crop.
# --------------------------------------------------------------------------


@pytest.mark.parametrize("image_aspect", [1.0, 0.6, 1.7])
def test_random_resized_crop_box_bounds(image_aspect):
  rng = np.random.default_rng(0)
  for _ in range(500):
    x0, y0, x1, y1 = transforms.random_resized_crop_box(rng, image_aspect)
    assert 0.0 <= x0 < x1 <= 1.0 and 0.0 <= y0 < y1 <= 1.0
    area = (x1 - x0) * (y1 - y0)
    assert 0.5 - 1e-9 <= area <= 1.0 + 1e-9
    pixel_ratio = (x1 - x0) * image_aspect / (y1 - y0)
    if (x0, y0, x1, y1) != (0.0, 0.0, 1.0, 1.0):  # the whole-image fallback
      assert 3 / 4 - 1e-9 <= pixel_ratio <= 4 / 3 + 1e-9


def test_world_training_crops_keep_the_main_object(tokenizer):
  batch = next(
    registry.make_train_iterator(
      world_config(image_size=32, batch_size=16),
      tokenizer,
      seed=0,
      process_index=0,
      process_count=1,
    )
  )
  for row, index in enumerate(batch["index"]):
    scene = world.sample_scene(0, "train", int(index))
    image = batch["image"][row].astype(np.float64)
    rgb = np.asarray(world.COLOR_RGB[scene.main.color], np.float64)
    near = np.linalg.norm(image - rgb, axis=-1) < 40
    assert near.sum() >= 20


# --------------------------------------------------------------------------
# Evaluation split.
# --------------------------------------------------------------------------


def test_load_eval_split_world(tokenizer):
  config = world_config()
  data = registry.load_eval_split(config, tokenizer, split="test")
  n = 12
  assert data["image"].shape == (n, 16, 16, 3) and data["image"].dtype == np.float32
  np.testing.assert_array_equal(data["tokens"], data["tier_tokens"][:, 3])
  assert data["neg_tier_tokens"].shape == (n, 4, 32)
  assert data["boxes"].shape == (n, 4, 4) and data["object_labels"].shape == (n, 4)
  for index in range(n):
    scene = world.sample_scene(0, "test", index)
    np.testing.assert_allclose(
      data["image"][index], world.render(scene, 16).astype(np.float32) / 255.0
    )
    count = data["num_objects"][index]
    assert count == scene.count
    np.testing.assert_array_equal(data["boxes"][index, :count], world.object_boxes(scene))
    assert (data["boxes"][index, count:] == 0).all()
    assert (data["object_labels"][index, count:] == -1).all()
    assert tokenizer.decode(data["tokens"][index]) == world.caption_tiers(scene)[3]
    for kind, label in world.labels(scene).items():
      assert data[f"label/{kind}"][index] == label
  again = registry.load_eval_split(config, tokenizer, split="test", num_examples=4)
  for key, value in again.items():
    np.testing.assert_array_equal(value, data[key][:4], err_msg=key)
  validation = registry.load_eval_split(config, tokenizer, split="validation", num_examples=4)
  assert not np.array_equal(validation["image"], again["image"])


# --------------------------------------------------------------------------
# Real data: CSV + image folder, TFDS.
# --------------------------------------------------------------------------


def write_csv_dataset(root: pathlib.Path, num_images: int = 6):
  images = root / "images"
  images.mkdir(parents=True)
  rng = np.random.default_rng(0)
  rows = []
  for i in range(num_images):
    name = f"img_{i}.png"
    pixels = rng.integers(0, 256, size=(10 + 3 * i, 14, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(images / name)
    color = world.COLORS[i % len(world.COLORS)]
    rows.append({"image": name, "caption": f"a {color} circle"})
  csv_path = root / "pairs.csv"
  with open(csv_path, "w", newline="") as f:
    writer = csv.DictWriter(f, fieldnames=["image", "caption"])
    writer.writeheader()
    writer.writerows(rows)
  return csv_path, images


def test_csv_source_reads_images(tmp_path):
  csv_path, images = write_csv_dataset(tmp_path)
  source = sources.ImageTextCsvSource(csv_path, images)
  assert len(source) == 6
  item = source[1]
  assert item["image"].shape == (13, 14, 3) and item["image"].dtype == np.uint8
  assert item["caption"] == "a green circle"


def test_csv_source_errors_name_the_culprit(tmp_path):
  csv_path, images = write_csv_dataset(tmp_path)
  with pytest.raises(FileNotFoundError, match="nope.csv"):
    sources.ImageTextCsvSource(tmp_path / "nope.csv", images)
  with pytest.raises(FileNotFoundError, match="no_images"):
    sources.ImageTextCsvSource(csv_path, tmp_path / "no_images")
  with pytest.raises(ValueError, match="text"):
    sources.ImageTextCsvSource(csv_path, images, caption_column="text")
  # A truncated JPEG and a missing file fail with the file and the row.
  jpeg = images / "truncated.jpg"
  Image.fromarray(np.full((32, 32, 3), 200, np.uint8)).save(jpeg, quality=90)
  jpeg.write_bytes(jpeg.read_bytes()[:200])
  with open(csv_path, "a", newline="") as f:
    f.write("truncated.jpg,a red ring\nmissing.png,a blue ring\n")
  source = sources.ImageTextCsvSource(csv_path, images)
  with pytest.raises(ValueError, match=r"truncated\.jpg.*row 6"):
    source[6]
  with pytest.raises(ValueError, match=r"missing\.png.*row 7"):
    source[7]


def test_csv_training_iterator_and_eval(tmp_path, tokenizer):
  csv_path, images = write_csv_dataset(tmp_path)
  config = {
    "batch_size": 4,
    "image_size": 12,
    "data": {"name": "image_text_csv", "path": str(csv_path), "image_root": str(images)},
  }
  iterator = registry.make_train_iterator(
    config, tokenizer, seed=0, process_index=0, process_count=1
  )
  batches = take(iterator, 3)
  # input/* are host-side counts of skipped undecodable images (none here).
  assert set(batches[0]) == {"image", "tokens", "index", "input/bad_samples", "input/bad_names"}
  assert all(b["input/bad_samples"].sum() == 0 for b in batches)
  assert batches[0]["image"].shape == (4, 12, 12, 3)
  assert batches[0]["image"].dtype == np.uint8
  for batch in batches:
    for row, index in enumerate(batch["index"]):
      color = world.COLORS[index % len(world.COLORS)]
      assert tokenizer.decode(batch["tokens"][row]) == f"a {color} circle"
  state = iterator.get_state()
  expected = next(iterator)
  resumed = registry.make_train_iterator(
    config, tokenizer, seed=0, process_index=0, process_count=1
  )
  resumed.set_state(state)
  assert_batches_equal(next(resumed), expected)
  data = registry.load_eval_split(config, tokenizer, num_examples=5)
  assert data["image"].shape == (5, 12, 12, 3)
  assert tokenizer.decode(data["tokens"][2]) == "a blue circle"


@pytest.mark.skipif(not HIERARCAPS.is_dir(), reason="shared HierarCaps sample absent")
def test_hierarcaps_sample_through_csv_pipeline(tokenizer):
  config = {
    "batch_size": 2,
    "image_size": 32,
    "data": {
      "name": "image_text_csv",
      "path": str(HIERARCAPS / "hierarcaps_test_sample.csv"),
      "image_root": str(HIERARCAPS / "images"),
      "image_column": "image_url",
      "caption_column": "captions",
      "tier_separator": " => ",
    },
  }
  batch = next(
    registry.make_train_iterator(config, tokenizer, seed=0, process_index=0, process_count=1)
  )
  assert batch["tier_tokens"].shape == (2, 4, 32)
  assert any((batch["tokens"][row] == batch["tier_tokens"][row]).all(-1).any() for row in range(2))
  data = registry.load_eval_split(config, tokenizer, num_examples=3)
  np.testing.assert_array_equal(data["tokens"], data["tier_tokens"][:, 3])


def test_tfds_source_not_prepared_names_data_dir(tmp_path, caplog):
  from absl import logging as absl_logging

  (tmp_path / "mnist" / "3.0.1").mkdir(parents=True)  # a folder left without its files
  verbosity = absl_logging.get_verbosity()
  absl_logging.set_verbosity(absl_logging.WARNING)  # as the command line runs
  try:
    with pytest.raises(FileNotFoundError, match=str(tmp_path)):
      sources.tfds_source("mnist", "train", data_dir=str(tmp_path))
    assert absl_logging.get_verbosity() == absl_logging.WARNING  # restored
  finally:
    absl_logging.set_verbosity(verbosity)
  # The one line says it: not TFDS's WARNING for each folder it looked in.
  assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


@pytest.mark.slow
def test_tfds_array_record_through_pipeline(tmp_path, tokenizer):
  tfds = pytest.importorskip("tensorflow_datasets")

  class TinyWorldCaptions(tfds.core.GeneratorBasedBuilder):
    VERSION = tfds.core.Version("1.0.0")

    def _info(self):
      return tfds.core.DatasetInfo(
        builder=self,
        features=tfds.features.FeaturesDict(
          {"image": tfds.features.Image(shape=(None, None, 3)), "caption": tfds.features.Text()}
        ),
      )

    def _split_generators(self, dl_manager):
      del dl_manager
      return {"train": self._generate_examples()}

    def _generate_examples(self):
      for index in range(4):
        scene = world.sample_scene(0, "train", index)
        yield index, {"image": world.render(scene, 20), "caption": world.caption_tiers(scene)[2]}

  TinyWorldCaptions(data_dir=str(tmp_path), file_format="array_record").download_and_prepare()
  config = {
    "batch_size": 2,
    "image_size": 8,
    "data": {"name": "tfds", "tfds_name": "tiny_world_captions", "data_dir": str(tmp_path)},
  }
  # TFDS shuffles records while preparing, so compare as sets.
  captions = {world.caption_tiers(world.sample_scene(0, "train", i))[2] for i in range(4)}
  batches = take(
    registry.make_train_iterator(config, tokenizer, seed=0, process_index=0, process_count=1), 2
  )
  assert batches[0]["image"].shape == (2, 8, 8, 3)
  decoded = {tokenizer.decode(row) for b in batches for row in b["tokens"]}
  assert decoded == captions, "one epoch covers every record once"
  data = registry.load_eval_split(config, tokenizer, split="train")
  assert data["image"].shape == (4, 8, 8, 3)
  assert set(tokenizer.decode(data["tokens"])) == captions
