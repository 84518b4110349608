"""The data registry: names, settings checks, a source registered by a user
module alone, and labels that come from their source."""

import dataclasses

import numpy as np
import pytest
from letter_tokenizer import LetterTokenizer

from configs import hcl as hcl_config
from configs import meru as meru_config
from configs import radial as radial_config
from hyperbolic_vl.data import pipeline, registry
from hyperbolic_vl.data import synthetic_world as world
from hyperbolic_vl.data.settings import SourceSettings

BUILTIN = {
  "world",
  "image_text_csv",
  "tfds",
  "tar_shards",
  "world_tiers",
  "hierarcaps_tiers",
  "world_scene_objects",
  "coco_scene_objects",
  "world_boxes",
  "grit",
  "coco_grounded",
}


def input_config(data, batch_size=4):
  return {"batch_size": batch_size, "image_size": 8, "data": data}


def test_builtin_sources_are_registered_once_each():
  assert BUILTIN <= set(registry.names())
  for name in BUILTIN:
    source = registry.get(name)
    assert source.name == name and source.Settings.source == name
    assert source.batch_keys


def test_unknown_source_lists_the_valid_names():
  with pytest.raises(ValueError, match="laion") as error:
    registry.make_train_iterator(
      input_config({"name": "laion"}), LetterTokenizer(8), seed=0, process_index=0, process_count=1
    )
  message = str(error.value)
  assert "\n" not in message and all(name in message for name in BUILTIN)


def test_unknown_setting_names_the_key_and_the_valid_ones():
  with pytest.raises(ValueError, match="world_sed") as error:
    registry.make_train_iterator(
      input_config({"name": "world", "world_sed": 1}),
      LetterTokenizer(8),
      seed=0,
      process_index=0,
      process_count=1,
    )
  assert "world_seed" in str(error.value) and "tier_weights" in str(error.value)
  # Another source's key is unknown too: a section holds one source's keys.
  with pytest.raises(ValueError, match="image_root"):
    registry.load_eval_split(
      input_config({"name": "world", "image_root": "/x"}), LetterTokenizer(8)
    )
  with pytest.raises(ValueError, match="batch_sise"):
    registry.load_eval_split({"batch_sise": 2, "data": {"name": "world"}}, LetterTokenizer(8))


def test_settings_are_frozen_and_coerced():
  settings = registry.settings_class("world").from_config(
    {"name": "world", "num_train": "12", "tier_weights": [0, 0, 1, 1]}
  )
  assert settings.num_train == 12 and settings.tier_weights == (0.0, 0.0, 1.0, 1.0)
  with pytest.raises(dataclasses.FrozenInstanceError):
    settings.num_train = 3
  with pytest.raises(ValueError, match="augment"):
    registry.settings_class("world_scene_objects").from_config({"augment": "simclr"})


def test_section_holds_every_setting_and_overrides_are_checked():
  section = registry.section("tar_shards", path="/data/shard-{0..9}.tar")
  assert section.name == "tar_shards" and section.path == "/data/shard-{0..9}.tar"
  assert set(section) == {"name"} | {
    f.name for f in dataclasses.fields(registry.settings_class("tar_shards"))
  }
  section.tier_separator = " => "  # an optional setting can be filled from the command line
  with pytest.raises(ValueError, match="colour"):
    registry.section("world", colour="red")


def test_configs_build_their_source_sections():
  assert meru_config.get_config().input.data.name == "world"
  assert meru_config.get_config("vit_b").input.data.name == "image_text_csv"
  tfds = meru_config.get_config("vit_b,data=tfds").input.data
  assert tfds.name == "tfds" and tfds.num_train == 100_000 and "image_root" not in tfds
  assert radial_config.get_config().input.data.name == "world_tiers"
  assert radial_config.get_config("vit_s").input.data.name == "hierarcaps_tiers"
  hcl = hcl_config.get_config().input.data
  assert (hcl.name, hcl.augment, hcl.sampling) == ("world_scene_objects", "none", "released")
  assert hcl.min_box_pixels == 56 * 56 and hcl.scene_pixels == 512
  coco = hcl_config.get_config("vit_s").input.data
  assert (coco.name, coco.augment) == ("coco_scene_objects", "moco_v2")


def test_sources_without_an_eval_split_say_so():
  config = input_config({"name": "hierarcaps_tiers", "path": "unused.csv"})
  with pytest.raises(registry.NoEvalSplitError, match="hierarcaps_tiers"):
    registry.load_eval_split(config, LetterTokenizer(8))
  # The world's derived sources evaluate on the world's held-out split.
  world_eval = registry.load_eval_split(
    input_config({"name": "world"}), LetterTokenizer(8), num_examples=3
  )
  tiers_eval = registry.load_eval_split(
    input_config({"name": "world_tiers"}), LetterTokenizer(8), num_examples=3
  )
  for key, value in world_eval.items():
    np.testing.assert_array_equal(tiers_eval[key], value, err_msg=key)
  on_world = {name for name in registry.names() if registry.get(name).eval_source == "world"}
  assert on_world == {"world", "world_tiers", "world_scene_objects", "world_boxes"}


def test_world_labels_come_from_the_world_source():
  batch = next(
    registry.make_train_iterator(
      input_config({"name": "world", "num_train": 20}),
      LetterTokenizer(8),
      seed=0,
      process_index=0,
      process_count=1,
    )
  )
  assert set(batch) == set(registry.get("world").batch_keys)
  for row, index in enumerate(batch["index"]):
    for kind, label in world.labels(world.sample_scene(0, "train", int(index))).items():
      assert batch[f"label/{kind}"][row] == label


# A source defined and registered by this test module alone.
@dataclasses.dataclass(frozen=True)
class CountingSettings(SourceSettings):
  source = "counting_test"
  num_train: int = 10
  offset: int = 0


@registry.register
class CountingSource(registry.DataSource):
  """Example i is the image filled with i + offset, captioned "n<i>", with
  label/parity its parity: labels declared by the source, not the collate."""

  name = "counting_test"
  Settings = CountingSettings
  batch_keys = ("image", "tokens", "index", "label/parity")

  def train_iterator(self, input_settings, settings, tokenizer, *, seed, **layout):
    size = input_settings.need_image_size()

    def assemble(rows):
      indices = np.asarray([index for _, index in rows], np.int64)
      return {
        "image": np.stack(
          [np.full((size, size, 3), i + settings.offset, np.uint8) for i in indices]
        ),
        "tokens": tokenizer.encode([f"n{i}" for i in indices]),
        "index": indices,
        "label/parity": (indices % 2).astype(np.int32),
      }

    batches = pipeline.sliced_batches(
      settings.num_train,
      seed=seed,
      batch_size=input_settings.batch_size,
      assemble=assemble,
      **layout,
    )
    return pipeline.iterate(batches, num_threads=input_settings.num_threads)


def test_a_user_registered_source_trains_through_the_registry():
  assert "counting_test" in registry.names()
  config = input_config({"name": "counting_test", "offset": 3, "num_train": 12}, batch_size=6)
  iterator = registry.make_train_iterator(
    config, LetterTokenizer(8), seed=1, process_index=0, process_count=1
  )
  first, second = next(iterator), next(iterator)
  assert set(first) == set(CountingSource.batch_keys)
  epoch = np.concatenate([first["index"], second["index"]])
  assert sorted(epoch) == list(range(12))
  np.testing.assert_array_equal(first["image"][:, 0, 0, 0], first["index"] + 3)
  np.testing.assert_array_equal(first["label/parity"], first["index"] % 2)
  # Per-process slices and resume come from the shared machinery.
  halves = [
    next(
      registry.make_train_iterator(
        config, LetterTokenizer(8), seed=1, process_index=p, process_count=2
      )
    )
    for p in range(2)
  ]
  np.testing.assert_array_equal(np.concatenate([h["index"] for h in halves]), first["index"])
  state = iterator.get_state()
  expected = next(iterator)
  resumed = registry.make_train_iterator(
    config, LetterTokenizer(8), seed=1, process_index=0, process_count=1
  )
  resumed.set_state(state)
  np.testing.assert_array_equal(next(resumed)["index"], expected["index"])
  # Its settings are checked like a built-in's; it has no evaluation split.
  with pytest.raises(ValueError, match="ofset"):
    registry.make_train_iterator(
      input_config({"name": "counting_test", "ofset": 1}),
      LetterTokenizer(8),
      seed=0,
      process_index=0,
      process_count=1,
    )
  with pytest.raises(registry.NoEvalSplitError):
    registry.load_eval_split(config, LetterTokenizer(8))
