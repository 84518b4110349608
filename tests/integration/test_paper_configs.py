"""Every paper-scale config runs as documented, with nothing but its data named.

An outside check found `configs/meru.py:vit_l` stopping at start-up (its
tokenizer defaulted to a SentencePiece model with no path) while every test
was green, because each test overrode the tokenizer. Here each paper variant
keeps its defaults: its input pipeline (one per distinct input section) is
built on a two-row dataset and yields a batch of the configured image size
and context length; then one
training step of each config's model runs at a reduced width (the widths
are the only change to the model: a ViT-L step on a CPU is minutes) on a
smaller batch of smaller images (the pipeline's default batch of 2048 images
at 224 px is 1.2 GB; neither size changes which code runs).
"""

import importlib
import json
import math

import documented_data as fixture_files
import numpy as np
import pytest
from paths import method_config_names
from PIL import Image

from configs import common
from hyperbolic_vl.data import registry as data_registry
from hyperbolic_vl.data import tokenizer as tokenizer_lib
from hyperbolic_vl.training import loop

# Every method config on disk (a new method is covered without editing a list).
CONFIGS = {name: importlib.import_module(f"configs.{name}") for name in method_config_names()}
OPENAI = tuple(common.OPENAI_VARIANTS)
VARIANTS = {
  name: tuple(common.PAPER_VARIANTS)
  + (OPENAI if name in ("clip", "radial") else ())
  + (("rn50",) if name == "hcl" else ())
  for name in CONFIGS
}
SMALL_BATCH = 8


@pytest.fixture(scope="module")
def two_rows(tmp_path_factory):
  """Two captioned images (CSV), a COCO instances file over the same images
  and two HierarCaps training rows."""
  root = tmp_path_factory.mktemp("two_rows")
  images = root / "images"
  images.mkdir()
  for index, colour in enumerate([(200, 30, 30), (30, 30, 200)]):
    Image.new("RGB", (320, 240), colour).save(images / f"{index}.jpg")
  (root / "captions.csv").write_text("image,caption\n0.jpg,a red square\n1.jpg,a blue square\n")
  # Eight entries over the two images: HCL's paper run is sized in epochs of
  # whole batches (rows // batch), so its one step needs a batch's worth.
  instances = dict(
    images=[dict(id=i, file_name=f"{i % 2}.jpg", width=320, height=240) for i in range(8)],
    annotations=[
      dict(id=10 * i + j, image_id=i, bbox=box, area=box[2] * box[3], iscrowd=0, category_id=1)
      for i in range(8)
      for j, box in enumerate([[10, 10, 120, 100], [150, 90, 140, 130]])
    ],
    categories=[dict(id=1, name="square")],
  )
  (root / "instances.json").write_text(json.dumps(instances))
  fixture_files.hierarcaps_train_csv(root / "hierarcaps_train.csv")
  return root


def documented_data(source: str, root) -> dict:
  """The data settings a user names on the documented command line for a
  paper variant's data source."""
  if source == "hierarcaps_tiers":
    return dict(path=str(root / "hierarcaps_train.csv"))
  if source == "coco_scene_objects":
    return dict(path=str(root / "instances.json"), image_root=str(root / "images"))
  if source.startswith("world"):  # the synthetic world: no files
    return {}
  if source == "visu":  # HySAC's ViSU: the two images as COCO ids and as unsafe images
    coco = root / "coco" / "val2017"
    coco.mkdir(parents=True, exist_ok=True)
    entries = {}
    for index in range(2):
      (coco / f"{index + 1:012d}.jpg").write_bytes((root / "images" / f"{index}.jpg").read_bytes())
      entries[str(index)] = dict(
        coco_id=index + 1, nsfw_im_path=f"{index}.jpg", safe="a square", nsfw="a bad square"
      )
    (root / "visu.json").write_text(json.dumps(entries))
    return dict(
      path=str(root / "visu.json"),
      safe_image_root=str(root / "coco"),
      unsafe_image_root=str(root / "images"),
    )
  assert source == "image_text_csv", f"no documented files for data source {source!r}"
  return dict(path=str(root / "captions.csv"), image_root=str(root / "images"))


def paper_config(name: str, variant: str, root):
  config = CONFIGS[name].get_config(variant)
  with config.unlocked():
    config.input.data.update(documented_data(config.input.data.name, root))
  return config


def variants_by_input_section() -> dict[str, list[tuple[str, str]]]:
  """The paper variants grouped by their `config.input` section (40 variants,
  7 sections today: the ViT sizes of one method share theirs). The pipeline
  and the tokenizer are built from that section alone
  (`make_train_iterator(config.input, ...)`), so one variant runs each
  section's pipeline; a variant whose defaults differ from its siblings'
  (the tokenizer default that stopped meru's vit_l) lands in a group of
  its own."""
  groups: dict[str, list[tuple[str, str]]] = {}
  for name, variants in VARIANTS.items():
    for variant in variants:
      section = json.dumps(CONFIGS[name].get_config(variant).input.to_dict(), sort_keys=True)
      groups.setdefault(section, []).append((name, variant))
  return {
    "+".join(sorted({name for name, _ in group})) + f"-{group[-1][1]}": group
    for group in groups.values()
  }


INPUT_GROUPS = variants_by_input_section()


@pytest.mark.parametrize("group", INPUT_GROUPS.values(), ids=INPUT_GROUPS.keys())
def test_each_paper_variants_input_pipeline_runs_with_its_defaults(group, two_rows):
  name, variant = group[-1]  # the largest ViT (or HCL's ResNet) of the group
  config = paper_config(name, variant, two_rows)
  tokenizer = tokenizer_lib.get_tokenizer(config.input.tokenizer)
  if name != "hcl":  # HCL has no text tower; every other paper trains with CLIP's BPE
    assert (config.input.tokenizer.name, tokenizer.vocab_size) == ("clip_bpe", 49408)
  with config.unlocked():
    config.input.batch_size = SMALL_BATCH
  batch = next(iter(data_registry.make_train_iterator(config.input, tokenizer, seed=0)))
  size = config.input.image_size
  images = [value for key, value in batch.items() if value.ndim == 4]
  assert images or name == "radial"  # Radial's batches are caption tiers only
  for image in images:
    assert image.shape == (SMALL_BATCH, size, size, 3)
  token_arrays = [value for key, value in batch.items() if key.endswith("tokens")]
  assert token_arrays or name == "hcl"  # HCL's batches are images only
  for tokens in token_arrays:  # (batch, [tiers,] context length)
    assert (tokens.shape[0], tokens.shape[-1]) == (SMALL_BATCH, tokenizer.context_length)
    # [SOT] pieces [EOT] 0...: the first id is SOT on every row.
    assert np.all(tokens[..., 0] == tokenizer.sot_id)


def reduced_width(config) -> None:
  """The config's model with its layout but the smallest widths ("mu" ViTs
  of the same patch size, the one-block-per-stage ResNet, 32-d embeddings)."""
  model = config.model
  if model.image_variant.startswith("RN"):  # a ResNet: one block per stage, widths 8-64
    model.image_variant = "RN-mu"
  else:
    model.image_variant = "mu/" + model.image_variant.split("/")[1]
  model.image_num_heads = None
  if "text_variant" in model:
    model.text_variant = "mu"
  model.embed_dim = 32
  if "head_dim" in model:
    model.head_dim = 64
  teacher = config.objective.get("teacher_model")
  if teacher is not None:
    teacher.update(dict(image_variant=model.image_variant, text_variant="mu", embed_dim=32))


# One ViT variant per config (the ViT sizes differ only in width, reduced
# here), the OpenAI layout and HCL's ResNet.
STEP_CASES = [(name, "vit_l") for name in CONFIGS] + [
  ("radial", "openai_vit_b32"),
  ("hcl", "rn50"),
]


@pytest.mark.slow  # 10-20 s each on 2 cores, mostly compiling the bfloat16 step
@pytest.mark.parametrize("name,variant", STEP_CASES)
def test_one_training_step_of_each_paper_config(name, variant, two_rows, tmp_path):
  config = paper_config(name, variant, two_rows)
  with config.unlocked():
    reduced_width(config)
    # The variant's own micro-batches (UNCHA's 2) each keep a row per device.
    config.input.batch_size = SMALL_BATCH * config.optim.get("accumulation_steps", 1)
    config.input.image_size = 64  # the pipeline test above runs the default size
    config.log_training_steps = 1
    config.evals = type(config.evals)()  # TFDS benchmarks: tested in evaluators/
    if name == "hmid":  # the teacher run is the one other input HMID-Net needs
      config.objective.allow_random_teacher = True
  result = loop.train(config, str(tmp_path), stop_at_step=1)
  assert result.step == 1
  rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  losses = [row["train/loss"] for row in rows if "train/loss" in row]
  assert losses and all(math.isfinite(loss) for loss in losses)
