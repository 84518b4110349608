"""OpenAI CLIP's byte-level BPE tokenizer (as used by CLIP, open_clip and MERU).

Pipeline for one string, token-for-token the released tokenizer's:
  1. clean: ftfy.fix_text, HTML unescape twice (captions scraped from the web
     are often escaped twice, "&amp;quot;"), collapse whitespace, strip,
     lower-case;
  2. pre-tokenise with CLIP's pattern: the English contractions 's 't 're
     've 'm 'll 'd, runs of letters, single digits, and runs of other
     non-space characters. A literal "<|endoftext|>" in a caption is text,
     as in open_clip: an EOT id inside a caption would move the tower's
     argmax pooling to the wrong position;
  3. each pre-token -> its UTF-8 bytes -> one printable unicode character per
     byte (so merges are plain strings), the last character marked with
     "</w>" (end of word), then merge adjacent pairs in order of merge rank
     until no ranked pair is left;
  4. ids: [SOT] pieces... [EOT], truncated to the context length with EOT
     kept as the last token, zero padded.

The vocabulary (49,408 ids) is: the 256 byte characters, the same 256 with
"</w>", the 48,894 merge results in rank order, then <|startoftext|> (49406)
and <|endoftext|> (49407): SOT and EOT are the two largest ids, the
convention every tokenizer here follows (towers pool at argmax).
"""

from __future__ import annotations

import functools
import gzip
import html
import os
import pathlib
from collections.abc import Sequence

import ftfy
import numpy as np
import regex

from hyperbolic_vl import errors

DEFAULT_VOCAB_PATH = (
  pathlib.Path(__file__).resolve().parent / "assets" / "bpe_simple_vocab_16e6.txt.gz"
)
SOT_TEXT, EOT_TEXT = "<|startoftext|>", "<|endoftext|>"
VOCAB_SIZE = 49408
# 49408 ids = 2 x 256 byte symbols + merges + 2 special tokens.
NUM_MERGES = VOCAB_SIZE - 2 * 256 - 2
_PRETOKEN_PATTERN = regex.compile(
  r"""'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+""",
  regex.IGNORECASE,
)
_WHITESPACE = regex.compile(r"\s+")


@functools.cache
def byte_symbols() -> tuple[str, ...]:
  """The printable character standing for each byte value 0..255.

  Bytes that are printable Latin-1 characters (other than space and the
  control/soft-hyphen gaps) stand for themselves; the rest are moved, in byte
  order, to code points 256, 257, ... so no symbol is whitespace or control.
  """
  printable = (
    list(range(ord("!"), ord("~") + 1))
    + list(range(ord("¡"), ord("¬") + 1))
    + list(range(ord("®"), ord("ÿ") + 1))
  )
  symbols = {}
  extra = 0
  for byte in range(256):
    if byte in printable:
      symbols[byte] = chr(byte)
    else:
      symbols[byte] = chr(256 + extra)
      extra += 1
  return tuple(symbols[b] for b in range(256))


def clean_text(text: str) -> str:
  text = ftfy.fix_text(text)
  text = html.unescape(html.unescape(text))
  return _WHITESPACE.sub(" ", text).strip().lower()


class ClipBpeTokenizer:
  """CLIP's BPE in the interface of every tokenizer here (encode -> int32
  (N, context_length), decode, vocab_size, context_length, sot/eot/pad ids)."""

  def __init__(self, context_length: int = 77, vocab_path: str | os.PathLike | None = None):
    if context_length < 2:
      raise ValueError(f"context_length must be >= 2 (SOT + EOT), got {context_length}")
    path = pathlib.Path(vocab_path) if vocab_path else DEFAULT_VOCAB_PATH
    if not path.is_file():
      raise FileNotFoundError(f"CLIP BPE merges file not found: {path} (tokenizer.vocab_path)")
    try:
      with gzip.open(path, "rt", encoding="utf-8") as f:
        lines = f.read().split("\n")
    except (OSError, UnicodeDecodeError, EOFError) as error:  # not gzip, cut short, not text
      raise errors.ConfigError(
        f"{path} is not a gzipped CLIP BPE merges file ({error}); "
        "input.tokenizer.vocab_path takes bpe_simple_vocab_16e6.txt.gz"
      ) from error
    # Line 0 is a version header; the merges follow, one "a b" pair a line.
    merges = [tuple(line.split()) for line in lines[1 : 1 + NUM_MERGES]]
    if len(merges) != NUM_MERGES or any(len(m) != 2 for m in merges):
      raise errors.ConfigError(
        f"{path}: expected {NUM_MERGES} merge lines of two symbols (input.tokenizer.vocab_path)"
      )
    symbols = list(byte_symbols())
    # Vocabulary order of the byte symbols: the self-standing printable bytes
    # first, then the moved ones (code points 256+), as the released ids are.
    ordered = sorted(symbols, key=lambda s: (ord(s) >= 256, ord(s)))
    vocab = ordered + [s + "</w>" for s in ordered] + ["".join(m) for m in merges]
    vocab += [SOT_TEXT, EOT_TEXT]
    self._ids = {piece: i for i, piece in enumerate(vocab)}
    self._pieces = vocab
    self._ranks = {pair: rank for rank, pair in enumerate(merges)}
    self._byte_symbols = symbols
    self._symbol_bytes = {s: b for b, s in enumerate(symbols)}
    self._context_length = int(context_length)
    self.vocab_path = str(path)
    self._cache: dict[str, tuple[int, ...]] = {}  # pre-token -> ids

  # -- the interface shared with SentencePieceTokenizer -------------------------
  @property
  def vocab_size(self) -> int:
    return len(self._pieces)

  @property
  def context_length(self) -> int:
    return self._context_length

  @property
  def sot_id(self) -> int:
    return self._ids[SOT_TEXT]

  @property
  def eot_id(self) -> int:
    return self._ids[EOT_TEXT]

  @property
  def pad_id(self) -> int:
    return 0

  # -- BPE ---------------------------------------------------------------------
  def _merge(self, word: str) -> tuple[int, ...]:
    """Ids of one pre-token (already mapped to byte symbols)."""
    parts = list(word[:-1]) + [word[-1] + "</w>"]
    while len(parts) > 1:
      best = min(zip(parts, parts[1:]), key=lambda pair: self._ranks.get(pair, NUM_MERGES))
      if best not in self._ranks:
        break
      first, second = best
      # Merge every occurrence of the best pair, left to right.
      merged, i = [], 0
      while i < len(parts):
        if i + 1 < len(parts) and parts[i] == first and parts[i + 1] == second:
          merged.append(first + second)
          i += 2
        else:
          merged.append(parts[i])
          i += 1
      parts = merged
    return tuple(self._ids[p] for p in parts)

  def _word_ids(self, word: str) -> tuple[int, ...]:
    ids = self._cache.get(word)
    if ids is None:
      symbols = "".join(self._byte_symbols[b] for b in word.encode("utf-8"))
      ids = self._merge(symbols)
      if len(self._cache) < 1_000_000:  # bounded for web-scale caption streams
        self._cache[word] = ids
    return ids

  def text_ids(self, text: str) -> list[int]:
    """BPE ids of one string, without SOT/EOT."""
    ids = []
    for word in _PRETOKEN_PATTERN.findall(clean_text(text)):
      ids.extend(self._word_ids(word))
    return ids

  def encode(self, texts: Sequence[str]) -> np.ndarray:
    """(N, context_length) int32: [SOT] ids... [EOT] 0...; over-long texts are
    cut so that EOT is the last token."""
    if isinstance(texts, str):
      raise TypeError("encode expects a sequence of strings, not a single str")
    texts = list(texts)
    tokens = np.zeros((len(texts), self._context_length), np.int32)
    for row, text in enumerate(texts):
      ids = [self.sot_id, *self.text_ids(text), self.eot_id]
      if len(ids) > self._context_length:
        ids = ids[: self._context_length]
        ids[-1] = self.eot_id
      tokens[row, : len(ids)] = ids
    return tokens

  def decode(self, ids) -> str | list[str]:
    """Text of one (L,) row (up to EOT, SOT and padding skipped), or a list
    of texts for an (N, L) array; "</w>" becomes a space."""
    ids = np.asarray(ids)
    if ids.ndim == 2:
      return [self.decode(row) for row in ids]
    pieces = []
    for token in ids.tolist():
      if token == self.eot_id:
        break
      if token in (self.pad_id, self.sot_id):
        continue
      pieces.append(self._pieces[token])
    symbols = "".join(pieces)
    words = symbols.split("</w>")
    data = [bytes(self._symbol_bytes[c] for c in word) for word in words]
    return " ".join(w.decode("utf-8", errors="replace") for w in data).strip()

  def __repr__(self) -> str:
    return (
      f"ClipBpeTokenizer(context_length={self._context_length}, vocab_path={self.vocab_path!r})"
    )
