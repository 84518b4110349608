"""Real-file capabilities on fixtures that live in the repository (so they run
without ../shared/data): JPEG decoding through the CSV pipeline, HierarCaps
parsing, and the traversal text pool. `tests/fixtures/make_fixtures.py` wrote them.
"""

import json

import numpy as np
import pytest
from paths import FIXTURES, SHARED_DATA
from PIL import Image

from hyperbolic_vl.data import registry
from hyperbolic_vl.data import tokenizer as tokenizer_lib
from hyperbolic_vl.data.readers import hierarcaps
from hyperbolic_vl.evaluators.metrics import traversal

DATA = FIXTURES
MINI = DATA / "hierarcaps_mini"
MINI_CSV = MINI / "hierarcaps_mini.csv"
SHARED_TEXTS = SHARED_DATA / "pexels_text.json"


def test_mini_hierarcaps_parses_into_four_tiers_and_images_resolve():
  split = hierarcaps.load_test(MINI_CSV, MINI / "images", strict=True)
  assert len(split) == 6 and not split.problems
  assert split.tiers[0][0] == "bird" and split.tiers[0][1] == "blue bird"
  assert split.tiers[4][3] == "A slice of chocolate cake on a plate."
  assert [p.name for p in split.image_paths][:2] == [
    "COCO_val2014_000000000000.jpg",
    "COCO_val2014_000000000001.jpg",
  ]
  # Real JPEG bytes, decoded and resized: the pixel at the disc's centre keeps
  # its colour (JPEG at quality 85 moves it by a few levels only).
  image = hierarcaps.load_image(split.image_paths[0], 64)
  assert image.shape == (64, 64, 3) and image.dtype == np.float32
  np.testing.assert_allclose(image[32, 19] * 255, [40, 90, 220], atol=12)
  small = hierarcaps.load_image(split.image_paths[0], 16)
  reference = np.asarray(
    Image.open(split.image_paths[0]).convert("RGB").resize((16, 16), Image.BICUBIC), np.float32
  )
  np.testing.assert_allclose(small * 255, reference, atol=1.0)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
  return tokenizer_lib.world_tokenizer(context_length=32, cache_dir=tmp_path_factory.mktemp("spm"))


def test_mini_hierarcaps_through_the_csv_pipeline(tokenizer):
  config = {
    "batch_size": 2,
    "image_size": 32,
    "data": {
      "name": "image_text_csv",
      "path": str(MINI_CSV),
      "image_root": str(MINI / "images"),
      "image_column": "image_url",
      "caption_column": "captions",
      "tier_separator": " => ",
    },
  }
  batch = next(
    registry.make_train_iterator(config, tokenizer, seed=0, process_index=0, process_count=1)
  )
  assert batch["image"].shape == (2, 32, 32, 3) and batch["tier_tokens"].shape == (2, 4, 32)
  # The training caption is one of the row's four tiers.
  assert all((batch["tokens"][r] == batch["tier_tokens"][r]).all(-1).any() for r in range(2))
  data = registry.load_eval_split(config, tokenizer, num_examples=6)
  np.testing.assert_array_equal(data["tokens"], data["tier_tokens"][:, 3])
  assert data["image"].shape == (6, 32, 32, 3)


def test_traversal_text_pool_in_merus_format(tmp_path):
  pool = traversal.load_text_pool(DATA / "traversal_texts.json")
  raw = json.loads((DATA / "traversal_texts.json").read_text())
  captions = len(raw["captions"])
  assert pool.texts[:captions] == pool.prompts[:captions] == tuple(raw["captions"])
  assert pool.texts[-1] == "white" and pool.prompts[-1] == "this photo is white."
  assert pool.prompts[pool.texts.index("bird")] == "a photo of a bird."
  assert len(pool) == len(set(zip(pool.texts, pool.prompts)))
  bad = tmp_path / "bad.json"
  bad.write_text(json.dumps(["a list", "not an object"]))
  with pytest.raises(ValueError, match="captions"):
    traversal.load_text_pool(bad)


@pytest.mark.skipif(not SHARED_TEXTS.is_file(), reason="shared traversal texts absent")
def test_merus_released_traversal_texts_load():
  """The package's copy of MERU's pool is the released file, unchanged."""
  assert json.loads(SHARED_TEXTS.read_text()) == json.loads(traversal.PEXELS_POOL.read_text())
  pool = traversal.load_text_pool(SHARED_TEXTS)
  assert pool == traversal.load_text_pool()
  assert len(pool) > 700
