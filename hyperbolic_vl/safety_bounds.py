"""HySAC's radius bounds of a run: `python -m hyperbolic_vl.safety_bounds`.

  python -m hyperbolic_vl.safety_bounds --workdir=runs/hysac_tiny
  python -m hyperbolic_vl.safety_bounds --workdir=runs/hysac_l14 --split=train \\
      --output=hysac_bounds.json

Embeds a quadruplet split of the run's own data source (`--split`, default
"validation"; a ViSU run reads its `input.data.eval_path`, `--data_path`
names another ViSU file) and writes the per-modality bounds in the
release's `hysac_bounds.json` layout (hyperbolic_vl/evaluators/metrics/safety.py), by default
to <workdir>/hysac_bounds.json, where `hyperbolic_vl.load(...)`'s
`traverse_to_safe_image` / `traverse_to_safe_text` and the HySAC exporter
find them.
"""

from __future__ import annotations

import os

from absl import app, flags

from hyperbolic_vl import errors


def define_flags() -> None:
  """The command line's flags, defined only when this module is the program."""
  # Before jax, Orbax and absl log anything (the imports are in `main`).
  errors.define_log_info_flag()
  flags.DEFINE_string("workdir", None, "Run directory of a HySAC (quadruplet) run.")
  flags.DEFINE_string("split", "validation", "Evaluation split of the run's data source.")
  flags.DEFINE_integer("num_examples", None, "Quadruplets to embed (default: the source's).")
  flags.DEFINE_string("data_path", "", "Another ViSU file (sets input.data.eval_path).")
  flags.DEFINE_string("output", "", "File to write (default <workdir>/hysac_bounds.json).")
  flags.DEFINE_bool("verbose", False, "Show the traceback of a user error.")


FLAGS = flags.FLAGS


def estimate_run_bounds(
  workdir: str, split: str = "validation", num_examples=None, data_path: str = ""
) -> dict:
  """The bounds of `workdir`'s model on a quadruplet split of its data."""
  import hyperbolic_vl  # pylint: disable=g-import-not-at-top
  from hyperbolic_vl.evaluators import safety_retrieval  # pylint: disable=g-import-not-at-top
  from hyperbolic_vl.evaluators.metrics import safety  # pylint: disable=g-import-not-at-top

  model = hyperbolic_vl.load(workdir)
  config = model.config
  if data_path:
    with config.unlocked():
      if "eval_path" not in config.input.data:
        raise errors.ConfigError(f"--data_path: source {config.input.data.name!r} has no eval_path")
      config.input.data.eval_path = data_path
  data = safety_retrieval.quadruplet_split(config.input, model.tokenizer, split, num_examples)
  return safety.estimate_bounds(safety_retrieval.embed(model, data), float(model.curv))


@errors.report_user_errors
def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  errors.quiet_library_info()
  from hyperbolic_vl import files  # pylint: disable=g-import-not-at-top
  from hyperbolic_vl.evaluators.metrics import safety  # pylint: disable=g-import-not-at-top

  if not FLAGS.workdir:
    raise errors.ConfigError("--workdir is required")
  bounds = estimate_run_bounds(FLAGS.workdir, FLAGS.split, FLAGS.num_examples, FLAGS.data_path)
  output = FLAGS.output or os.path.join(FLAGS.workdir, safety.BOUNDS_FILE)
  files.write_file_atomically(output, safety.bounds_json(bounds))
  print(f"wrote {output}")
  for letter, statistics in bounds.items():
    values = ", ".join(f"{k} {v:.4f}" for k, v in statistics.items())
    print(f"  {letter} ({safety.BOUND_MODALITIES[letter]}): {values}")


if __name__ == "__main__":
  define_flags()
  app.run(main)
