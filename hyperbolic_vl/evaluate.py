"""Evaluate a run on the papers' benchmarks; one command, one results file.

  # MERU's whole table: zero-shot on 20 datasets + COCO + Flickr30K
  python -m hyperbolic_vl.evaluate --workdir=RUN --suite=meru \
      --tfds_data_dir=DIR --flickr30k_csv=F.csv --flickr30k_images=IMAGES \
      --output=RUN/eval.json
  # one evaluator on any dataset
  python -m hyperbolic_vl.evaluate --workdir=RUN --eval=zero_shot \
      --dataset=tfds:NAME --split=test --tfds_data_dir=DIR --output=F.json
  python -m hyperbolic_vl.evaluate --workdir=RUN --eval=retrieval \
      --dataset=csv:FILE.csv --images=DIR
  # ATMG's hierarchy accuracies + eigenvalue plot (RUN/eval/atmg_analysis[_CSV]/)
  python -m hyperbolic_vl.evaluate --workdir=RUN --eval=atmg_analysis --dataset=world
  python -m hyperbolic_vl.evaluate --workdir=RUN --eval=atmg_analysis \
      --dataset=csv:hierarcaps_test.csv [--images=DIR]
  # the evaluators the run's own config lists (config.evals)
  python -m hyperbolic_vl.evaluate --workdir=RUN --suite=config

Result keys: zero_shot/<dataset>/top1_mean_per_class (and top1),
retrieval/<dataset>/{i2t,t2i}_recall@{1,5,10}, linear_probe/<dataset>/top1.
A dataset missing from the data directory gets one line saying which, where
and how to prepare it; the other evaluators still run. The model is rebuilt
from the workdir's config.json (`hyperbolic_vl.load`); embedding is sharded
over every local device.
"""

from __future__ import annotations

import json
import os
import time

import ml_collections
from absl import app, flags

from hyperbolic_vl import inference
from hyperbolic_vl.evaluators import benchmarks, registry, settings

SUITES = ("meru", "config")


def define_flags() -> None:
  """The command line's flags; defined only when this module runs as the
  program, so that importing it (for its functions) next to another
  command-line module never defines a flag twice."""
  flags.DEFINE_string("workdir", None, "Run directory (config.json + checkpoints).")
  flags.DEFINE_enum("suite", None, SUITES, "A whole table: meru, or the run's config.evals.")
  flags.DEFINE_enum("eval", None, sorted(registry.BUILDERS), "One evaluator type.")
  flags.DEFINE_string("dataset", None, "Benchmark name, tfds:NAME, folder:DIR or csv:FILE.")
  flags.DEFINE_string("split", "", "Split (default: the benchmark's test split, else 'test').")
  flags.DEFINE_string("images", "", "Image folder of a csv: retrieval dataset.")
  flags.DEFINE_multi_string(
    "prompt", [], "Zero-shot prompt template with {} (repeat the flag; default: the dataset's)."
  )
  flags.DEFINE_string("tfds_data_dir", "", "TFDS data directory (default: TFDS's own).")
  flags.DEFINE_string("flickr30k_csv", "", "Flickr30K Karpathy test CSV (image, caption).")
  flags.DEFINE_string("flickr30k_images", "", "Flickr30K image folder.")
  flags.DEFINE_integer("num_examples", None, "Evaluate only the first N images per dataset.")
  flags.DEFINE_integer("batch_size", 256, "Images / texts per embedding batch.")
  flags.DEFINE_integer("step", None, "Checkpoint step (default: latest).")
  flags.DEFINE_string("output", None, "JSON file for the figures.")


FLAGS = flags.FLAGS


def meru_suite(data_dir: str, flickr_csv: str, flickr_images: str, **common) -> dict:
  """config.evals entries for MERU's Table 2: 20 zero-shot sets + 2 retrieval."""
  evals = {
    name: settings.entry("zero_shot", dataset=name, data_dir=data_dir, **common)
    for name in benchmarks.MERU_ZERO_SHOT_SUITE
  }
  evals["coco"] = settings.entry("retrieval", dataset="coco", data_dir=data_dir, **common)
  flickr = f"csv:{flickr_csv}" if flickr_csv else "flickr30k"
  evals["flickr30k"] = settings.entry(
    "retrieval", dataset=flickr, images=flickr_images, data_dir=data_dir, **common
  )
  return evals


def evaluate(run_config, evals: dict, predictor) -> dict:
  """Builds the named evaluators against the run's config and runs them."""
  config = ml_collections.ConfigDict(run_config.to_dict())
  config.evals = ml_collections.ConfigDict(evals)
  evaluators = registry.build_all(
    config, predictor.tokenizer, workdir=getattr(predictor, "workdir", None)
  )
  figures = {}
  for evaluator in evaluators:
    start = time.perf_counter()
    print(f"{evaluator.name} ...", flush=True)
    figures.update(registry.run_all([evaluator], predictor))
    print(f"{evaluator.name} done in {time.perf_counter() - start:.1f}s", flush=True)
  return figures


def format_table(figures: dict) -> str:
  """Zero-shot mean per-class accuracy per dataset, then retrieval recall."""
  lines = []
  zero_shot = {k.split("/")[1]: v for k, v in figures.items() if k.endswith("/top1_mean_per_class")}
  if zero_shot:
    lines.append("Zero-shot top-1 mean per-class accuracy (%)")
    width = max(len(k) for k in zero_shot)
    lines += [f"  {name:<{width}}  {100 * v:6.1f}" for name, v in zero_shot.items()]
    if len(zero_shot) > 1:
      lines.append(f"  {'average':<{width}}  {100 * sum(zero_shot.values()) / len(zero_shot):6.1f}")
  retrieval = sorted({k.split("/")[1] for k in figures if k.startswith("retrieval/")})
  if retrieval:
    lines.append("Retrieval recall (%)       i2t R@1  R@5  R@10   t2i R@1  R@5  R@10")
    for name in retrieval:
      cells = [
        figures[f"retrieval/{name}/{d}_recall@{k}"] * 100
        for d in ("i2t", "t2i")
        for k in (1, 5, 10)
      ]
      lines.append(f"  {name:<24} " + "  ".join(f"{c:5.1f}" for c in cells))
  others = sorted(
    k
    for k in figures
    if not k.startswith(("zero_shot/", "retrieval/")) and "images_per_sec" not in k
  )
  lines += [f"  {k}  {figures[k]:.4f}" for k in others]
  return "\n".join(lines)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  if not FLAGS.workdir:
    raise app.UsageError("--workdir is required")
  if bool(FLAGS.suite) == bool(FLAGS.eval):
    raise app.UsageError("give exactly one of --suite or --eval")
  if FLAGS.eval and not FLAGS.dataset:
    raise app.UsageError("--eval needs --dataset")
  model = inference.load(FLAGS.workdir, step=FLAGS.step, batch_size=FLAGS.batch_size)
  common = dict(batch_size=FLAGS.batch_size, num_examples=FLAGS.num_examples)
  if FLAGS.suite == "meru":
    evals = meru_suite(FLAGS.tfds_data_dir, FLAGS.flickr30k_csv, FLAGS.flickr30k_images, **common)
  elif FLAGS.suite == "config":
    evals = dict(model.config.get("evals", {}) or {})
  elif FLAGS.eval == "atmg_analysis":
    # --dataset=world (the run's world) or csv:FILE (HierarCaps format;
    # --images=DIR adds the image spectrum).
    csv_path = FLAGS.dataset[len("csv:") :] if FLAGS.dataset.startswith("csv:") else ""
    if not csv_path and FLAGS.dataset != "world":
      raise app.UsageError("--eval=atmg_analysis takes --dataset=world or csv:FILE")
    # Named per dataset so a CSV's plot does not overwrite the world's.
    stem = os.path.splitext(os.path.basename(csv_path))[0]
    evals = {
      f"atmg_analysis_{stem}" if csv_path else "atmg_analysis": settings.entry(
        "atmg_analysis",
        source="hierarcaps" if csv_path else "world",
        path=csv_path,
        image_root=FLAGS.images,
        split=FLAGS.split or "test",
        **common,
      )
    }
  else:
    extra = dict(split=FLAGS.split, data_dir=FLAGS.tfds_data_dir)
    if FLAGS.eval == "retrieval":
      extra["images"] = FLAGS.images
    if FLAGS.eval == "zero_shot" and FLAGS.prompt:
      extra["prompts"] = tuple(FLAGS.prompt)
    name = FLAGS.dataset.split(":", 1)[-1]
    name = os.path.splitext(os.path.basename(name.rstrip("/")))[0] or FLAGS.eval
    evals = {name: settings.entry(FLAGS.eval, dataset=FLAGS.dataset, **common, **extra)}
  figures = evaluate(model.config, evals, model)
  print(format_table(figures), flush=True)
  if FLAGS.output:
    os.makedirs(os.path.dirname(os.path.abspath(FLAGS.output)), exist_ok=True)
    with open(FLAGS.output, "w") as f:
      json.dump(
        {"workdir": os.path.abspath(FLAGS.workdir), "figures": figures}, f, indent=2, sort_keys=True
      )
    print(f"wrote {FLAGS.output}")


if __name__ == "__main__":
  define_flags()
  app.run(main)
