"""Evaluator type "zero_shot": zero-shot classification on a real benchmark
(a name of `benchmarks.ZERO_SHOT`), a prepared TFDS dataset (tfds:NAME) or
an image folder (folder:DIR).

Figures (keys relative to the evaluator; training writes them under eval/):
  zero_shot/<label>/top1, zero_shot/<label>/top1_mean_per_class,
  zero_shot/<label>/images_per_sec
<label> is the benchmark name ("imagenet") or, for a dataset given by path
or TFDS name, the evaluator's name. The data is opened when the evaluator is
built, so a missing dataset is reported at start-up with how to prepare it.
"""

from __future__ import annotations

import time

import numpy as np

from hyperbolic_vl.evaluators import registry
from hyperbolic_vl.evaluators.datasets import images, labelled
from hyperbolic_vl.evaluators.metrics import classification

SETTINGS = dict(images.BENCHMARK_SETTINGS, prompts=(), classnames=())


@registry.register(
  "zero_shot",
  settings=SETTINGS,
  description="zero-shot classification (benchmark name, tfds:NAME or folder:DIR)",
)
class ZeroShotEvaluator:
  """Top-1 and top-1 mean per-class accuracy of prompt-ensembled classifiers."""

  def __init__(self, name: str, settings, run_input, tokenizer=None):
    del tokenizer  # the predictor tokenizes
    self.label = images.figure_label(name, str(settings.dataset))
    self.batch_size = int(settings.batch_size)
    self.images, self.classnames, self.prompts = labelled.open_labelled(
      str(settings.dataset),
      str(settings.get("split", "") or ""),
      image_size=images.image_size(settings, run_input),
      data_dir=str(settings.get("data_dir", "") or ""),
      num_examples=settings.get("num_examples"),
      prompts=tuple(settings.get("prompts", ()) or ()),
      classnames=tuple(settings.get("classnames", ()) or ()),
    )

  def __call__(self, predictor) -> dict[str, float]:
    start = time.perf_counter()
    # Class embeddings once per evaluation, by the objective's ensembling rule.
    classes = predictor.class_embeddings(self.classnames, self.prompts)
    predictions, labels = [], []
    for batch, batch_labels in self.images.batches(self.batch_size):
      scores = predictor.similarity(predictor.encode_images(batch), classes)
      predictions.append(scores.argmax(axis=1))
      labels.append(batch_labels)
    figures = classification.prediction_figures(
      np.concatenate(predictions), np.concatenate(labels), len(self.classnames)
    )
    elapsed = time.perf_counter() - start
    prefix = f"zero_shot/{self.label}/"
    return {
      prefix + "top1": figures["top1"],
      prefix + "top1_mean_per_class": figures["top1_mean_per_class"],
      prefix + "images_per_sec": self.images.size / max(elapsed, 1e-9),
    }
