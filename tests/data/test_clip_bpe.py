"""CLIP's BPE tokenizer: ids equal the released tokenizer's (golden ids in the
repository, and open_clip's own on thousands of real strings when open_clip
and the shared samples are installed)."""

import csv
import json

import numpy as np
import pytest
from paths import SHARED_DATA

from hyperbolic_vl.data import clip_bpe
from hyperbolic_vl.data import tokenizer as tokenizer_lib

SHARED = SHARED_DATA

# Ids printed by open_clip 3.3.0's tokenizer (up to and including EOT). They
# cover HTML entities escaped twice, accents, CJK, emoji, mojibake that ftfy
# repairs ("doesnâ€™t"), contractions with case, punctuation runs, digits
# (one token each) and a literal special token (plain text).
GOLDEN = {
  "a photo of a dog": [49406, 320, 1125, 539, 320, 1929, 49407],
  "": [49406, 49407],
  "&amp;quot;Hello&amp;quot; &lt;b&gt;World&lt;/b&gt;": [
    49406, 257, 3306, 257, 283, 321, 285, 1002, 34308, 321, 285, 49407,
  ],
  "Café crème brûlée": [49406, 15304, 1075, 12138, 614, 711, 127, 119, 75, 13489, 49407],
  "日本語": [49406, 39121, 44353, 34002, 508, 49407],
  "emoji 🐶 ok": [49406, 16327, 10631, 2481, 49407],
  "The Mona Lisa doesnâ€™t have eyebrows.": [
    49406, 518, 19143, 7424, 2503, 713, 720, 19923, 269, 49407,
  ],
  "don't I'M we'll": [49406, 847, 713, 328, 880, 649, 1342, 49407],
  "!!!??? ... $$$": [49406, 11194, 3824, 678, 31859, 49407],
  "123 45.6": [49406, 272, 273, 274, 275, 276, 269, 277, 49407],
  "<|endoftext|> inside": [49406, 27, 347, 40786, 4160, 91, 285, 2912, 49407],
}  # fmt: skip


@pytest.fixture(scope="module")
def tokenizer():
  return tokenizer_lib.get_tokenizer({"name": "clip_bpe", "context_length": 77})


def test_golden_ids(tokenizer):
  assert tokenizer.vocab_size == 49408 and (tokenizer.sot_id, tokenizer.eot_id) == (49406, 49407)
  tokens = tokenizer.encode(list(GOLDEN))
  assert tokens.shape == (len(GOLDEN), 77) and tokens.dtype == np.int32
  for row, ids in zip(tokens, GOLDEN.values()):
    np.testing.assert_array_equal(row[: len(ids)], ids)
    assert not row[len(ids) :].any()  # zero padding


def test_truncation_keeps_eot_last_and_decode_round_trips(tokenizer):
  row = tokenizer.encode(["word " * 100])[0]
  assert row[0] == 49406 and row[-1] == 49407 and (row[1:-1] == 2653).all()
  assert np.argmax(row) == 76  # the towers pool at the EOT position
  assert tokenizer.decode(tokenizer.encode(["a photo of a dog"])[0]) == "a photo of a dog"
  with pytest.raises(TypeError):
    tokenizer.encode("one string")


def test_missing_vocab_file_is_named(tmp_path):
  with pytest.raises(FileNotFoundError, match="nowhere.gz"):
    clip_bpe.ClipBpeTokenizer(vocab_path=tmp_path / "nowhere.gz")


def _real_strings():
  texts = []
  with open(SHARED / "hierarcaps_sample" / "hierarcaps_test_sample.csv") as f:
    for row in csv.DictReader(f):
      texts += row["captions"].split(" => ")
  pool = json.loads((SHARED / "pexels_text.json").read_text())
  return texts + pool["captions"] + pool["nouns"] + pool["adjectives"]


@pytest.mark.skipif(not (SHARED / "pexels_text.json").is_file(), reason="shared samples absent")
def test_equals_open_clip_on_real_captions(tokenizer):
  open_clip = pytest.importorskip("open_clip")
  texts = _real_strings() + list(GOLDEN) + ["x " * 200, "  tab\tnew\nline  ", "ÀÉÎÕÜ"]
  expected = open_clip.get_tokenizer("ViT-B-32")(texts).numpy()
  mismatches = [t for t, a, b in zip(texts, tokenizer.encode(texts), expected) if (a != b).any()]
  print(f"clip_bpe vs open_clip: {len(texts)} strings, {len(mismatches)} mismatches")
  assert len(texts) > 1500 and not mismatches, mismatches[:5]
