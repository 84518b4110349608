"""The hierarchical_classification evaluator: exact figures on an
ImageNet-layout folder and a TFDS set with a stand-in predictor whose
predictions are designed, and, for tiny trained runs, figures equal to the
metrics core applied to the Predictor's own predictions (in-process through
the command line's functions, and through `python -m hyperbolic_vl.evaluate`)."""

import json
import os
import subprocess
import sys

import cheap_codegen
import ml_collections
import numpy as np
import pytest
import shared_runs
from paths import REPO
from PIL import Image
from tiny_runs import small_config

import hyperbolic_vl
from configs import atmg as atmg_config
from configs import meru as meru_config
from hyperbolic_vl import evaluate as evaluate_cli
from hyperbolic_vl.evaluators import EvaluatorUnavailable, command_entries, registry
from hyperbolic_vl.evaluators import hierarchical_classification as evaluator_lib
from hyperbolic_vl.evaluators.datasets import benchmarks
from hyperbolic_vl.evaluators.datasets import images as eval_images
from hyperbolic_vl.evaluators.metrics import hierarchical_classification as metrics
from hyperbolic_vl.training import loop

GOLDFISH, TABBY, TIGER_CAT = 1, 281, 282
WNIDS = evaluator_lib.imagenet_wnids()
COLOURS = {"red": (230, 20, 20), "green": (20, 230, 20)}
# Red images are predicted "tabby cat", green ones "goldfish".
PREDICTED = {"red": TABBY, "green": GOLDFISH}
# Rows (true class, image colour): tiger cat seen as tabby, tiger cat seen as
# goldfish, goldfish seen as goldfish.
ROWS = [(TIGER_CAT, "red"), (TIGER_CAT, "green"), (GOLDFISH, "green")]
# Per row (test_hierarchical_classification_metrics.py derives these from the
# asset): tabby for tiger cat: tie 2, lca 1, J = P = R = 1; goldfish for tiger
# cat: tie 5 + 7, lca 5, J 6/16, P 6/10, R 6/12; a correct guess: tie 0, lca
# 1, J = P = R = 1.
EXPECTED = {
  "top1": 1 / 3,
  "tie": (2 + 12 + 0) / 3,
  "lca": (1 + 5 + 1) / 3,
  "jaccard": (1 + 6 / 16 + 1) / 3,
  "hier_precision": (1 + 6 / 10 + 1) / 3,
  "hier_recall": (1 + 6 / 12 + 1) / 3,
}


def solid(colour, height=12, width=10):
  return np.broadcast_to(np.asarray(COLOURS[colour], np.uint8), (height, width, 3)).copy()


class ColourPredictor:
  """Image -> one-hot of its colour's designed class; classes -> one-hot."""

  def __init__(self):
    self.classnames = None

  def encode_images(self, images):
    red = np.asarray(images)[:, 0, 0, 0] > 128
    return np.eye(1000)[np.where(red, PREDICTED["red"], PREDICTED["green"])]

  def class_embeddings(self, classnames, templates):
    self.classnames, self.templates = tuple(classnames), tuple(templates)
    return np.eye(1000)

  def similarity(self, image_emb, class_emb):
    return image_emb @ class_emb.T


def write_folder(root, rows):
  """ImageNet layout: ROOT/<wnid>/<image>.png."""
  for index, (label, colour) in enumerate(rows):
    os.makedirs(root / WNIDS[label], exist_ok=True)
    Image.fromarray(solid(colour)).save(root / WNIDS[label] / f"{index}.png")


def run_input(image_size=8):
  """The `config.input` an evaluator is built from."""
  return ml_collections.ConfigDict({"image_size": image_size})


def build(dataset, **settings):
  return registry.get("hierarchical_classification").build(
    "mine", registry.entry("hierarchical_classification", dataset=dataset, **settings), run_input()
  )


def test_folder_of_wnids_gives_the_hand_computed_figures(tmp_path):
  write_folder(tmp_path, ROWS)
  predictor = ColourPredictor()
  figures = build(f"folder:{tmp_path}", batch_size=2)(predictor)
  assert figures == pytest.approx(
    {f"hierarchical_classification/mine/{k}": v for k, v in EXPECTED.items()}, abs=1e-15
  )
  # The classifier covers all 1000 classes with the ImageNet benchmark's prompts.
  imagenet = benchmarks.zero_shot_dataset("imagenet")
  assert predictor.classnames == imagenet.classnames and predictor.templates == imagenet.prompts


def test_tfds_imagenet_labels_give_the_same_figures(tmp_path):
  tfds = pytest.importorskip("tensorflow_datasets")
  features = tfds.features.FeaturesDict(
    {
      "image": tfds.features.Image(shape=(None, None, 3)),
      "label": tfds.features.ClassLabel(names=list(WNIDS)),
    }
  )
  examples = [{"image": solid(colour), "label": label} for label, colour in ROWS]
  tfds.dataset_builders.store_as_tfds_dataset(
    name="mini_imagenet",
    version="1.0.0",
    features=features,
    split_datasets={"validation": list(enumerate(examples))},
    data_dir=str(tmp_path),
    file_format="array_record",
    description="test fixture",
    release_notes={"1.0.0": "test fixture"},
  )
  evaluator = build("tfds:mini_imagenet", data_dir=str(tmp_path))
  figures = evaluator(ColourPredictor())
  assert figures == pytest.approx(
    {f"hierarchical_classification/mine/{k}": v for k, v in EXPECTED.items()}, abs=1e-15
  )


def test_datasets_without_imagenet_classes_are_refused(tmp_path):
  os.makedirs(tmp_path / "cats")
  Image.fromarray(solid("red")).save(tmp_path / "cats" / "0.png")
  with pytest.raises(EvaluatorUnavailable, match="'cats'.*not ImageNet-1k wnids"):
    build(f"folder:{tmp_path}")
  with pytest.raises(ValueError, match="ImageNet-1k's"):
    build("food101")


def train_tiny(get_config, workdir):
  """A tiny run of `get_config`: MERU's is the session's shared run."""
  if get_config is meru_config.get_config:
    return shared_runs.trained_run("meru")
  config = small_config(get_config, ckpt_steps=100)
  config.evals = {}  # only this file's evaluator runs
  loop.train(config, str(workdir), stop_at_step=2)
  return str(workdir)


@pytest.fixture(scope="module")
def imagenet_folder(tmp_path_factory):
  """Nine 20x24 noise images in three wnid folders (tench, goldfish, tiger cat)."""
  root = tmp_path_factory.mktemp("imagenet_val")
  rng = np.random.default_rng(0)
  for label in (0, GOLDFISH, TIGER_CAT):
    os.makedirs(root / WNIDS[label])
    for index in range(3):
      pixels = rng.integers(0, 256, (20, 24, 3), dtype=np.uint8)
      Image.fromarray(pixels).save(root / WNIDS[label] / f"{index}.png")
  return root


def core_figures(model, root, prompts):
  """The metrics core on the Predictor's predictions for the folder."""
  paths = sorted(
    (os.path.join(root, wnid, f), WNIDS.index(wnid))
    for wnid in os.listdir(root)
    for f in os.listdir(os.path.join(root, wnid))
  )
  batch = np.stack([eval_images.load_image_file(p, model.image_size, "crop") for p, _ in paths])
  labels = np.array([label for _, label in paths])
  classes = model.class_embeddings(benchmarks.zero_shot_dataset("imagenet").classnames, prompts)
  predicted = model.similarity(model.encode_images(batch), classes).argmax(axis=1)
  figures = {"top1": float(np.mean(predicted == labels))}
  figures.update(metrics.hierarchical_figures(evaluator_lib.imagenet_tree(), predicted, labels))
  return figures


@shared_runs.ON_ONE_WORKER
@pytest.mark.parametrize(
  "get_config",
  [
    pytest.param(meru_config.get_config, id="meru"),
    # ATMG keeps every prompt's embedding ((C, P, D) classes); slow: a second training.
    pytest.param(atmg_config.get_config, id="atmg", marks=pytest.mark.slow),
  ],
)
def test_tiny_run_figures_are_the_metrics_of_its_predictions(get_config, imagenet_folder, tmp_path):
  workdir = train_tiny(get_config, tmp_path / "run")
  model = hyperbolic_vl.load(workdir)
  prompts = ("a photo of a {}.", "itap of a {}.")
  # The command line's own path: --eval=TYPE --dataset=folder:DIR --prompt=...
  evals = command_entries.one_evaluator(
    "hierarchical_classification",
    dataset=f"folder:{imagenet_folder}",
    prompts=prompts,
    batch_size=9,
  )
  [(name, _)] = evals.items()
  figures = evaluate_cli.evaluate(model.config, evals, model)
  want = core_figures(model, imagenet_folder, prompts)
  assert figures == pytest.approx(
    {f"hierarchical_classification/{name}/{k}": v for k, v in want.items()}, abs=1e-12
  )


@pytest.mark.slow  # an end-to-end run of the command line
def test_command_line_writes_the_metrics_of_the_predictions(imagenet_folder, tmp_path):
  workdir = train_tiny(meru_config.get_config, tmp_path / "run")
  output = tmp_path / "eval.json"
  run = subprocess.run(
    [
      sys.executable,
      "-m",
      "hyperbolic_vl.evaluate",
      f"--workdir={workdir}",
      "--eval=hierarchical_classification",
      f"--set=dataset=folder:{imagenet_folder}",
      "--set=prompts=a photo of a {}.",
      "--name=val",
      f"--output={output}",
    ],
    cwd=REPO,
    env=dict(os.environ, XLA_FLAGS=cheap_codegen.XLA_FLAG, JAX_PLATFORMS="cpu"),
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert run.returncode == 0, run.stderr[-3000:]
  figures = json.loads(output.read_text())["figures"]
  want = core_figures(hyperbolic_vl.load(workdir), imagenet_folder, ("a photo of a {}.",))
  assert figures == pytest.approx(
    {f"hierarchical_classification/val/{k}": v for k, v in want.items()}, abs=1e-12
  )
