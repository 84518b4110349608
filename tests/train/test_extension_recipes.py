"""The recipes of docs/architecture.md hold: an objective, a data source and an
evaluator defined in this file alone, registered through the public
registries (nothing in the package edited), train 3 steps and evaluate from
`loop.train_and_evaluate`, and the evaluator runs the same on the saved run
through `hyperbolic_vl.load`."""

import dataclasses
import json
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hyperbolic_vl
from configs import clip as clip_config
from hyperbolic_vl import objectives
from hyperbolic_vl.data import pipeline
from hyperbolic_vl.data import registry as data_registry
from hyperbolic_vl.data.settings import SourceSettings
from hyperbolic_vl.evaluators import registry as evaluator_registry
from hyperbolic_vl.objectives import base
from hyperbolic_vl.objectives import clip as clip_lib
from hyperbolic_vl.objectives import settings as objective_settings
from hyperbolic_vl.training import loop

NUM_SHADES = 4


# -- a data source: flat grey images whose shade is the label ------------------
@dataclasses.dataclass(frozen=True)
class ShadesSettings(SourceSettings):
  source = "shades_recipe"
  num_train: int = 64
  num_eval: int = 16


def _shade_examples(indices: np.ndarray, size: int, tokenizer) -> dict:
  shades = (indices % NUM_SHADES).astype(np.int32)
  return {
    "image": np.stack([np.full((size, size, 3), 40 + 60 * s, np.uint8) for s in shades]),
    "tokens": tokenizer.encode([f"shade {s}" for s in shades]),
    "index": indices.astype(np.int64),
    "label/shade": shades,
  }


@data_registry.register
class ShadesSource(data_registry.DataSource):
  name = "shades_recipe"
  Settings = ShadesSettings
  batch_keys = ("image", "tokens", "index", "label/shade")

  def train_iterator(self, input_settings, settings, tokenizer, *, seed, **layout):
    tokenizer = input_settings.resolve_tokenizer(tokenizer)
    size = input_settings.need_image_size()
    batches = pipeline.sliced_batches(
      settings.num_train,
      seed=seed,
      batch_size=input_settings.batch_size,
      assemble=lambda rows: _shade_examples(
        np.asarray([index for _, index in rows]), size, tokenizer
      ),
      **layout,
    )
    return pipeline.iterate(batches, num_threads=input_settings.num_threads)

  def eval_split(self, input_settings, settings, tokenizer, split, num_examples):
    del split
    count = num_examples or settings.num_eval
    tokenizer = input_settings.resolve_tokenizer(tokenizer)
    return _shade_examples(np.arange(count), input_settings.need_image_size(), tokenizer)


# -- an objective: CLIP's loss plus a margin on the positives ------------------
@dataclasses.dataclass(frozen=True)
class MarginSettings(objective_settings.ObjectiveSettings):
  name: ClassVar[str] = "margin_recipe"
  margin: float = 0.25


@objectives.register
class MarginObjective(base.Objective):
  name = "margin_recipe"
  geometry = "euclidean"
  Settings = MarginSettings

  def loss(self, model, aux, batch, *, rng, axis_name, context=base.EMPTY_CONTEXT):
    del rng, context
    image = clip_lib.l2_normalize(model.encode_image(batch["image"]))
    text = clip_lib.l2_normalize(model.encode_text(batch["tokens"]))
    scale = model.logit_scale()
    image_to_text = scale * (image @ base.gather_columns(text, axis_name).T)
    text_to_image = scale * (text @ base.gather_columns(image, axis_name).T)
    # Subtract the margin from each row's positive logit (additive margin).
    targets = base.local_targets(image.shape[0], axis_name)
    positive = jax.nn.one_hot(targets, image_to_text.shape[1]) * self.settings.margin * scale
    loss = base.symmetric_contrastive(image_to_text - positive, text_to_image - positive, axis_name)
    metrics = {
      "margin": jnp.asarray(self.settings.margin),
      # What the source labels: the objective sees the source's batch keys.
      "mean_shade": batch["label/shade"].astype(jnp.float32).mean(),
      **self.scalar_metrics(model),
    }
    return loss, (metrics, aux)

  def score(self, model, image_emb, text_emb):
    del model
    return clip_lib.cosine_logits(image_emb, text_emb)

  def class_embedding(self, model, prompt_tangents):
    del model
    return clip_lib.l2_normalize(clip_lib.l2_normalize(prompt_tangents).mean(axis=1))


# -- an evaluator: zero-shot accuracy over the shades --------------------------
@evaluator_registry.register(
  "shade_accuracy_recipe", settings=dict(num_examples=8), description="zero-shot shade accuracy"
)
def build_shade_accuracy(name, settings, run_input, tokenizer):
  del name
  data = data_registry.load_eval_split(
    run_input, tokenizer, num_examples=int(settings.num_examples)
  )

  def evaluate(predictor):
    images = predictor.encode_images(data["image"])
    classes = predictor.class_embeddings(
      [str(s) for s in range(NUM_SHADES)], ["shade {}", "a shade {}"]
    )
    predicted = np.argmax(predictor.similarity(images, classes), axis=1)
    return {"shade_recipe/accuracy": float(np.mean(predicted == data["label/shade"]))}

  return evaluate


def recipe_config():
  config = clip_config.get_config()
  with config.unlocked():
    config.objective = objectives.section("margin_recipe", margin=0.5)
    config.input.data = data_registry.section("shades_recipe", num_train=48)
    config.input.batch_size = 8
    config.input.image_size = 16
    config.evals = {"shades": evaluator_registry.entry("shade_accuracy_recipe", num_examples=12)}
    config.total_steps = 3
    config.log_training_steps = 1
    config.ckpt_steps = 3
    config.optim.warmup_steps = 1
  return config


def test_an_objective_source_and_evaluator_from_one_test_file_train_and_evaluate(tmp_path):
  config = recipe_config()
  figures = loop.train_and_evaluate(config, str(tmp_path))
  logged = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  steps = [line for line in logged if "train/loss" in line]
  assert [line["step"] for line in steps] == [1, 2, 3]
  # The objective's setting reached its loss through the config section.
  assert all(line["train/margin"] == pytest.approx(0.5) for line in steps)
  # Its batches are the source's: the shade labels of the first batch.
  first = next(
    data_registry.make_train_iterator(
      config.input, None, seed=config.seed, process_index=0, process_count=1
    )
  )
  assert steps[0]["train/mean_shade"] == pytest.approx(first["label/shade"].mean())
  assert np.isfinite([line["train/loss"] for line in steps]).all()
  # The evaluator ran at the end of training on 12 held-out shades ...
  accuracy = figures["shade_recipe/accuracy"]
  assert logged[-1]["eval/shade_recipe/accuracy"] == accuracy
  assert accuracy * 12 == pytest.approx(round(accuracy * 12))
  # ... and gives the same figure on the saved run through the public loader.
  loaded = hyperbolic_vl.load(str(tmp_path))
  (again,) = evaluator_registry.build_all(loaded.config, loaded.tokenizer)
  assert again.evaluate(loaded) == {"shade_recipe/accuracy": accuracy}
