"""Text-only caption-tier batches (Radial Embeddings' RE loss): the world's
(`world_tiers`) or a HierarCaps train CSV's (`hierarcaps_tiers`).

  tier_tokens     int32 (b, 4, L)   positive tiers, most general first
  neg_tier_tokens int32 (b, 4, L)   negatives contradicting each tier

No image is rendered or read. `world_tiers` evaluates on the world's held-out
splits (as `world`); a HierarCaps train CSV has no evaluation split (its test
CSV is read by the hierarchy evaluator itself).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np

from hyperbolic_vl.data import pipeline, registry
from hyperbolic_vl.data import synthetic_captions as world_source
from hyperbolic_vl.data import synthetic_world as world
from hyperbolic_vl.data.readers import hierarcaps
from hyperbolic_vl.data.settings import SourceSettings

_NEGATIVES_STREAM = 0x6E6567  # "neg"
# Tokenized texts kept before the cache is dropped (bounds memory on large
# real corpora; the world's grammar has under 2k).
_CACHE_LIMIT = 200_000


class TierTokens:
  """(position, index) rows -> token arrays of their positive and negative
  tiers. Repeated texts (the world's grammar, shared tiers) are tokenized
  once; the cache is bounded for large real corpora."""

  def __init__(self, example, num_examples: int, tokenizer):
    self.example = example
    self.num_examples = int(num_examples)
    self.tokenizer = tokenizer
    self._cache: dict[str, np.ndarray] = {}

  def _encode(self, texts: Sequence[str]) -> np.ndarray:
    missing = [t for t in dict.fromkeys(texts) if t not in self._cache]
    if missing:
      for text, ids in zip(missing, self.tokenizer.encode(missing)):
        self._cache[text] = np.asarray(ids, np.int32)
      if len(self._cache) > _CACHE_LIMIT:
        self._cache.clear()
        return np.asarray(self.tokenizer.encode(list(texts)), np.int32)
    return np.stack([self._cache[t] for t in texts])

  def __call__(self, rows: list[tuple[int, int]]) -> dict[str, np.ndarray]:
    positives, negatives = [], []
    for position, index in rows:
      pos, neg = self.example(position // self.num_examples, index)
      positives += pos
      negatives += neg
    b = len(rows)
    return {
      "tier_tokens": self._encode(positives).reshape(b, hierarcaps.NUM_TIERS, -1),
      "neg_tier_tokens": self._encode(negatives).reshape(b, hierarcaps.NUM_TIERS, -1),
    }


def tier_text_iterator(
  example: Callable[[int, int], tuple[list[str], list[str]]],
  num_examples: int,
  batch_size: int,
  tokenizer,
  seed: int,
  process_index: int = 0,
  process_count: int = 1,
):
  """Checkpointable grain iterator of text-tier batches: example(epoch,
  index) gives an example's positive and negative tiers (data/pipeline.py
  gives the order and the per-process slices)."""
  if num_examples < 1:
    raise ValueError("no training examples")
  batches = pipeline.sliced_batches(
    num_examples,
    seed=seed,
    batch_size=batch_size,
    process_index=process_index,
    process_count=process_count,
    assemble=TierTokens(example, num_examples, tokenizer),
  )
  # One reader thread: the tokenizer cache is shared by the map.
  return pipeline.iterate(batches, num_threads=1, prefetch_batches=2)


@dataclasses.dataclass(frozen=True)
class WorldTierExample:
  """World scene `index` -> (positive tiers, negative tiers); negatives vary by epoch."""

  world_seed: int
  seed: int

  def __call__(self, epoch: int, index: int):
    scene = world.sample_scene(self.world_seed, "train", index)
    rng = np.random.default_rng((self.seed, epoch, index, _NEGATIVES_STREAM))
    return world.caption_tiers(scene), world.negative_tiers(scene, rng)


_TIER_KEYS = ("tier_tokens", "neg_tier_tokens")


@dataclasses.dataclass(frozen=True)
class WorldTiersSettings(SourceSettings):
  source = "world_tiers"
  num_train: int = 100_000
  num_eval: int = 1000  # default size of the world's evaluation split
  world_seed: int = 0


@registry.register
class WorldTiersSource(world_source.WorldHeldOut, registry.DataSource):
  """The world's caption tiers and their negatives, text only."""

  name = "world_tiers"
  Settings = WorldTiersSettings
  batch_keys = _TIER_KEYS

  def num_train_examples(self, settings):
    return settings.num_train

  def train_iterator(self, input_settings, settings, tokenizer, *, seed, **layout):
    return tier_text_iterator(
      WorldTierExample(settings.world_seed, seed),
      settings.num_train,
      input_settings.batch_size,
      input_settings.resolve_tokenizer(tokenizer),
      seed,
      **layout,
    )


@dataclasses.dataclass(frozen=True)
class HierarCapsTiersSettings(SourceSettings):
  source = "hierarcaps_tiers"
  path: str = ""  # the train CSV (`positive, negative, image_url`), .csv or .csv.gz
  num_train: int = 0  # cap on the training rows; 0: all
  # The test CSV and its images, for the hierarchy evaluator (source="hierarcaps").
  eval_path: str = ""
  image_root: str = ""


@registry.register
class HierarCapsTiersSource(registry.DataSource):
  """A HierarCaps train CSV's positive and negative tiers, text only."""

  name = "hierarcaps_tiers"
  Settings = HierarCapsTiersSettings
  batch_keys = _TIER_KEYS

  def _split(self, settings):
    if not settings.path:
      raise ValueError("input.data.path (a HierarCaps train CSV) is required")
    split = hierarcaps.load_train(settings.path, None)
    return split, min(settings.num_train or len(split), len(split))

  def num_train_examples(self, settings):
    return self._split(settings)[1]

  def train_iterator(self, input_settings, settings, tokenizer, *, seed, **layout):
    split, num_rows = self._split(settings)
    return tier_text_iterator(
      lambda epoch, i: (split.tiers[i], split.negatives[i]),
      num_rows,
      input_settings.batch_size,
      input_settings.resolve_tokenizer(tokenizer),
      seed,
      **layout,
    )
