"""Evaluator type "linear_probe": MERU's linear probe on frozen image
embeddings of a real benchmark (a name of `benchmarks.ZERO_SHOT` or
tfds:NAME with train / validation / test splits); the solver, with C searched
on the validation split, is metrics/linear_probe_c_search.py.

Figures (keys relative to the evaluator; training writes them under eval/):
  linear_probe/<label>/top1, linear_probe/<label>/C (the chosen C)
"""

from __future__ import annotations

import numpy as np

from hyperbolic_vl.evaluators import EvaluatorUnavailable, registry
from hyperbolic_vl.evaluators.datasets import benchmarks, images, labelled
from hyperbolic_vl.evaluators.metrics import linear_probe_c_search

SETTINGS = dict(images.BENCHMARK_SETTINGS, train_split="", val_split="")


@registry.register(
  "linear_probe",
  settings=SETTINGS,
  description="logistic regression on frozen image embeddings (benchmark name or tfds:NAME)",
)
class LinearProbeEvaluator:
  """Logistic regression on frozen image embeddings, scored on the test split."""

  def __init__(self, name: str, settings, run_input, tokenizer=None):
    del tokenizer
    dataset = str(settings.dataset)
    self.label = images.figure_label(name, dataset)
    self.batch_size = int(settings.batch_size)
    kind, value = images.split_spec(dataset)
    spec = benchmarks.zero_shot_dataset(value) if kind == "benchmark" else None
    splits = {
      "train": str(settings.get("train_split", "") or (spec and spec.train_split) or ""),
      "val": str(settings.get("val_split", "") or (spec and spec.val_split) or ""),
      "test": str(settings.get("split", "") or (spec and spec.test_split) or ""),
    }
    if kind not in ("benchmark", "tfds"):
      raise ValueError(f"linear probe dataset {dataset!r}: use a benchmark name or tfds:NAME")
    absent = [k for k, v in splits.items() if not v]
    if absent:
      raise EvaluatorUnavailable(f"{dataset}: no {'/'.join(absent)} split; set *_split")
    self.splits = {
      key: labelled.open_labelled(
        dataset,
        split,
        image_size=images.image_size(settings, run_input),
        data_dir=str(settings.get("data_dir", "") or ""),
        num_examples=settings.get("num_examples"),
      )[0]
      for key, split in splits.items()
    }

  def _features(self, predictor, data):
    features, labels = [], []
    for batch, batch_labels in data.batches(self.batch_size):
      features.append(predictor.encode_images(batch))
      labels.append(batch_labels)
    return np.concatenate(features), np.concatenate(labels)

  def __call__(self, predictor) -> dict[str, float]:
    figures = linear_probe_c_search.linear_probe(
      *(self._features(predictor, self.splits[k]) for k in ("train", "val", "test"))
    )
    return {f"linear_probe/{self.label}/{k}": v for k, v in figures.items()}
