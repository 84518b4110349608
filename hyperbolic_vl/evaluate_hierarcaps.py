"""HierarCaps metrics (P, R, tau_d) for a checkpoint of this codebase: the
"hierarchy" evaluator (evaluators/hierarchy.py) with this command's flags;
`python -m hyperbolic_vl.evaluate --eval=hierarchy` runs the same evaluator
with any of its settings.

  python -m hyperbolic_vl.evaluate_hierarcaps --workdir=RUN \
      --csv=hierarcaps_test.csv --images=IMAGE_FOLDER --output=metrics.json
  python -m hyperbolic_vl.evaluate_hierarcaps --workdir=RUN --world --output=m.json

With --csv: every valid row of the test CSV (malformed ones are reported by
row number and skipped); the candidate texts are all tiers of the evaluated
rows, and rows sharing an image are one query with several reference
hierarchies. P and R follow the released evaluation (50 radius thresholds
over the candidates' root distances; see evaluators/metrics/hierarchy.py). With --world: the synthetic world's held-out split
(held-out hierarchies), plus standard retrieval recall@K from the world evaluator.
Root: Lorentz runs use the hyperboloid origin; Euclidean runs their own
root, the one the training-time evaluator uses (Radial Embeddings' stored or
learned root from the checkpoint; otherwise the unit-normalised empty-string
embedding of the run's text tower); --root=empty forces the empty string,
--root=zero the origin. The run's model is rebuilt from its own config.json.
"""

from __future__ import annotations

import json
import os
import sys

import ml_collections
from absl import app, flags

from hyperbolic_vl import errors, inference
from hyperbolic_vl.evaluators import registry


def define_flags() -> None:
  """The command line's flags; defined only when this module runs as the
  program, so that importing it (for its functions) next to another
  command-line module never defines a flag twice."""
  flags.DEFINE_string("workdir", None, "Run directory (config.json + checkpoints).")
  flags.DEFINE_bool(
    "verbose", False, "Show the traceback of a configuration, data or workdir error."
  )
  flags.DEFINE_string("csv", None, "HierarCaps test CSV (id, captions, image_url).")
  flags.DEFINE_string("images", None, "Folder holding the images named by image_url.")
  flags.DEFINE_bool("world", False, "Evaluate on the synthetic world's test split instead.")
  flags.DEFINE_integer("num_examples", None, "Use only the first N items.")
  flags.DEFINE_integer("step", None, "Checkpoint step (default: latest).")
  flags.DEFINE_enum("root", "auto", ["auto", "empty", "zero"], "Euclidean root.")
  flags.DEFINE_enum(
    "method",
    "thresholds",
    ["thresholds", "interpolation"],
    "Hierarchical retrieval: the released thresholds (default) or interpolation to the nearest text.",
  )
  flags.DEFINE_bool("omit_first", False, "Drop the degenerate first prediction (paper's wording).")
  flags.DEFINE_integer("image_size", None, "Image size (default: the run's input.image_size).")
  flags.DEFINE_string("output", None, "JSON file for the metrics.")


FLAGS = flags.FLAGS


# --root values -> the evaluator's `root` setting. "auto": the run's own
# root, as the training-time evaluator uses (Radial Embeddings' stored or
# learned root; else the empty string).
ROOTS = {"auto": "objective", "empty": "empty", "zero": "zero"}
PREFIX = "eval/hierarchy/"


def evaluate(
  workdir: str,
  *,
  csv: str | None = None,
  images: str | None = None,
  world_split: bool = False,
  num_examples: int | None = None,
  step: int | None = None,
  root: str = "auto",
  image_size: int | None = None,
  method: str = "thresholds",
  omit_first: bool = False,
) -> dict:
  """P, R, tau_d (unprefixed) of the run in `workdir`; with --world also the
  world evaluator's recall@K, with a CSV the numbers of items and skipped rows."""
  model = inference.load(workdir, step=step)
  if image_size:
    model.image_size = int(image_size)
  config = model.config
  results = {}
  if world_split:
    world = registry.get("world").build(
      "world", registry.entry("world", num_examples=num_examples), config, model.tokenizer
    )
    # The run's own scoring (cosine / Lorentz inner product) for recall@K.
    results.update({k: v for k, v in world(model).items() if "recall" in k})
  else:
    # CSV images are read at the model's resolution (--image_size overrides it).
    config = ml_collections.ConfigDict(config.to_dict())
    config.input.image_size = model.image_size
  settings = registry.entry(
    "hierarchy",
    source="world" if world_split else "hierarcaps",
    path=csv or "",
    image_root=images or "",
    num_examples=num_examples,
    root=ROOTS[root],
    method=method,
    omit_first_prediction=omit_first,
  )
  evaluator = registry.get("hierarchy").build("hierarchy", settings, config, model.tokenizer)
  if not world_split:
    problems = evaluator.skipped_rows
    if problems:
      print(f"skipped {len(problems)} malformed row(s) of {csv}:", file=sys.stderr)
      for problem in problems:
        print(f"  {problem}", file=sys.stderr)
    results["num_items"] = len(evaluator.data["image"])
    results["num_skipped_rows"] = len(problems)
  results.update({k.removeprefix(PREFIX): v for k, v in evaluator(model).items()})
  return results


@errors.report_user_errors
def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  if not FLAGS.workdir:
    raise app.UsageError("--workdir is required")
  if not FLAGS.world and not (FLAGS.csv and FLAGS.images):
    raise app.UsageError("give --csv and --images, or --world")
  results = evaluate(
    FLAGS.workdir,
    csv=FLAGS.csv,
    images=FLAGS.images,
    world_split=FLAGS.world,
    num_examples=FLAGS.num_examples,
    step=FLAGS.step,
    root=FLAGS.root,
    image_size=FLAGS.image_size,
    method=FLAGS.method,
    omit_first=FLAGS.omit_first,
  )
  source = "synthetic world (test)" if FLAGS.world else FLAGS.csv
  print(f"HierarCaps metrics for {FLAGS.workdir} on {source}:")
  print(f"  P      {results['precision']:.4f}")
  print(f"  R      {results['recall']:.4f}")
  print(f"  tau_d  {results['tau_d']:.4f}")
  for key in sorted(results):
    if key not in ("precision", "recall", "tau_d"):
      print(
        f"  {key}  {results[key]:.4f}"
        if isinstance(results[key], float)
        else f"  {key}  {results[key]}"
      )
  if FLAGS.output:
    os.makedirs(os.path.dirname(os.path.abspath(FLAGS.output)), exist_ok=True)
    with open(FLAGS.output, "w") as f:
      json.dump(
        {"workdir": os.path.abspath(FLAGS.workdir), "source": source, **results},
        f,
        indent=2,
        sort_keys=True,
      )
    print(f"wrote {FLAGS.output}")


if __name__ == "__main__":
  define_flags()
  app.run(main)
