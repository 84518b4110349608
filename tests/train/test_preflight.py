"""The preflight's memory verdict: from a compiled step's memory analysis,
the line it prints and, when the step does not fit, the one line of levers
with the figure each leaves (first-order: activations shrink with the rows
a device holds at once)."""

import dataclasses
import types

import jax
import ml_collections
import numpy as np
import pytest
from letter_tokenizer import LetterTokenizer
from tiny_runs import small_config

from hyperbolic_vl import objectives
from hyperbolic_vl.data import registry as data_registry
from hyperbolic_vl.data import tokenizer as tokenizer_lib
from hyperbolic_vl.training import loop, preflight, setup

GIB = 2**30


def analysis(arguments_gib, temporary_gib):
  """A compiled step's memory analysis whose outputs are all donated."""
  return types.SimpleNamespace(
    argument_size_in_bytes=int(arguments_gib * GIB),
    temp_size_in_bytes=int(temporary_gib * GIB),
    output_size_in_bytes=int(arguments_gib * GIB),
    alias_size_in_bytes=int(arguments_gib * GIB),
  )


@pytest.fixture
def machine_with_10_gib(monkeypatch):
  monkeypatch.setattr(
    preflight, "device_memory", lambda: (10 * GIB, "the machine has {:.1f} GiB free")
  )


def test_a_step_that_fits_prints_its_need_and_no_refusal(machine_with_10_gib):
  config = ml_collections.ConfigDict({"input": {"batch_size": 64}})
  line, refusal = preflight.memory_line(config, analysis(2, 6), num_devices=1)
  assert line == "Memory per device: the step needs 8.00 GiB; the machine has 10.0 GiB free"
  assert refusal is None


def test_vit_l_at_its_paper_batch_names_the_levers_that_fit(machine_with_10_gib):
  """ViT-L's step at batch 2048 on one CPU (its analysis: 4.4 GiB of params,
  optimizer state and batch, 1343 GiB of activations): accumulation must go
  to 256 micro-batches (8 rows each: 4.4 + 1343 / 256 = 9.65 GiB) before it
  fits, past the 32 a fixed list would stop at."""
  config = ml_collections.ConfigDict({"input": {"batch_size": 2048}})
  line, refusal = preflight.memory_line(config, analysis(4.4, 1343), num_devices=1)
  assert line == "Memory per device: the step needs 1347.40 GiB; the machine has 10.0 GiB free"
  # Full remat (4.4 + 1343 / 4 = 340.2 GiB) would not fit: not named.
  assert refusal == (
    "the step needs 1347.4 GiB per device and the machine has 10.0 GiB free; to fit, set one "
    "of: optim.accumulation_steps=256 (about 9.6 GiB); input.batch_size=8 (about 9.6 GiB)"
  )
  # Eight devices, each holding 256 rows: fsdp would leave 4.4 / 8 + 167.9 =
  # 168.4 GiB, which does not fit: only accumulation and the batch are named.
  _, refusal = preflight.memory_line(config, analysis(4.4, 1343 / 8), num_devices=8)
  assert "optim.accumulation_steps=32 (about 9.6 GiB)" in refusal
  assert "mesh.fsdp" not in refusal and "remat" not in refusal


def test_a_lever_that_fits_only_with_another_is_named_as_the_pair(machine_with_10_gib):
  """Eight devices of 10 GiB, 8 rows each. 20 GiB of params, optimizer state
  and batch with 5 GiB of activations: only fsdp fits alone (20 / 8 + 5 =
  7.5 GiB). With 40 GiB of activations no lever fits alone (fsdp: 2.5 + 40;
  accumulation: 20 + 40 / k; remat: 20 + 10), but fsdp with 8 micro-batches
  does: 2.5 + 40 / 8 = 7.5 GiB."""
  config = ml_collections.ConfigDict({"input": {"batch_size": 64}})
  _, refusal = preflight.memory_line(config, analysis(20, 5), num_devices=8)
  assert refusal.endswith("to fit, set one of: mesh.fsdp=8 (about 7.5 GiB)")
  _, refusal = preflight.memory_line(config, analysis(20, 40), num_devices=8)
  assert refusal.endswith(
    "to fit, set one of: mesh.fsdp=8 with optim.accumulation_steps=8 (about 7.5 GiB)"
  )


def test_on_cpu_the_memory_is_what_the_machine_has_free(monkeypatch):
  """Other programs share a CPU machine's memory: the verdict counts what is
  free now plus what this process holds, never more than the machine has."""
  monkeypatch.setattr(preflight, "_meminfo_bytes", lambda field: 3 * GIB)
  monkeypatch.setattr(preflight, "_own_resident_bytes", lambda: 1 * GIB)
  memory = preflight.device_memory()
  if not memory[1].startswith("the machine"):
    pytest.skip("an accelerator reports its own limit")
  devices = len(preflight.jax.local_devices())
  assert memory == (4 * GIB // devices, "the machine has {:.1f} GiB free")


def test_the_gradients_are_a_part_no_lever_on_the_rows_shrinks(machine_with_10_gib):
  """ViT-L's float32 gradients (367M params: 1.37 GiB) stay whatever the
  micro-batch: counted, batch 8 comes to 4.4 + 1.37 + 1341.6 / 256 = 11.0 GiB
  (the compiled batch-8 step on this CPU needed 10.77 GiB, where the
  estimate without them said 9.6), so the levers go one step further."""
  config = ml_collections.ConfigDict({"input": {"batch_size": 2048}})
  _, refusal = preflight.memory_line(
    config, analysis(4.4, 1343), num_devices=1, gradient_bytes=int(1.37 * GIB)
  )
  assert "optim.accumulation_steps=512 (about 8.4 GiB)" in refusal
  assert "input.batch_size=4 (about 8.4 GiB)" in refusal
  assert "remat" not in refusal  # 4.4 + 1.37 + 1341.6 / 4 = 341.2 GiB


def test_levers_already_set_are_not_named_again(machine_with_10_gib):
  config = ml_collections.ConfigDict(
    {
      "input": {"batch_size": 64},
      "optim": {"accumulation_steps": 2},
      "model": {"image_remat": "full", "text_remat": "full"},
    }
  )
  # 32 rows at once (64 in 2 micro-batches): 4 + 12 / 2 fits, so 2 x 2.
  _, refusal = preflight.memory_line(config, analysis(4, 12), num_devices=1)
  assert refusal == (
    "the step needs 16.0 GiB per device and the machine has 10.0 GiB free; to fit, set one "
    "of: optim.accumulation_steps=4 (about 10.0 GiB); input.batch_size=32 (about 10.0 GiB)"
  )
  # The params, optimizer state and gradients alone exceed the device.
  _, refusal = preflight.memory_line(config, analysis(9, 4), num_devices=1, gradient_bytes=2 * GIB)
  assert refusal == (
    "the step needs 13.0 GiB per device and the machine has 10.0 GiB free; the params, "
    "optimizer state and gradients alone need about 11.0 GiB, more than a lever on the rows "
    "can free: split them over more devices (mesh.fsdp) or use a device with more memory"
  )


# --- the state, before it is built -------------------------------------------


def test_the_state_figure_is_params_adam_moments_and_gradients():
  """The tiny MERU model's float32 params under AdamW: the params, the two
  moments and the gradients are 4 x 4 bytes a param, plus the optimizer's
  and the schedule's int32 step counters; fsdp=2 halves a device's share."""
  config = small_config()
  objective = objectives.get(config.objective)
  tokenizer = tokenizer_lib.get_tokenizer(config.input.tokenizer)
  _, params = setup.build_model(config, objective, tokenizer, seed=0)
  count = setup.param_count(params)
  assert setup.state_bytes_per_device(config, objective, tokenizer, fsdp=1) == 16 * count + 8
  assert setup.state_bytes_per_device(config, objective, tokenizer, fsdp=2) == (16 * count + 8) // 2


def test_a_state_larger_than_the_device_is_refused_with_one_line(machine_with_10_gib):
  preflight.refuse_a_state_that_cannot_fit(int(9.9 * GIB))  # fits: nothing said
  with pytest.raises(preflight.StepDoesNotFitError) as refused:
    preflight.refuse_a_state_that_cannot_fit(int(10.5 * GIB))
  assert str(refused.value) == (
    "the params, optimizer state and gradients alone need 10.5 GiB per device and the "
    "machine has 10.0 GiB free, before any activation: no lever on the batch frees that; "
    "split them over more devices (mesh.fsdp), use a smaller model variant or a machine "
    "with more memory"
  )


def test_a_run_whose_state_cannot_fit_stops_before_building_it(tmp_path, monkeypatch, capsys):
  """On a machine too small for the state the kernel's OOM killer ended the
  run while it initialised the params, with no word: the refusal now comes
  first, from abstract shapes, and the workdir is left as it was (absent)."""
  monkeypatch.setattr(
    preflight, "device_memory", lambda: (2**20, "the machine has {:.1f} GiB free")
  )

  def built(*args, **kwargs):
    raise AssertionError("the state was built before the verdict")

  monkeypatch.setattr(setup, "init_state", built)
  workdir = tmp_path / "run"
  with pytest.raises(preflight.StepDoesNotFitError, match=r"alone need 3\.1 MiB per device"):
    loop.train(small_config(), str(workdir))
  assert "Parameters:" not in capsys.readouterr().out
  assert not workdir.exists()  # a refused first start leaves no folder behind


# --- the batch's inputs, before the iterator builds one ----------------------

# One row of `world_boxes` with 3 box slots, 8 px images and 8-token rows,
# counted by hand: images 1 + 3 box slots = 4 of 8 * 8 * 3 = 192 bytes; token
# rows 1 caption + 3 phrases + 4 tiers + 4 negative tiers = 12 of 8 int32s.
BOXES_ROW_BYTES = 4 * 192 + 12 * 8 * 4  # 1152
BOXES_ROW_PIXELS = 4 * 192


def _source_and_settings(data):
  source = data_registry.get(data["name"])
  return source, source.Settings.from_config(data)


@pytest.mark.parametrize(
  "data",
  [
    {"name": "world"},
    {"name": "world_boxes"},
    {"name": "world_boxes", "max_boxes": 3},
    {"name": "world_quadruplets"},
    {"name": "world_scene_objects", "augment": "none"},
    {"name": "world_tiers"},
  ],
  ids=lambda data: "-".join(str(v) for v in data.values()),
)
def test_the_counted_inputs_are_the_bytes_of_a_real_batch(data):
  """What the preflight counts per row (`DataSource.row_inputs`) equals the
  images and token rows of a batch the source really builds (2 rows)."""
  source, settings = _source_and_settings({**data, "num_train": 4})
  batch = next(
    data_registry.make_train_iterator(
      {"batch_size": 2, "image_size": 8, "data": {**data, "num_train": 4}},
      LetterTokenizer(8),
      seed=0,
      process_index=0,
      process_count=1,
    )
  )
  inputs = source.row_inputs(settings)
  images = {k for k, v in batch.items() if getattr(v, "dtype", None) == np.uint8}
  texts = {k for k in batch if k.endswith("tokens")}
  assert {r.key for r in inputs} == images | texts
  nbytes, pixels = preflight.row_bytes(inputs, image_size=8, context_length=8)
  assert 2 * nbytes == sum(batch[r.key].nbytes for r in inputs)
  assert 2 * pixels == sum(batch[k].size for k in images)
  if data.get("max_boxes") == 3:
    assert (nbytes, pixels) == (BOXES_ROW_BYTES, BOXES_ROW_PIXELS)


def test_the_input_memory_is_the_fed_and_read_ahead_batches_and_float32_images():
  """Hand-computed: 2 rows, 2 batches read ahead: the host holds 3 batches;
  the devices the batch and its pixels in float32 (4 bytes), half the rows at
  once with 2 micro-batches."""
  source, settings = _source_and_settings({"name": "world_boxes", "max_boxes": 3})
  inputs = source.row_inputs(settings)
  memory = preflight.InputMemory.of(
    inputs, rows=2, image_size=8, context_length=8, prefetch=2, accumulation_steps=1
  )
  assert memory == preflight.InputMemory(host=6912, device=2 * 1152 + 2 * 768 * 4)
  halves = preflight.InputMemory.of(
    inputs, rows=2, image_size=8, context_length=8, prefetch=2, accumulation_steps=2
  )
  assert halves.device == 2 * 1152 + 1 * 768 * 4


def test_box_slots_beyond_the_machine_are_refused_naming_the_levers(monkeypatch):
  """UNCHA's tiny batch (64 rows, 32 px, 32 tokens, 2 batches read ahead)
  with 100,000 box slots on a CPU machine with 16 GiB free. Per row, for v
  slots: bytes nb = (1 + v) 3072 + (9 + v) 128 = 4224 + 3200 v, pixels
  3072 (1 + v); all of it: rows (4 nb + 4 pixels) = 4 rows (7296 + 6272 v):
  v = 100,000 and 64 rows need 160,565,067,776 bytes (149.5 GiB); 16 GiB
  holds v <= 10,698 (16.0 GiB) or 6 rows (14.0 GiB); without read-ahead
  (rows (2 nb + 4 pixels)) it still needs 111 GiB, so that lever is not named."""
  devices = jax.local_device_count()  # the machine's memory is split between them
  monkeypatch.setattr(
    preflight, "device_memory", lambda: (16 * GIB // devices, "the machine has {:.1f} GiB free")
  )
  config = ml_collections.ConfigDict(
    {"input": {"batch_size": 64, "image_size": 32, "prefetch_batches": 2}}
  )
  source, settings = _source_and_settings({"name": "world_boxes", "max_boxes": 100_000})
  refuse = lambda: preflight.refuse_inputs_that_cannot_fit(
    config, source, settings, context_length=32, num_devices=1
  )
  with pytest.raises(preflight.StepDoesNotFitError) as refused:
    refuse()
  assert 4 * 64 * (7296 + 6272 * 100_000) == 160_565_067_776
  assert str(refused.value) == (
    "the batch's inputs alone need 149.5 GiB before any activation: 64 rows, each 100,001 "
    "images of 32 px and 100,009 token rows of 32 (box_image 100,000 = input.data.max_boxes, "
    "box_tokens 100,000 = input.data.max_boxes); the machine has 16.0 GiB free; to fit them "
    "(the compiled step's own check follows), set one of: input.data.max_boxes=10698 or less "
    "(inputs about 16.0 GiB); input.batch_size=6 or less (inputs about 14.0 GiB)"
  )
  # The figures at the levers, by hand: within 16 GiB, one more over it.
  assert 4 * 64 * (7296 + 6272 * 10_698) <= 16 * GIB < 4 * 64 * (7296 + 6272 * 10_699)
  assert 4 * 6 * 627_207_296 <= 16 * GIB < 4 * 7 * 627_207_296
  settings = dataclasses.replace(settings, max_boxes=4)  # the tiny config's: fits
  refuse()


def test_a_run_whose_inputs_cannot_fit_stops_before_its_iterator_is_built(tmp_path, monkeypatch):
  """`setup.validate` of UNCHA's tiny config with 100,000 box slots: refused
  from the counts alone, before the data iterator (or anything after it) is
  built, and nothing is written (the command line's case of the same input
  is in tests/integration/test_command_line_errors.py, slow tier)."""
  from configs import uncha as uncha_config

  config = uncha_config.get_config()
  with config.unlocked():
    config.input.data.max_boxes = 100_000

  def built(*args, **kwargs):
    raise AssertionError("the data iterator was built before the verdict")

  monkeypatch.setattr(data_registry, "make_train_iterator", built)
  # This 24 GB machine's verdict on any machine (an accelerator says its own).
  devices = jax.local_device_count()
  monkeypatch.setattr(
    preflight, "device_memory", lambda: (16 * GIB // devices, "the machine has {:.1f} GiB free")
  )
  workdir = tmp_path / "run"
  with pytest.raises(preflight.StepDoesNotFitError, match=r"inputs alone need 149\.5 GiB"):
    setup.validate(config, str(workdir))
  assert not workdir.exists()
