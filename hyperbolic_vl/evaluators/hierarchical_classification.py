"""Evaluator type "hierarchical_classification": zero-shot ImageNet-1k
classification scored by HyCoCLIP's hierarchical metrics on WordNet's is-a
tree (metrics/hierarchical_classification.py), for any model.

Every image is classified among all 1000 ImageNet classes (CLIP's class
names, the objective's prompt ensembling; the prompts default to the
ImageNet benchmark's, the seven HyCoCLIP evaluates with), so a subset of the
validation images gives the figures the full classifier gives on it. The
data: the "imagenet" benchmark (TFDS imagenet2012), tfds:NAME of a dataset
whose labels are ImageNet's 1000 wnids, or folder:DIR in ImageNet's layout,
DIR/<wnid>/<image> with any subset of the 1000 wnids as folders.

Figures (keys relative to the evaluator; training writes them under eval/):
  hierarchical_classification/<label>/{top1, tie, lca, jaccard,
  hier_precision, hier_recall}
<label> is "imagenet" for the benchmark, else the evaluator's name.
"""

from __future__ import annotations

import functools
import importlib.resources
import json

import numpy as np

from hyperbolic_vl.evaluators import EvaluatorUnavailable, registry
from hyperbolic_vl.evaluators.datasets import benchmarks, images, labelled
from hyperbolic_vl.evaluators.metrics import hierarchical_classification as metrics

HIERARCHY_ASSET = "imagenet_wordnet_isa.json"
SETTINGS = dict(images.BENCHMARK_SETTINGS, dataset="imagenet", prompts=())


@functools.cache
def imagenet_hierarchy() -> dict:
  """The packaged asset: {"root", "classes" (1000 wnids in class order),
  "parents" (child wnid -> parent wnid)}."""
  asset = importlib.resources.files("hyperbolic_vl.evaluators").joinpath("assets", HIERARCHY_ASSET)
  return json.loads(asset.read_text(encoding="utf-8"))


@functools.cache
def imagenet_tree() -> metrics.ClassTree:
  """WordNet's is-a tree over the 1000 ImageNet-1k classes."""
  hierarchy = imagenet_hierarchy()
  return metrics.ClassTree.from_parents(hierarchy["parents"], hierarchy["classes"])


def imagenet_wnids() -> tuple[str, ...]:
  return tuple(imagenet_hierarchy()["classes"])


def _relabelled(data: labelled.LabelledImages, class_of_label: np.ndarray):
  """The same images with label i read as class_of_label[i]."""
  read = data.read

  def read_as_imagenet(index: int):
    image, label = read(index)
    return image, int(class_of_label[label])

  data.read = read_as_imagenet
  return data


def open_imagenet_images(settings, image_size: int) -> labelled.LabelledImages:
  """The evaluator's images with ImageNet-1k class indices as labels."""
  dataset = str(settings.dataset)
  kind, value = images.split_spec(dataset)
  split = str(settings.get("split", "") or "")
  data_dir = str(settings.get("data_dir", "") or "")
  num_examples = settings.get("num_examples")
  wnids = imagenet_wnids()
  if kind == "folder":
    data = labelled.folder_labelled_images(value, image_size=image_size, num_examples=num_examples)
    folders = data.classnames
    unknown = [f for f in folders if f not in wnids]
    if unknown:
      raise EvaluatorUnavailable(
        f"{dataset}: class folders {unknown[:5]} are not ImageNet-1k wnids "
        "(the layout is DIR/<wnid>/<image>, e.g. DIR/n01440764/)"
      )
    return _relabelled(data, np.array([wnids.index(f) for f in folders]))
  if kind == "benchmark":
    if value != "imagenet":
      raise ValueError(
        f"dataset {dataset!r}: the WordNet hierarchy is ImageNet-1k's; "
        "use imagenet, tfds:NAME or folder:DIR"
      )
    data, _, _ = labelled.open_labelled(
      dataset, split, image_size=image_size, data_dir=data_dir, num_examples=num_examples
    )
    return data
  if kind != "tfds":
    raise ValueError(f"dataset {dataset!r}: use imagenet, tfds:NAME or folder:DIR")
  data, label_names = labelled.tfds_labelled_images(
    value, split or "validation", data_dir=data_dir, image_size=image_size,
    num_examples=num_examples,
  )  # fmt: skip
  if tuple(label_names or ()) != wnids:
    raise EvaluatorUnavailable(
      f"{dataset}: its label names are not the 1000 ImageNet-1k wnids in class order"
    )
  return data


@registry.register(
  "hierarchical_classification",
  settings=SETTINGS,
  description="zero-shot ImageNet-1k with HyCoCLIP's hierarchical metrics on WordNet "
  "(imagenet, tfds:NAME or folder:DIR of wnid folders)",
)
class HierarchicalClassificationEvaluator:
  """Top-1 and HyCoCLIP's tie / lca / jaccard / hierarchical precision and
  recall of a prompt-ensembled 1000-class zero-shot classifier."""

  def __init__(self, name: str, settings, run_input, tokenizer=None):
    del tokenizer  # the predictor tokenizes
    self.label = images.figure_label(name, str(settings.dataset))
    self.batch_size = int(settings.batch_size)
    self.tree = imagenet_tree()
    imagenet = benchmarks.zero_shot_dataset("imagenet")
    self.classnames = imagenet.classnames
    self.prompts = tuple(settings.get("prompts", ()) or ()) or imagenet.prompts
    self.images = open_imagenet_images(settings, images.image_size(settings, run_input))

  def predictions(self, predictor) -> tuple[np.ndarray, np.ndarray]:
    """(predicted, true) ImageNet class indices of every image."""
    classes = predictor.class_embeddings(self.classnames, self.prompts)
    predicted, labels = [], []
    for batch, batch_labels in self.images.batches(self.batch_size):
      scores = predictor.similarity(predictor.encode_images(batch), classes)
      predicted.append(scores.argmax(axis=1))
      labels.append(batch_labels)
    return np.concatenate(predicted), np.concatenate(labels)

  def __call__(self, predictor) -> dict[str, float]:
    predicted, labels = self.predictions(predictor)
    figures = {"top1": float(np.mean(predicted == labels))}
    figures.update(metrics.hierarchical_figures(self.tree, predicted, labels))
    prefix = f"hierarchical_classification/{self.label}/"
    return {prefix + key: value for key, value in figures.items()}
