"""Text tokenizers with CLIP's id convention.

Every tokenizer here turns a batch of strings into an int32 (N, context_length)
array laid out as ``[SOT] pieces... [EOT] 0 0 ...``:

* pad id is 0;
* SOT = vocab_size - 2 and EOT = vocab_size - 1 are the two largest ids, so
  the text towers pool at ``argmax(tokens, axis=-1)`` (the EOT position) as
  CLIP and MERU do;
* truncation drops pieces, never EOT: EOT is always present.

SentencePiece ids are used as they are and SOT / EOT are appended after the
model's pieces, so ``vocab_size = model pieces + 2``.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import pathlib
import tempfile
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import sentencepiece as spm

from hyperbolic_vl import errors
from hyperbolic_vl.data import clip_bpe
from hyperbolic_vl.data import synthetic_world as world

TOKENIZER_NAMES = ("world_sentencepiece", "sentencepiece", "clip_bpe")
CACHE_ENV_VAR = "HYPERBOLIC_VL_CACHE"


class SentencePieceTokenizer:
  """A SentencePiece model wrapped in the CLIP id convention (module doc)."""

  def __init__(self, model_path: str | os.PathLike, context_length: int):
    model_path = pathlib.Path(model_path)
    if not model_path.is_file():
      raise FileNotFoundError(f"SentencePiece model file not found: {model_path}")
    if context_length < 2:
      raise errors.ConfigError(f"context_length must be >= 2 (SOT + EOT), got {context_length}")
    self.model_path = str(model_path)
    try:
      self._processor = spm.SentencePieceProcessor(model_file=self.model_path)
    except RuntimeError as error:  # the library's only word for a file it cannot parse
      raise errors.ConfigError(
        f"{model_path} is not a SentencePiece model ({str(error).strip()}); "
        "input.tokenizer.model_path takes the .model file that spm_train writes"
      ) from error
    self._num_pieces = self._processor.get_piece_size()
    self._context_length = int(context_length)

  @property
  def vocab_size(self) -> int:
    return self._num_pieces + 2

  @property
  def context_length(self) -> int:
    return self._context_length

  @property
  def sot_id(self) -> int:
    return self._num_pieces

  @property
  def eot_id(self) -> int:
    return self._num_pieces + 1

  @property
  def pad_id(self) -> int:
    return 0

  def encode(self, texts: Sequence[str]) -> np.ndarray:
    """(N, context_length) int32 token ids for N strings."""
    if isinstance(texts, str):
      # A str is a Sequence[str] of characters; that is never what is meant.
      raise TypeError("encode expects a sequence of strings, not a single str")
    texts = list(texts)
    tokens = np.zeros((len(texts), self._context_length), np.int32)
    if not texts:
      return tokens
    max_pieces = self._context_length - 2
    for row, piece_ids in enumerate(self._processor.encode(texts)):
      piece_ids = piece_ids[:max_pieces]
      tokens[row, 0] = self.sot_id
      tokens[row, 1 : 1 + len(piece_ids)] = piece_ids
      tokens[row, 1 + len(piece_ids)] = self.eot_id
    return tokens

  def decode(self, ids) -> str | list[str]:
    """Text of one (L,) row, or a list of texts for an (N, L) array.

    Reads up to the first EOT and skips SOT and padding.
    """
    ids = np.asarray(ids)
    if ids.ndim == 2:
      return [self.decode(row) for row in ids]
    if ids.ndim != 1:
      raise ValueError(f"decode expects a 1-D or 2-D array, got shape {ids.shape}")
    pieces = []
    for token in ids.tolist():
      if token == self.eot_id:
        break
      if token == self.pad_id or token == self.sot_id:
        continue
      pieces.append(token)
    return self._processor.decode(pieces)

  def __repr__(self) -> str:
    return (
      f"SentencePieceTokenizer(model_path={self.model_path!r}, "
      f"context_length={self._context_length}, vocab_size={self.vocab_size})"
    )


def default_cache_dir() -> pathlib.Path:
  return pathlib.Path(
    os.environ.get(CACHE_ENV_VAR) or pathlib.Path.home() / ".cache" / "hyperbolic_vl"
  )


def _world_trainer_settings(num_pieces: int) -> dict[str, Any]:
  # BPE rather than unigram: on the world's ~60-word grammar BPE reaches
  # whole-word pieces (T4 captions ~12 tokens), unigram stops at fragments.
  return dict(
    model_type="bpe",
    vocab_size=num_pieces,
    # The grammar may not support num_pieces pieces; take what it gives.
    hard_vocab_limit=False,
    pad_id=0,
    unk_id=1,
    bos_id=-1,  # SOT / EOT are added by SentencePieceTokenizer.
    eos_id=-1,
    character_coverage=1.0,
    # Determinism: one thread, the whole corpus, in order.
    num_threads=1,
    input_sentence_size=0,
    shuffle_input_sentence=False,
    minloglevel=2,
  )


def _write_atomically(path: pathlib.Path, data: bytes) -> None:
  """Writes via a temporary file and a rename so that concurrent processes
  (several hosts or test workers sharing a cache) never read a partial file."""
  path.parent.mkdir(parents=True, exist_ok=True)
  fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
  try:
    with os.fdopen(fd, "wb") as f:
      f.write(data)
    os.replace(tmp_name, path)
  except BaseException:
    if os.path.exists(tmp_name):
      os.unlink(tmp_name)
    raise


def world_tokenizer(
  context_length: int = 32, vocab_size: int = 256, cache_dir: str | os.PathLike | None = None
) -> SentencePieceTokenizer:
  """A SentencePiece tokenizer for the synthetic world's caption grammar.

  Trains on ``world.caption_corpus()`` the first time and caches the model in
  ``cache_dir`` (default ``$HYPERBOLIC_VL_CACHE`` or ~/.cache/hyperbolic_vl)
  under a name hashed from the corpus and the settings; later calls load it.

  Args:
    context_length: token array width.
    vocab_size: requested size including SOT and EOT; the model gets
      ``vocab_size - 2`` pieces, or fewer if the grammar has fewer.
    cache_dir: where the .model file lives.
  """
  if vocab_size < 16:
    raise ValueError(f"vocab_size must be >= 16, got {vocab_size}")
  corpus = world.caption_corpus()
  settings = _world_trainer_settings(vocab_size - 2)
  fingerprint = hashlib.sha256(
    json.dumps(
      {"corpus": corpus, "settings": settings, "sentencepiece": spm.__version__}, sort_keys=True
    ).encode()
  ).hexdigest()[:16]
  cache_dir = pathlib.Path(cache_dir) if cache_dir is not None else default_cache_dir()
  model_path = cache_dir / f"world_sentencepiece_{fingerprint}.model"
  if not model_path.is_file():
    model_bytes = _train_sentencepiece(corpus, settings)
    _write_atomically(model_path, model_bytes)
  return SentencePieceTokenizer(model_path, context_length)


def _train_sentencepiece(corpus: Sequence[str], settings: Mapping[str, Any]) -> bytes:
  writer = io.BytesIO()
  spm.SentencePieceTrainer.train(sentence_iterator=iter(corpus), model_writer=writer, **settings)
  return writer.getvalue()


def get_tokenizer(
  tok_config: Mapping[str, Any],
) -> SentencePieceTokenizer | clip_bpe.ClipBpeTokenizer:
  """Builds the tokenizer that ``tok_config`` (dict or ConfigDict) names.

  Fields: ``name`` (one of TOKENIZER_NAMES), ``context_length`` (default 32);
  for "world_sentencepiece" optionally ``vocab_size`` and ``cache_dir``; for
  "sentencepiece" ``model_path``; for "clip_bpe" optionally ``vocab_path``
  (default: the merges file shipped with the package) and context_length 77.
  """
  name = tok_config.get("name")
  context_length = int(tok_config.get("context_length", 32))
  if name == "world_sentencepiece":
    return world_tokenizer(
      context_length=context_length,
      vocab_size=int(tok_config.get("vocab_size", 256)),
      cache_dir=tok_config.get("cache_dir"),
    )
  if name == "sentencepiece":
    model_path = tok_config.get("model_path")
    if not model_path:
      raise errors.ConfigError(
        "tokenizer 'sentencepiece' needs tok_config.model_path (a SentencePiece .model file)"
      )
    if not os.path.isfile(model_path):
      raise FileNotFoundError(
        f"SentencePiece model file not found: {model_path} (tok_config.model_path)"
      )
    return SentencePieceTokenizer(model_path, context_length)
  if name == "clip_bpe":
    return clip_bpe.ClipBpeTokenizer(
      context_length=int(tok_config.get("context_length", 77)),
      vocab_path=tok_config.get("vocab_path") or None,
    )
  raise errors.ConfigError(f"unknown tokenizer name {name!r}; valid names: {list(TOKENIZER_NAMES)}")
