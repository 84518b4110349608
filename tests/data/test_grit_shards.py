"""GRIT-style grounded shards (HyCoCLIP's prepare_GRIT_webdataset.py layout):
decoding, the box drawn with its phrase, bad samples skipped and counted,
per-process slices, exact resume, and a few HyCoCLIP training steps."""

import io
import pathlib
import tarfile

import jax
import numpy as np
import pytest
from PIL import Image

from configs import hycoclip as hycoclip_config
from hyperbolic_vl.data import registry
from hyperbolic_vl.data import tokenizer as tokenizer_lib
from hyperbolic_vl.data.readers import tar_shards
from hyperbolic_vl.runs import metrics_io
from hyperbolic_vl.training import loop

# Box phrases and the solid colour of their crops: a box image's colour says
# which phrase must come with it.
PHRASES = {
  "a red circle": (220, 30, 30),
  "a blue square": (30, 30, 220),
  "a green triangle": (30, 200, 30),
}
# Examples per shard; example TRUNCATED's whole image is cut short and
# example BAD_BOX's only box image is not an image: both are undecodable, so
# every pass over the data skips exactly two examples.
PER_SHARD = 6
NUM_EXAMPLES = 2 * PER_SHARD
TRUNCATED, BAD_BOX = 3, 8
BAD_PER_EPOCH = 2


def _jpeg(pixels: np.ndarray) -> bytes:
  buffer = io.BytesIO()
  Image.fromarray(pixels).save(buffer, format="JPEG", quality=95)
  return buffer.getvalue()


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
  info = tarfile.TarInfo(name)
  info.size = len(data)
  tar.addfile(info, io.BytesIO(data))


def caption_of(number: int) -> str:
  return f"scene {number} with {number % 3 + 1} shapes on a striped background"


def boxes_of(number: int) -> list[str]:
  """The phrases of example `number`'s boxes (one to three)."""
  names = list(PHRASES)
  return [names[(number + k) % 3] for k in range(1 if number == BAD_BOX else number % 3 + 1)]


def build_grit_shards(folder: pathlib.Path) -> str:
  """Two shards written as the released script's TarWriter writes a sample:
  KEY.child.jpg, KEY.child.txt, KEY.numparents.txt, KEY.parentNNN.jpg/.txt."""
  rng = np.random.default_rng(0)
  for shard in range(2):
    with tarfile.open(folder / f"{shard:05d}.tar", "w") as tar:
      for number in range(shard * PER_SHARD, (shard + 1) * PER_SHARD):
        key = f"{number:09d}"
        child = _jpeg(rng.integers(0, 256, (30, 40, 3), dtype=np.uint8))
        if number == TRUNCATED:
          child = child[:200]
        _add(tar, f"{key}.child.jpg", child)
        _add(tar, f"{key}.child.txt", caption_of(number).encode())
        phrases = boxes_of(number)
        _add(tar, f"{key}.numparents.txt", str(len(phrases)).encode())
        for k, phrase in enumerate(phrases):
          crop = _jpeg(np.full((20, 24, 3), PHRASES[phrase], np.uint8))
          if number == BAD_BOX:
            crop = b"not a jpeg"
          _add(tar, f"{key}.parent{k:03d}.jpg", crop)
          _add(tar, f"{key}.parent{k:03d}.txt", phrase.encode())
  return str(folder / "{00000..00001}.tar")


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
  return build_grit_shards(tmp_path_factory.mktemp("grit"))


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
  return tokenizer_lib.world_tokenizer(context_length=32, cache_dir=tmp_path_factory.mktemp("tok"))


def _input_config(shards, batch_size=8):
  return {
    "batch_size": batch_size,
    "image_size": 16,
    "data": {"name": "grit", "path": shards},
    "tokenizer": {"name": "world_sentencepiece", "context_length": 32},
  }


def test_index_reads_every_example_and_its_boxes(shards, tmp_path):
  source = tar_shards.GritShardSource(shards, cache_dir=tmp_path)
  assert len(source) == NUM_EXAMPLES
  # What `config.epochs` counts (every key has a whole image and a box).
  settings = registry.settings_class("grit").from_config({"path": shards})
  assert registry.get("grit").num_train_examples(settings) == NUM_EXAMPLES
  assert len(list(tmp_path.glob("*.idx.json"))) == 2  # one cached index per shard
  for number in range(NUM_EXAMPLES):
    record = source[number]
    assert record["caption"] == caption_of(number)
    assert record["num_boxes"] == len(boxes_of(number))
    for k, phrase in enumerate(boxes_of(number)):
      image, text = source.box(number, k)
      assert text == phrase
      if number != BAD_BOX:
        assert (np.abs(image.decode().astype(int) - PHRASES[phrase]) <= 3).all()
  with pytest.raises(tar_shards.BadSampleError, match=r"000000003\.child\.jpg"):
    source[TRUNCATED]["image"].decode()
  with pytest.raises(tar_shards.BadSampleError, match=r"000000008\.parent000\.jpg"):
    source.box(BAD_BOX, 0)[0].decode()


def test_batches_carry_the_caption_and_the_drawn_box_with_its_phrase(shards, tokenizer):
  iterator = registry.make_train_iterator(
    _input_config(shards), tokenizer, seed=1, process_index=0, process_count=1
  )
  phrase_tokens = {p: tokenizer.encode([p])[0] for p in PHRASES}
  drawn = set()
  for _ in range(12):  # eight passes over the data
    batch = next(iterator)
    assert batch["image"].shape == batch["box_image"].shape == (8, 16, 16, 3)
    assert batch["box_image"].dtype == np.uint8
    for row in range(8):
      number = int(batch["index"][row])
      assert number not in (TRUNCATED, BAD_BOX)  # replaced by the next example
      np.testing.assert_array_equal(batch["tokens"][row], tokenizer.encode([caption_of(number)])[0])
      # The phrase is the one of the crop shown: a solid colour, kept within
      # a few levels by JPEG (q95) and the bicubic resize of a flat image.
      colour = batch["box_image"][row].reshape(-1, 3).mean(0)
      phrase = min(PHRASES, key=lambda p: np.abs(colour - PHRASES[p]).sum())
      assert np.abs(colour - PHRASES[phrase]).max() < 6
      assert phrase in boxes_of(number)
      np.testing.assert_array_equal(batch["box_tokens"][row], phrase_tokens[phrase])
      drawn.add((number, phrase))
  # Over eight passes every box of the three-box examples is drawn (a
  # uniform draw; a loader stuck on box 0 would show one phrase each).
  for number in (2, 5, 11):
    assert {p for n, p in drawn if n == number} == set(boxes_of(number)), number


def test_process_slices_concatenate_and_bad_samples_are_counted(shards, tokenizer):
  config = _input_config(shards)
  single = registry.make_train_iterator(config, tokenizer, seed=3, process_index=0, process_count=1)
  halves = [
    registry.make_train_iterator(config, tokenizer, seed=3, process_index=i, process_count=2)
    for i in range(2)
  ]
  bad = 0
  for _ in range(3):  # 24 positions: two passes over the 12 examples
    whole = next(single)
    parts = [next(half) for half in halves]
    assert parts[0]["image"].shape[0] == 4
    for key in whole:
      np.testing.assert_array_equal(
        np.concatenate([p[key] for p in parts]), whole[key], err_msg=key
      )
    bad += int(whole["input/bad_samples"].sum())
  assert bad == 2 * BAD_PER_EPOCH


def test_stop_and_resume_gives_the_same_batches(shards, tokenizer):
  config = _input_config(shards)
  make = lambda: registry.make_train_iterator(
    config, tokenizer, seed=5, process_index=0, process_count=1
  )
  uninterrupted = make()
  expected = [next(uninterrupted) for _ in range(5)]
  stopped = make()
  for _ in range(2):
    next(stopped)
  state = stopped.get_state()
  resumed = make()
  resumed.set_state(state)
  for want in expected[2:]:
    got = next(resumed)
    assert got.keys() == want.keys()
    for key in want:
      np.testing.assert_array_equal(got[key], want[key], err_msg=key)


def test_config_variant_reads_grit_shards():
  config = hycoclip_config.get_config("vit_s,data=grit")
  assert config.input.data.name == "grit"
  assert config.input.tokenizer.name == "clip_bpe"
  assert config.input.batch_size == 768
  # Real sources read at most 100k examples unless told (configs/common.py).
  assert config.input.data.num_train == 100_000
  assert config.input.data.path == ""  # required: --config.input.data.path=...


# One tiny HyCoCLIP compile and 3 steps (16 s on 2 idle cores). The push tier
# trains on GRIT shards once, with UNCHA's several boxes per image
# (tests/data/test_multi_box_sources.py); this single-box run repeats that path.
@pytest.mark.slow
def test_hycoclip_trains_a_few_steps_on_grit_shards(shards, tmp_path):
  config = hycoclip_config.get_config("data=grit")
  with config.unlocked():
    config.input.batch_size = 8
    config.input.image_size = 16
    config.input.data.path = shards
    config.input.max_bad_fraction = 0.5
    config.total_steps = 3  # 24 examples: two passes, four bad files read
    config.ckpt_steps = 100  # the final checkpoint only
    config.log_training_steps = 1
    config.optim.warmup_steps = 1
    config.evals = {}
  result = loop.train(config, str(tmp_path))
  assert result.step == 3
  assert all(
    np.isfinite(leaf).all() for leaf in jax.tree.leaves(jax.device_get(result.state["params"]))
  )
  records = metrics_io.read_metrics(str(tmp_path))
  per_step = {r["step"]: r for r in records if "train/loss" in r}
  assert sorted(per_step) == [1, 2, 3]
  assert all(np.isfinite(r["train/loss"]) for r in per_step.values())
  assert sum(r.get("train/input/bad_samples", 0.0) for r in per_step.values()) == 2 * BAD_PER_EPOCH
