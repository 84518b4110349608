"""The grounded world source (`world_boxes`): each example's box crop shows the
object its phrase names, the whole image and caption are the `world`
source's, and slices and resume come out exactly."""

import json

import numpy as np
import pytest

from hyperbolic_vl.data import registry
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


def input_config(name="world_boxes", batch_size=16, **data):
  return {"batch_size": batch_size, "image_size": 16, "data": {"name": name, **data}}


def first_batch(config, tokenizer, seed=3, process_index=0, process_count=1):
  return next(
    registry.make_train_iterator(
      config, tokenizer, seed=seed, process_index=process_index, process_count=process_count
    )
  )


@pytest.fixture(scope="module")
def batch_and_tokenizer():
  tokenizer = _Lookup()
  return first_batch(input_config(num_train=64), tokenizer), tokenizer


def test_batch_keys_and_shapes(batch_and_tokenizer):
  batch, _ = batch_and_tokenizer
  assert set(batch) == set(registry.get("world_boxes").batch_keys)
  assert batch["box_image"].shape == batch["image"].shape == (16, 16, 16, 3)
  assert batch["box_image"].dtype == np.uint8
  assert batch["box_tokens"].shape == (16, 4)


def test_each_box_crop_shows_the_object_its_phrase_names(batch_and_tokenizer):
  batch, tokenizer = batch_and_tokenizer
  drew_a_distractor = False
  for row, index in enumerate(batch["index"]):
    scene = world.sample_scene(0, "train", int(index))
    phrase = tokenizer.decode(batch["box_tokens"][row])
    named = [
      obj for obj in scene.objects if world.with_article(f"{obj.color} {obj.shape}") == phrase
    ]
    assert named, (phrase, scene)
    drew_a_distractor |= all(obj is not scene.main for obj in named)
    # The crop keeps the inner half of the object's box at 16 px, so pixels
    # wholly inside the shape carry its colour exactly (coverage 1); at least
    # a tenth of them for every shape (the ring's hole included).
    colour = np.asarray(world.COLOR_RGB[named[0].color])
    exact = np.all(np.abs(batch["box_image"][row].astype(int) - colour) <= 1, axis=-1)
    assert exact.mean() >= 0.1, (phrase, exact.mean())
  # The box is drawn among all the scene's objects, not only the main one.
  assert drew_a_distractor


def test_whole_image_and_caption_are_the_world_sources(batch_and_tokenizer):
  batch, tokenizer = batch_and_tokenizer
  # The same seed and the scene-caption tier: the `world` source's batch.
  world_batch = first_batch(
    input_config("world", num_train=64, tier_weights=[0, 0, 0, 1]), tokenizer
  )
  for key in ("image", "tokens", "index", "label/shape", "tier_tokens"):
    np.testing.assert_array_equal(batch[key], world_batch[key], err_msg=key)
  for row, index in enumerate(batch["index"]):
    caption = world.caption_tiers(world.sample_scene(0, "train", int(index)))[-1]
    assert tokenizer.decode(batch["tokens"][row]) == caption


def test_process_slices_and_resume_are_exact():
  tokenizer = _Lookup()
  config = input_config(num_train=40, batch_size=8)
  whole = first_batch(config, tokenizer)
  halves = [first_batch(config, tokenizer, process_index=p, process_count=2) for p in range(2)]
  for key in ("box_image", "box_tokens", "image", "index"):
    np.testing.assert_array_equal(np.concatenate([h[key] for h in halves]), whole[key])
  iterator = registry.make_train_iterator(
    config, tokenizer, seed=3, process_index=0, process_count=1
  )
  next(iterator)
  state = json.loads(json.dumps(iterator.get_state()))
  expected = next(iterator)
  resumed = registry.make_train_iterator(
    config, tokenizer, seed=3, process_index=0, process_count=1
  )
  resumed.set_state(state)
  got = next(resumed)
  for key in expected:
    np.testing.assert_array_equal(got[key], expected[key], err_msg=key)


def test_evaluation_split_is_the_worlds():
  tokenizer = _Lookup()
  grounded = registry.load_eval_split(input_config(), tokenizer, num_examples=3)
  plain = registry.load_eval_split(input_config("world"), tokenizer, num_examples=3)
  for key, value in plain.items():
    np.testing.assert_array_equal(grounded[key], value, err_msg=key)
