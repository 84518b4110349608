"""Evaluators chosen by config, on data in the real on-disk formats: TFDS
datasets written as ArrayRecord by TFDS itself, an image folder, and a CSV
of `image, caption` rows with real JPEG files.

Exactness is checked with stand-in predictors whose embeddings are designed
by hand (so the answer is known); a trained tiny MERU then checks that the
TFDS path gives the world evaluator's figures and that the command line
writes what a computation from the embeddings gives."""

import csv
import json
import os
import subprocess
import sys

import cheap_codegen
import ml_collections
import numpy as np
import pytest
import shared_runs
from paths import HIERARCAPS_MINI, REPO
from PIL import Image
from sklearn.linear_model import LogisticRegression

import hyperbolic_vl
from configs import meru as meru_config
from hyperbolic_vl import evaluate as evaluate_cli
from hyperbolic_vl.data import synthetic_world as world
from hyperbolic_vl.evaluators import EvaluatorUnavailable, registry
from hyperbolic_vl.evaluators.datasets import benchmarks
from hyperbolic_vl.evaluators.datasets import images as eval_images
from hyperbolic_vl.evaluators.metrics import linear_probe_c_search, recall
from hyperbolic_vl.training import loop

tfds = pytest.importorskip("tensorflow_datasets")

FIXTURE_IMAGES = str(HIERARCAPS_MINI / "images")
COLOURS = {"red": (230, 20, 20), "green": (20, 230, 20), "blue": (20, 20, 230)}


def store_labelled(data_dir, name, images, labels, classnames, split="test"):
  """A TFDS dataset (ArrayRecord) with an image and a ClassLabel feature."""
  features = tfds.features.FeaturesDict(
    {
      "image": tfds.features.Image(shape=(None, None, 3)),
      "label": tfds.features.ClassLabel(names=list(classnames)),
    }
  )
  examples = [{"image": image, "label": int(label)} for image, label in zip(images, labels)]
  tfds.dataset_builders.store_as_tfds_dataset(
    name=name,
    version="1.0.0",
    features=features,
    split_datasets={split: list(enumerate(examples))},
    data_dir=str(data_dir),
    file_format="array_record",
    description="test fixture",
    release_notes={"1.0.0": "test fixture"},
  )


def solid(colour, height=12, width=10):
  return np.broadcast_to(np.asarray(COLOURS[colour], np.uint8), (height, width, 3)).copy()


class ColourPredictor:
  """Image -> its unit mean colour; class "red" -> e_red. Scores: dot."""

  geometry, curv = "euclidean", None

  def __init__(self):
    self.class_calls = 0

  def encode_images(self, images):
    mean = np.asarray(images, np.float64).reshape(len(images), -1, 3).mean(1)
    return mean / np.linalg.norm(mean, axis=1, keepdims=True)

  def class_embeddings(self, classnames, templates):
    self.class_calls += 1
    assert all("{}" in t for t in templates)
    return np.eye(3)[[list(COLOURS).index(name) for name in classnames]]

  def similarity(self, image_emb, class_emb):
    return image_emb @ class_emb.T


# Hand-made 3-class set: 7 images, two deliberately mislabelled.
IMAGE_COLOURS = ["red", "red", "red", "red", "green", "green", "blue"]
LABELS = ["red", "red", "red", "green", "green", "green", "red"]
# Predictions are the image colours: correct = [1,1,1,0,1,1,0] -> top1 5/7;
# per class: red 3/4 (rows 0,1,2,6), green 2/3 (rows 3,4,5), blue has no
# test rows and is left out -> mean per class (3/4 + 2/3) / 2.
EXPECTED_TOP1 = 5 / 7
EXPECTED_MEAN_PER_CLASS = (3 / 4 + 2 / 3) / 2


def run_input(image_size=8):
  """The `config.input` an evaluator is built from."""
  return ml_collections.ConfigDict({"image_size": image_size})


def run_config(image_size=8):
  return ml_collections.ConfigDict({"input": run_input(image_size)})


def test_zero_shot_on_a_tfds_dataset_is_exact(tmp_path):
  store_labelled(
    tmp_path,
    "colours3",
    [solid(c) for c in IMAGE_COLOURS],
    [list(COLOURS).index(c) for c in LABELS],
    list(COLOURS),
  )
  evaluator = registry.get("zero_shot").build(
    "colours",
    registry.entry("zero_shot", dataset="tfds:colours3", data_dir=str(tmp_path), batch_size=3),
    run_input(),
  )
  assert evaluator.classnames == ("red", "green", "blue")  # from the ClassLabel feature
  predictor = ColourPredictor()
  figures = evaluator(predictor)
  assert figures["zero_shot/colours/top1"] == pytest.approx(EXPECTED_TOP1, abs=1e-12)
  assert figures["zero_shot/colours/top1_mean_per_class"] == pytest.approx(
    EXPECTED_MEAN_PER_CLASS, abs=1e-12
  )
  assert predictor.class_calls == 1  # class embeddings once per evaluation, not per batch


def test_zero_shot_on_an_image_folder_is_exact(tmp_path):
  for index, (colour, label) in enumerate(zip(IMAGE_COLOURS, LABELS)):
    os.makedirs(tmp_path / label, exist_ok=True)
    Image.fromarray(solid(colour)).save(tmp_path / label / f"{index}.png")
  os.makedirs(tmp_path / "blue")  # a class with no images
  evaluator = registry.get("zero_shot").build(
    "folder", registry.entry("zero_shot", dataset=f"folder:{tmp_path}"), run_input()
  )
  # Folder classes are sorted by name: blue, green, red.
  assert evaluator.classnames == ("blue", "green", "red")
  figures = evaluator(ColourPredictor())
  assert figures["zero_shot/folder/top1"] == pytest.approx(EXPECTED_TOP1, abs=1e-12)
  assert figures["zero_shot/folder/top1_mean_per_class"] == pytest.approx(
    EXPECTED_MEAN_PER_CLASS, abs=1e-12
  )


def test_a_missing_tfds_dataset_disables_only_that_evaluator(tmp_path, capsys):
  store_labelled(tmp_path, "colours3", [solid("red")], [0], list(COLOURS))
  config = run_config()
  config.evals = {
    "absent": registry.entry("zero_shot", dataset="tfds:cifar10", data_dir=str(tmp_path)),
    "present": registry.entry("zero_shot", dataset="tfds:colours3", data_dir=str(tmp_path)),
  }
  built = registry.build_all(config, tokenizer=None)
  assert [e.name for e in built] == ["present"]
  printed = capsys.readouterr().out
  assert "Evaluator 'absent' (zero_shot) disabled" in printed
  assert "cifar10" in printed and str(tmp_path) in printed and "tfds build" in printed


def test_config_errors_name_the_valid_choices():
  config = run_config()
  config.evals = {"x": {"type": "zero_shoot"}}
  with pytest.raises(ValueError, match="valid: .*'zero_shot'"):
    registry.build_all(config, tokenizer=None)
  config.evals = {"x": {"type": "zero_shot", "datset": "tfds:a"}}
  with pytest.raises(ValueError, match="unknown setting.*'datset'.*valid: .*'dataset'"):
    registry.build_all(config, tokenizer=None)
  with pytest.raises(ValueError, match="no evaluator 'y'"):
    registry.build_all(config, tokenizer=None, only=("y",))


# Retrieval: 3 real JPEGs, 5 captions (two for image 0, one for image 1, two
# for image 2). Scores S[image, caption] are designed:
SCORES = np.array(
  [
    [0.9, 0.1, 0.8, 0.0, 0.3],
    [0.2, 0.7, 0.1, 0.5, 0.0],
    [0.0, 0.0, 0.6, 0.4, 0.2],
  ]
)
CAPTION_IMAGE = [0, 0, 1, 2, 2]
# i2t: image 0 ranks caption 0 first (hit at 1); image 1 ranks its caption 2
# fourth; image 2 ranks its caption 3 second -> R@1 1/3, R@5 = R@10 = 1.
# t2i: only caption 0 ranks its image first -> R@1 1/5; 3 images -> R@5 1.
EXPECTED_RETRIEVAL = {
  "i2t_recall@1": 1 / 3,
  "i2t_recall@5": 1.0,
  "i2t_recall@10": 1.0,
  "t2i_recall@1": 1 / 5,
  "t2i_recall@5": 1.0,
  "t2i_recall@10": 1.0,
}


def write_retrieval_csv(path, image_names, captions):
  with open(path, "w", newline="") as f:
    writer = csv.DictWriter(f, fieldnames=["image", "caption"])
    writer.writeheader()
    for image, caption in zip(image_names, captions):
      writer.writerow({"image": image, "caption": caption})


def test_retrieval_from_a_csv_of_real_images_is_exact(tmp_path):
  names = sorted(os.listdir(FIXTURE_IMAGES))[:3]
  captions = [f"caption {j}" for j in range(5)]
  write_retrieval_csv(tmp_path / "pairs.csv", [names[i] for i in CAPTION_IMAGE], captions)
  evaluator = registry.get("retrieval").build(
    "mini",
    registry.entry("retrieval", dataset=f"csv:{tmp_path / 'pairs.csv'}", images=FIXTURE_IMAGES),
    run_input(image_size=16),
  )
  # Whole images squeezed to the model's square resolution (MERU's protocol).
  expected_images = [
    eval_images.load_image_file(os.path.join(FIXTURE_IMAGES, n), 16, "squeeze") for n in names
  ]

  class DesignedPredictor:
    def encode_images(self, images):
      index = [
        next(i for i, e in enumerate(expected_images) if np.array_equal(e, x)) for x in images
      ]
      return np.eye(3)[index]

    def encode_texts(self, texts):
      return SCORES[:, [captions.index(t) for t in texts]].T

    def similarity(self, image_emb, text_emb):
      return image_emb @ text_emb.T

    similarity_text_to_image = similarity

  figures = evaluator(DesignedPredictor())
  assert figures == {
    f"retrieval/mini/{k}": pytest.approx(v, abs=1e-12) for k, v in EXPECTED_RETRIEVAL.items()
  }


@pytest.fixture(scope="module")
def tiny_meru(tiny_meru_run):
  return tiny_meru_run


@pytest.mark.slow  # an end-to-end run of the command line
def test_tfds_zero_shot_from_the_command_line_equals_the_world_evaluator(tiny_meru, tmp_path):
  model = hyperbolic_vl.load(tiny_meru, batch_size=64)
  world_settings = registry.entry("world", num_examples=48, zero_shot_kinds=("shape",))
  world_evaluator = registry.get("world").build(
    "world", world_settings, model.config.input, model.tokenizer
  )
  expected = world_evaluator(model)["eval/zero_shot_accuracy/shape"]
  # The same held-out scenes and shape labels, written as a TFDS dataset.
  images = np.round(world_evaluator.data["image"] * 255).astype(np.uint8)
  classnames = [world.with_article(s) for s in world.SHAPES]
  store_labelled(tmp_path, "world_shapes", images, world_evaluator.data["label/shape"], classnames)
  output = tmp_path / "eval.json"
  env = dict(os.environ, XLA_FLAGS=cheap_codegen.XLA_FLAG, JAX_PLATFORMS="cpu")
  run = subprocess.run(
    [
      sys.executable,
      "-m",
      "hyperbolic_vl.evaluate",
      f"--workdir={tiny_meru}",
      "--eval=zero_shot",
      "--dataset=tfds:world_shapes",
      "--split=test",
      f"--tfds_data_dir={tmp_path}",
      f"--output={output}",
      # The world's shape prompts are these templates around "a circle", ...
      "--prompt={}",
      "--prompt=a picture of {}",
      "--prompt=a photo of {}",
    ],
    cwd=REPO,
    env=env,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert run.returncode == 0, run.stderr[-3000:]
  figures = json.loads(output.read_text())["figures"]
  assert "Zero-shot top-1 mean per-class accuracy" in run.stdout
  assert figures["zero_shot/world_shapes/top1"] == pytest.approx(expected, abs=1e-12)


@shared_runs.ON_ONE_WORKER
def test_csv_retrieval_equals_a_computation_from_the_embeddings(tiny_meru, tmp_path):
  names = sorted(os.listdir(FIXTURE_IMAGES))
  caption_image = [i for i in range(len(names)) for _ in range(2)]
  captions = [f"a {w} {s}" for w in ("red", "blue") for s in world.SHAPES][: len(caption_image)]
  write_retrieval_csv(tmp_path / "pairs.csv", [names[i] for i in caption_image], captions)
  model = hyperbolic_vl.load(tiny_meru)
  evals = {
    "mini": registry.entry(
      "retrieval", dataset=f"csv:{tmp_path / 'pairs.csv'}", images=FIXTURE_IMAGES
    )
  }
  figures = evaluate_cli.evaluate(model.config, evals, model)
  images = np.stack(
    [
      eval_images.load_image_file(os.path.join(FIXTURE_IMAGES, n), model.image_size, "squeeze")
      for n in names
    ]
  )
  scores = model.similarity(model.encode_images(images), model.encode_texts(captions))
  by_hand = recall.image_caption_figures(scores, np.asarray(caption_image))
  assert figures == {f"retrieval/mini/{k}": pytest.approx(v, abs=1e-12) for k, v in by_hand.items()}


@pytest.mark.slow  # an end-to-end run of the command line
def test_a_paper_config_runs_the_evaluators_it_names(tmp_path, capsys):
  """A paper-scale config (real image-text CSV, tiny model override) trains
  past its first periodic evaluation; its figures are those of the
  evaluators config.evals names, and a benchmark absent from its data
  directory is reported at start-up without stopping the run."""
  names = sorted(os.listdir(FIXTURE_IMAGES))
  write_retrieval_csv(tmp_path / "train.csv", names * 2, [f"photo {i}" for i in range(12)])
  store_labelled(
    tmp_path / "tfds", "colours3", [solid(c) for c in IMAGE_COLOURS], [0] * 7, list(COLOURS)
  )
  config = meru_config.get_config("vit_s")
  with config.unlocked():
    config.model.update(
      dict(
        image_variant="mu/8", text_variant="mu", embed_dim=32, dtype="float32", image_num_heads=None
      )
    )
    config.input.update(dict(batch_size=8, image_size=16))
    config.input.data.path = str(tmp_path / "train.csv")
    config.input.data.image_root = FIXTURE_IMAGES
    config.input.tokenizer.name = "clip_bpe"
    config.input.tokenizer.context_length = 16
    config.total_steps, config.ckpt_steps, config.log_training_steps = 4, 4, 2
    config.optim.warmup_steps = 1
    config.evals.imagenet.dataset = "tfds:colours3"
    config.evals.imagenet.data_dir = str(tmp_path / "tfds")
    config.evals.imagenet.every_steps = 2
    config.evals.coco.data_dir = str(tmp_path / "tfds")  # coco_captions is not there
  result = loop.train(config, str(tmp_path / "run"))
  assert result.step == 4
  printed = capsys.readouterr().out
  assert "Evaluator 'coco' (retrieval) disabled" in printed and "coco_captions" in printed
  with open(tmp_path / "run" / "metrics.jsonl") as f:
    rows = [json.loads(line) for line in f]
  eval_rows = [r for r in rows if any(k.startswith("eval/") for k in r)]
  assert [r["step"] for r in eval_rows] == [2]  # step 4 is the end: train_and_evaluate's
  assert {k for k in eval_rows[0] if k.startswith("eval/")} == {
    "eval/zero_shot/imagenet/top1",
    "eval/zero_shot/imagenet/top1_mean_per_class",
    "eval/zero_shot/imagenet/images_per_sec",
  }


def test_linear_probe_on_tfds_splits_equals_the_reference_solver(tmp_path):
  """Three TFDS splits of noisy colour patches; the evaluator's probe on the
  stand-in embeddings equals scikit-learn fitted by hand the same way."""
  rng = np.random.default_rng(0)
  splits = {}
  for split, count in (("train", 30), ("validation", 12), ("test", 15)):
    labels = rng.integers(0, 3, count)
    base = np.asarray(list(COLOURS.values()), np.float64)[labels]
    images = np.clip(base[:, None, None, :] + rng.normal(0, 60, (count, 8, 8, 3)), 0, 255)
    splits[split] = (images.astype(np.uint8), labels)
  features = tfds.features.FeaturesDict(
    {
      "image": tfds.features.Image(shape=(None, None, 3)),
      "label": tfds.features.ClassLabel(names=list(COLOURS)),
    }
  )
  tfds.dataset_builders.store_as_tfds_dataset(
    name="noisy_colours",
    version="1.0.0",
    features=features,
    split_datasets={
      k: list(enumerate({"image": x, "label": int(y)} for x, y in zip(*v)))
      for k, v in splits.items()
    },
    data_dir=str(tmp_path),
    file_format="array_record",
    release_notes={"1.0.0": "test fixture"},
  )
  evaluator = registry.get("linear_probe").build(
    "probe",
    registry.entry(
      "linear_probe",
      dataset="tfds:noisy_colours",
      data_dir=str(tmp_path),
      train_split="train",
      val_split="validation",
      split="test",
    ),
    run_input(),
  )
  predictor = ColourPredictor()
  figures = evaluator(predictor)
  embed = {k: predictor.encode_images(v[0]) for k, v in splits.items()}
  best_c = figures["linear_probe/probe/C"]
  assert best_c in linear_probe_c_search.DEFAULT_C_GRID
  reference = LogisticRegression(C=best_c, max_iter=1000).fit(
    np.concatenate([embed["train"], embed["validation"]]),
    np.concatenate([splits["train"][1], splits["validation"][1]]),
  )
  expected = np.mean(reference.predict(embed["test"]) == splits["test"][1])
  assert figures["linear_probe/probe/top1"] == pytest.approx(expected, abs=1e-12)
  assert expected > 0.6  # the colours are separable through the noise


def test_a_benchmark_without_a_tfds_builder_reads_its_release_folders(tmp_path):
  """Rendered SST2 ships as <split>/<class>/ folders: the benchmark's own
  class names and prompts apply (sorted folders follow its class order)."""
  spec = benchmarks.zero_shot_dataset("sst2")
  colours = ["red", "green"]  # images of class 0 are red, class 1 green
  for label, folder in enumerate(sorted(spec.classnames)):
    os.makedirs(tmp_path / spec.test_split / folder)
    for i in range(2):
      Image.fromarray(solid(colours[label])).save(tmp_path / spec.test_split / folder / f"{i}.png")
  evaluator = registry.get("zero_shot").build(
    "sst2", registry.entry("zero_shot", dataset="sst2", data_dir=str(tmp_path)), run_input()
  )
  assert evaluator.classnames == spec.classnames and evaluator.prompts == spec.prompts

  class ByClassIndex(ColourPredictor):
    def class_embeddings(self, classnames, templates):
      return np.eye(3)[[spec.classnames.index(n) for n in classnames]]  # red, green

  figures = evaluator(ByClassIndex())
  assert figures["zero_shot/sst2/top1"] == 1.0
  with pytest.raises(EvaluatorUnavailable, match="no TFDS builder"):
    registry.get("zero_shot").build(
      "sst2", registry.entry("zero_shot", dataset="sst2"), run_input()
    )


def test_retrieval_from_a_tfds_dataset_with_caption_sequences(tmp_path):
  features = tfds.features.FeaturesDict(
    {
      "image": tfds.features.Image(shape=(None, None, 3)),
      "captions": tfds.features.Sequence({"text": tfds.features.Text()}),
    }
  )
  examples = [
    {"image": solid(c), "captions": {"text": [f"{c} one", f"{c} two"]}} for c in ("red", "green")
  ]
  tfds.dataset_builders.store_as_tfds_dataset(
    name="captioned",
    version="1.0.0",
    features=features,
    split_datasets={"test": list(enumerate(examples))},
    data_dir=str(tmp_path),
    file_format="array_record",
    release_notes={"1.0.0": "test fixture"},
  )
  evaluator = registry.get("retrieval").build(
    "captioned",
    registry.entry("retrieval", dataset="tfds:captioned", data_dir=str(tmp_path)),
    run_input(),
  )
  data = evaluator.data
  assert sorted(data.captions) == ["green one", "green two", "red one", "red two"]
  # TFDS stores examples in its own order: each caption must point at the
  # image of its colour, whichever index that image has.
  image_colour = ["red" if image[0, 0, 0] > 128 else "green" for image in data.images]
  for caption, image in zip(data.captions, data.caption_image):
    assert caption.split()[0] == image_colour[image]
