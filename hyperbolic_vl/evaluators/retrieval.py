"""Evaluator type "retrieval": image-text retrieval on a real benchmark (coco,
flickr30k), a prepared TFDS dataset with caption sequences (tfds:NAME) or a
CSV of `image, caption` rows with an image folder (csv:FILE, images=DIR).

Figures (keys relative to the evaluator; training writes them under eval/):
  retrieval/<label>/{i2t,t2i}_recall@{1,5,10}
<label> is the benchmark name or, for a dataset given by path or TFDS name,
the evaluator's name. Several captions per image: image->text counts a hit
when any of the image's captions ranks in the top k.
"""

from __future__ import annotations

from hyperbolic_vl.evaluators import EvaluatorUnavailable, registry
from hyperbolic_vl.evaluators.datasets import benchmarks, captioned, images
from hyperbolic_vl.evaluators.metrics import recall

RECALL_KS = (1, 5, 10)
SETTINGS = dict(images.BENCHMARK_SETTINGS, images="", captions_key="captions/text")


@registry.register(
  "retrieval",
  settings=SETTINGS,
  description="image-text retrieval (coco, flickr30k, tfds:NAME or csv:FILE with images=DIR)",
)
class RetrievalEvaluator:
  """Image->text and text->image recall@{1,5,10}, several captions per image."""

  def __init__(self, name: str, settings, run_input, tokenizer=None):
    del tokenizer
    dataset = str(settings.dataset)
    if not dataset:
      raise ValueError("set dataset (coco, flickr30k, tfds:NAME or csv:FILE)")
    self.label = images.figure_label(name, dataset)
    self.batch_size = int(settings.batch_size)
    kind, value = images.split_spec(dataset)
    size = images.image_size(settings, run_input)
    num_images = settings.get("num_examples")
    data_dir = str(settings.get("data_dir", "") or "")
    split = str(settings.get("split", "") or "")
    if kind == "csv":
      self.data = captioned.csv_captioned_images(
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
    self.data = captioned.tfds_captioned_images(
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
    figures = recall.two_way_image_caption_figures(
      predictor.similarity(image_emb, text_emb),
      predictor.similarity_text_to_image(image_emb, text_emb),
      self.data.caption_image,
      RECALL_KS,
    )
    return {f"retrieval/{self.label}/{k}": v for k, v in figures.items()}
