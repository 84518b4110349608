"""Input files and settings a user gets wrong stop the run at start-up with
the file, line or key named (errors.DataError / ConfigError, printed as one
line by the command line), never mid-run with a decoder's traceback."""

import gzip

import pytest

from hyperbolic_vl import errors
from hyperbolic_vl.data.readers import hierarcaps
from hyperbolic_vl.data.readers import image_text_records as sources
from hyperbolic_vl.data.settings import InputSettings


def write_images(folder, names):
  from PIL import Image

  folder.mkdir()
  for name in names:
    Image.new("RGB", (8, 8)).save(folder / name)


def test_a_caption_that_is_not_utf8_names_its_file_and_line(tmp_path):
  write_images(tmp_path / "images", ["0.png", "1.png"])
  path = tmp_path / "captions.csv"
  # Line 3 holds "caf\xe9" in Latin-1: byte 0xe9 at offset 14 + 12 + 11 = 37.
  path.write_bytes(b"image,caption\n0.png,a cat\n1.png,a caf\xe9 table\n")
  with pytest.raises(errors.DataError) as caught:
    sources.ImageTextCsvSource(path, tmp_path / "images")
  assert str(caught.value) == (
    f"{path}: line 3 is not UTF-8 (byte 0xe9 at offset 37); save the file as UTF-8"
  )
  assert isinstance(caught.value, ValueError) and errors.is_user_error(caught.value)


def test_utf8_with_a_byte_order_mark_and_gzip_read_as_plain_utf8(tmp_path):
  write_images(tmp_path / "images", ["0.png"])
  plain = "image,caption\n0.png,un café\n".encode()
  (tmp_path / "bom.csv").write_bytes(b"\xef\xbb\xbf" + plain)  # a spreadsheet's export
  source = sources.ImageTextCsvSource(tmp_path / "bom.csv", tmp_path / "images")
  assert source[0]["caption"] == "un café"
  (tmp_path / "gz.csv.gz").write_bytes(gzip.compress(plain))
  assert sources.open_csv_text(tmp_path / "gz.csv.gz").read() == plain.decode()


def test_a_hierarcaps_csv_that_is_not_utf8_names_its_line(tmp_path):
  path = tmp_path / "train.csv.gz"
  rows = b"positive,negative,image_url\n" + b"a => b => c => d,e => f => g => \xff,x/0.jpg\n"
  path.write_bytes(gzip.compress(rows))
  with pytest.raises(errors.DataError, match=r"train.csv.gz: line 2 is not UTF-8 \(byte 0xff"):
    hierarcaps.load_train(path)


@pytest.mark.parametrize(
  "key,value,message",
  [
    ("batch_size", -4, "input.batch_size must be an integer >= 1, got -4"),
    ("batch_size", 0, "input.batch_size must be an integer >= 1, got 0"),
    ("image_size", -1, "input.image_size must be an integer >= 0, got -1"),
    ("num_threads", 0, "input.num_threads must be an integer >= 1, got 0"),
    ("max_bad_fraction", 1.5, "input.max_bad_fraction must be in [0, 1], got 1.5"),
  ],
)
def test_input_settings_out_of_range_name_the_key(key, value, message):
  config = {"batch_size": 8, "image_size": 16, "data": {"name": "world"}, key: value}
  with pytest.raises(errors.ConfigError) as caught:
    InputSettings.from_config(config)
  assert str(caught.value) == message


def test_the_innermost_user_error_is_found_inside_a_librarys_wrapper():
  try:
    try:
      raise errors.ConfigError("unknown variant 'vit_xx'")
    except errors.ConfigError as inner:
      raise ValueError("Error whilst parsing config file: ...") from inner
  except ValueError as wrapper:
    assert str(errors.innermost_user_error(wrapper)) == "unknown variant 'vit_xx'"
  assert errors.innermost_user_error(ValueError("a bug")) is None
  missing = FileNotFoundError(2, "No such file or directory", "/data/x.csv")
  assert errors.one_line(missing) == "No such file or directory: /data/x.csv"
  assert errors.is_user_error(missing) and not errors.is_user_error(KeyError("a bug"))


def test_a_tokenizer_file_of_another_kind_is_one_config_error(tmp_path):
  from hyperbolic_vl.data import tokenizer

  text = tmp_path / "spm.model"
  text.write_text("a b\nc d\n")  # e.g. a vocabulary list given for the model
  with pytest.raises(errors.ConfigError) as caught:
    tokenizer.get_tokenizer({"name": "sentencepiece", "model_path": str(text)})
  message = str(caught.value)
  assert message.startswith(f"{text} is not a SentencePiece model (")
  assert "input.tokenizer.model_path" in message and "\n" not in message
  # CLIP's merges: a file that is not gzip, and a gzip file of other lines.
  for content, named in (
    (b"#version: 0.2\na b\n", "is not a gzipped CLIP BPE merges file"),
    (gzip.compress(b"#version: 0.2\na b\n"), "merge lines of two symbols"),
  ):
    merges = tmp_path / "merges.txt.gz"
    merges.write_bytes(content)
    with pytest.raises(errors.ConfigError, match=named) as caught:
      tokenizer.get_tokenizer({"name": "clip_bpe", "vocab_path": str(merges)})
    assert str(merges) in str(caught.value) and "\n" not in str(caught.value)
