"""Zero-shot classification, image-text retrieval and linear probes on real
benchmarks (TFDS, image folders, CSV), each an evaluator of `config.evals`.

Every evaluator opens its data when it is built, so a dataset that is
missing is reported at start-up (EvaluatorUnavailable, with how to prepare
it), and is called with a `predictor.Predictor` once per evaluation.
Figures (keys relative to the evaluator; training writes them under eval/):
  zero_shot/<label>/top1, zero_shot/<label>/top1_mean_per_class
  retrieval/<label>/{i2t,t2i}_recall@{1,5,10}
  linear_probe/<label>/top1 (and the chosen C)
<label> is the benchmark name ("imagenet", "coco") or the evaluator's name
for datasets given by path or TFDS name.
"""

from __future__ import annotations

import os
import time

import numpy as np

from hyperbolic_vl.evaluators import EvaluatorUnavailable, benchmarks, datasets, linear_probe
from hyperbolic_vl.evaluators import retrieval as retrieval_lib
from hyperbolic_vl.evaluators import zero_shot as zero_shot_lib

RECALL_KS = (1, 5, 10)


def _label(name: str, dataset: str) -> str:
  kind, value = datasets.split_spec(dataset)
  return value if kind == "benchmark" else name


def _image_size(settings, run_config) -> int:
  return int(settings.get("image_size") or run_config.input.image_size)


def _labelled_split(settings, run_config, split: str, num_examples):
  """(LabelledImages, class names, prompts) for a zero-shot / probe dataset."""
  dataset = str(settings.dataset)
  if not dataset:
    raise ValueError("set dataset (a benchmark name, tfds:NAME or folder:DIR)")
  kind, value = datasets.split_spec(dataset)
  size = _image_size(settings, run_config)
  data_dir = str(settings.get("data_dir", "") or "")
  prompts = tuple(settings.get("prompts", ()) or ())
  if kind == "folder":
    images = datasets.folder_labelled_images(value, image_size=size, num_examples=num_examples)
    return images, images.classnames, prompts or benchmarks.DEFAULT_PROMPTS
  if kind == "benchmark":
    spec = benchmarks.zero_shot_dataset(value)
    if spec.tfds_name is None:
      # No TFDS builder: the release's own folders, DATA_DIR/<split>/<class>/,
      # whose sorted class folders follow the benchmark's class order.
      root = os.path.join(data_dir, split or spec.test_split) if data_dir else ""
      if not root or not os.path.isdir(root):
        raise EvaluatorUnavailable(
          f"{spec.title} has no TFDS builder: unpack its release so that "
          f"DATA_DIR/{split or spec.test_split}/<class>/ holds the images and set data_dir "
          f"(looked for {root or 'an unset data_dir'})"
        )
      images = datasets.folder_labelled_images(root, image_size=size, num_examples=num_examples)
      datasets.check_classnames(spec.classnames, len(images.classnames), spec.title)
      images.classnames = spec.classnames
      return images, spec.classnames, prompts or spec.prompts
    transform = benchmarks.LABEL_TRANSFORMS[spec.label_transform] if spec.label_transform else None
    images, label_names = datasets.tfds_labelled_images(
      spec.tfds_name,
      split or spec.test_split,
      data_dir=data_dir,
      image_size=size,
      image_key=spec.image_key,
      label_key=spec.label_key,
      label_transform=transform,
      num_examples=num_examples,
    )
    if spec.label_transform is None:
      datasets.check_classnames(
        spec.classnames, len(label_names) if label_names else None, spec.title
      )
    images.classnames = spec.classnames
    return images, spec.classnames, prompts or spec.prompts
  images, label_names = datasets.tfds_labelled_images(
    value, split or "test", data_dir=data_dir, image_size=size, num_examples=num_examples
  )
  if not label_names:
    raise EvaluatorUnavailable(f"tfds:{value} has no ClassLabel 'label' feature to name classes")
  classnames = tuple(settings.get("classnames", ()) or ()) or tuple(
    datasets.clean_classname(n) for n in label_names
  )
  datasets.check_classnames(classnames, len(label_names), f"tfds:{value}")
  return images, classnames, prompts or benchmarks.DEFAULT_PROMPTS


class ZeroShotEvaluator:
  """Top-1 and top-1 mean per-class accuracy of prompt-ensembled classifiers."""

  def __init__(self, name: str, settings, run_config, tokenizer=None):
    del tokenizer  # the predictor tokenizes
    self.label = _label(name, str(settings.dataset))
    self.batch_size = int(settings.batch_size)
    self.images, self.classnames, self.prompts = _labelled_split(
      settings, run_config, str(settings.get("split", "") or ""), settings.get("num_examples")
    )

  def __call__(self, predictor) -> dict[str, float]:
    start = time.perf_counter()
    # Class embeddings once per evaluation, by the objective's ensembling rule.
    classes = predictor.class_embeddings(self.classnames, self.prompts)
    predictions, labels = [], []
    for images, batch_labels in self.images.batches(self.batch_size):
      scores = predictor.similarity(predictor.encode_images(images), classes)
      predictions.append(scores.argmax(axis=1))
      labels.append(batch_labels)
    figures = zero_shot_lib.prediction_figures(
      np.concatenate(predictions), np.concatenate(labels), len(self.classnames)
    )
    elapsed = time.perf_counter() - start
    prefix = f"zero_shot/{self.label}/"
    return {
      prefix + "top1": figures["top1"],
      prefix + "top1_mean_per_class": figures["top1_mean_per_class"],
      prefix + "images_per_sec": self.images.size / max(elapsed, 1e-9),
    }


class RetrievalEvaluator:
  """Image->text and text->image recall@{1,5,10}, several captions per image."""

  def __init__(self, name: str, settings, run_config, tokenizer=None):
    del tokenizer
    dataset = str(settings.dataset)
    if not dataset:
      raise ValueError("set dataset (coco, flickr30k, tfds:NAME or csv:FILE)")
    self.label = _label(name, dataset)
    self.batch_size = int(settings.batch_size)
    kind, value = datasets.split_spec(dataset)
    size = _image_size(settings, run_config)
    num_images = settings.get("num_examples")
    data_dir = str(settings.get("data_dir", "") or "")
    split = str(settings.get("split", "") or "")
    if kind == "csv":
      self.data = datasets.csv_captioned_images(
        value, str(settings.get("images", "") or ""), image_size=size, num_images=num_images
      )
      return
    if kind == "benchmark":
      spec = benchmarks.retrieval_dataset(value)
      if spec.tfds_name is None:
        raise EvaluatorUnavailable(
          f"{spec.title} is read from a CSV of `image, caption` rows plus an image folder: "
          f"set dataset='csv:FILE' and images=DIR"
        )
      value, split = spec.tfds_name, split or spec.split
      captions_per_image = spec.captions_per_image
    elif kind == "tfds":
      captions_per_image = None
    else:
      raise ValueError(f"retrieval dataset {dataset!r}: use a benchmark name, tfds: or csv:")
    self.data = datasets.tfds_captioned_images(
      value,
      split or "test",
      data_dir=data_dir,
      image_size=size,
      captions_key=str(settings.get("captions_key", "captions/text")),
      num_images=num_images,
      captions_per_image=captions_per_image,
    )

  def __call__(self, predictor) -> dict[str, float]:
    image_emb = predictor.encode_images(self.data.images)
    text_emb = predictor.encode_texts(self.data.captions)
    figures = retrieval_figures(
      predictor.similarity(image_emb, text_emb),
      predictor.similarity_text_to_image(image_emb, text_emb),
      self.data.caption_image,
    )
    return {f"retrieval/{self.label}/{k}": v for k, v in figures.items()}


def retrieval_figures(i2t_scores, t2i_scores, caption_image) -> dict[str, float]:
  """recall@k both ways; the two directions may rank by different scores
  (ATMG's released evaluation), each (N_images, N_captions)."""
  i2t = retrieval_lib.image_caption_figures(i2t_scores, caption_image, RECALL_KS)
  t2i = retrieval_lib.image_caption_figures(t2i_scores, caption_image, RECALL_KS)
  return {k: (i2t if k.startswith("i2t") else t2i)[k] for k in sorted(i2t)}


class LinearProbeEvaluator:
  """Logistic regression on frozen image embeddings (evaluators/linear_probe.py)."""

  def __init__(self, name: str, settings, run_config, tokenizer=None):
    del tokenizer
    dataset = str(settings.dataset)
    self.label = _label(name, dataset)
    self.batch_size = int(settings.batch_size)
    kind, value = datasets.split_spec(dataset)
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
    num = settings.get("num_examples")
    self.splits = {
      key: _labelled_split(settings, run_config, split, num)[0] for key, split in splits.items()
    }

  def _features(self, predictor, images):
    features, labels = [], []
    for batch, batch_labels in images.batches(self.batch_size):
      features.append(predictor.encode_images(batch))
      labels.append(batch_labels)
    return np.concatenate(features), np.concatenate(labels)

  def __call__(self, predictor) -> dict[str, float]:
    figures = linear_probe.linear_probe(
      *(self._features(predictor, self.splits[k]) for k in ("train", "val", "test"))
    )
    return {f"linear_probe/{self.label}/{k}": v for k, v in figures.items()}
