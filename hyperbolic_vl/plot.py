"""Pictures of a run: `python -m hyperbolic_vl.plot --workdir=RUN`.

Writes PNGs to WORKDIR/plots (or --output_dir):
  training_curves.png      every loss term, curvature, logit scale, alphas,
                           clamped fractions and evaluation figures over steps
  disk_view.png            held-out images and captions on the Poincare disk
                           (Lorentz runs) or the unit sphere (CLIP runs)
  distance_histograms.png  distance to the origin (or angle to [ROOT]) per
                           modality and caption tier
  traversals.png           images and the texts met walking to [ROOT]
  interpolation.png        the geodesic between two images, nearest texts/images
  cone.png                 (Lorentz runs) a caption's entailment cone and the
                           held-out images it contains
  box_levels.png           (runs on world_boxes, HyCoCLIP) distance to the
                           origin of phrases, captions, box crops and images
The views need a model with a text tower and a source with a held-out split
(any evaluation split of the data registry), and one Lorentz space (a
product run, PHyCLIP's `model.factor_dim` > 0, is told from its config.json
before any model loads); without them, or with --curves_only, only the curves are
written. Needs the "plots"
extra (matplotlib). See docs/plots.md for how to read each picture.

`python -m hyperbolic_vl.plot --compare=RUN_A,RUN_B` overlays the training
curves of two (up to four) runs instead, one line style per run, in
compare_<A>_vs_<B>.png (in --output_dir, default the first run's plots/).
An item of --compare that is no directory names a method whose reference
curves ship with the package (runs/reference_runs.py):
`--workdir=RUN --compare=meru` draws RUN (solid) against tiny MERU's
reference run (dashed) in RUN/plots/compare_<RUN>_vs_meru_reference.png.
"""

from __future__ import annotations

import json
import os

from absl import app, flags

from hyperbolic_vl import errors


def define_flags() -> None:
  """The command line's flags, defined only when this module is the program."""
  errors.define_log_info_flag()
  flags.DEFINE_string("workdir", None, "Run directory (config.json, checkpoints, metrics.jsonl).")
  flags.DEFINE_string(
    "compare",
    None,
    "RUN_A,RUN_B[,...]: overlay these runs' training curves; an item that is no directory "
    "names a method's reference run (e.g. --workdir=RUN --compare=meru).",
  )
  flags.DEFINE_string("output_dir", None, "Folder for the PNGs (default: WORKDIR/plots).")
  flags.DEFINE_integer("step", None, "Checkpoint step for the views (default: latest).")
  flags.DEFINE_integer("num_examples", 200, "Held-out examples embedded for the views.")
  flags.DEFINE_bool(
    "curves_only", False, "Write training_curves.png alone: no model is loaded (seconds)."
  )
  flags.DEFINE_bool("verbose", False, "Show the traceback of a workdir or data error.")


FLAGS = flags.FLAGS


def _plots():
  try:
    from hyperbolic_vl import plots
    from hyperbolic_vl.plots import run_views, style
  except ImportError as error:
    if error.name and error.name.startswith("matplotlib"):
      raise errors.ConfigError(
        "plotting needs matplotlib: pip install 'hyperbolic_vl[plots]'"
      ) from error
    raise
  return plots, run_views, style


def product_of_spaces(workdir: str) -> str | None:
  """Why the views cannot draw this run, read from its config.json alone (no
  model loaded): a product of Lorentz spaces has no one Poincare disk to draw
  it on. None for a single space, or when config.json cannot say (loading the
  run then reports what is wrong)."""
  try:
    with open(os.path.join(workdir, "config.json"), encoding="utf-8") as f:
      model = json.load(f).get("model") or {}
    factor_dim = int(model.get("factor_dim") or 0)
  except (OSError, ValueError, TypeError, AttributeError):
    return None
  if not factor_dim or model.get("geometry", "lorentz") != "lorentz":
    return None
  factors = int(model.get("embed_dim") or 0) // factor_dim
  return (
    "the plots draw one Lorentz space on the Poincare disk; this run's model is a product "
    f"of {factors} spaces (model.factor_dim={factor_dim})"
  )


def write_plots(
  workdir: str,
  output_dir: str | None = None,
  *,
  step: int | None = None,
  num_examples: int = 200,
  curves_only: bool = False,
) -> dict[str, str]:
  """Writes the run's PNGs (`curves_only`: the training curves alone, from
  metrics.jsonl, with no model loaded); returns {file stem: path}."""
  plots, run_views, style = _plots()
  if not os.path.isdir(workdir):
    raise errors.WorkdirError(f"--workdir={workdir}: no such run directory")
  output_dir = output_dir or os.path.join(workdir, "plots")
  name = os.path.basename(os.path.normpath(workdir))
  written = {}
  if os.path.isfile(os.path.join(workdir, "metrics.jsonl")):
    figure = plots.training_curves(workdir, title=f"{name}: training curves")
    written["training_curves"] = os.path.join(output_dir, "training_curves.png")
    style.save_png(figure, written["training_curves"])
  else:
    print(f"{workdir}: no metrics.jsonl; training curves skipped")
  product = product_of_spaces(workdir)
  if curves_only:
    figures = {}
  elif product is not None:
    print(f"views skipped: {product}; training curves only")
    figures = {}
  else:
    from hyperbolic_vl import inference  # pylint: disable=g-import-not-at-top (jax: views only)

    model = inference.load(workdir, step=step)
    try:
      figures = run_views.run_figures(model, num_examples=num_examples, name=name)
    except run_views.ViewsUnavailable as error:
      print(f"views skipped: {error}; training curves only")
      figures = {}
  for stem, figure in figures.items():
    written[stem] = os.path.join(output_dir, f"{stem}.png")
    style.save_png(figure, written[stem])
  return written


def comparison_sources(items: list[str]) -> list[tuple[str, str, bool]]:
  """(name, metrics source, is a run directory) of each --compare item: a
  run directory, else a method whose reference curves ship with the package
  (one line naming the known methods for any other name)."""
  from hyperbolic_vl.runs import reference_runs  # pylint: disable=g-import-not-at-top

  sources = []
  for item in items:
    if os.path.isdir(item) or os.sep in item or "/" in item:  # a path: a run directory
      if not os.path.isfile(os.path.join(item, "metrics.jsonl")):
        raise errors.WorkdirError(f"--compare: {item} has no metrics.jsonl (not a run directory?)")
      sources.append((os.path.basename(os.path.normpath(item)), item, True))
    else:
      sources.append((f"{item}_reference", reference_runs.metrics_path(item), False))
  return sources


def comparison_figure(items: list[str]):
  """The overlaid training curves of runs and methods' reference runs
  (`comparison_sources`): (figure, file-name stems, the run directories)."""
  plots, _, _ = _plots()
  if not 2 <= len(items) <= 4:
    raise errors.ConfigError(
      f"--compare needs 2 to 4 runs or methods separated by commas, got {len(items)}"
    )
  sources = comparison_sources(items)
  names = [name for name, _, _ in sources]
  labels = names if len(set(names)) == len(names) else [f"{i + 1}:{n}" for i, n in enumerate(names)]
  try:
    figure = plots.compare_curves(
      [(label, source) for label, (_, source, _) in zip(labels, sources)],
      title=" vs ".join(labels) + ": training curves",
    )
  except ValueError as error:
    raise errors.WorkdirError(f"--compare: {error}") from error
  return figure, names, [source for _, source, is_run in sources if is_run]


def write_comparison(items: list[str], output_dir: str | None = None) -> str:
  """Writes `comparison_figure` to compare_<A>_vs_<B>.png in `output_dir`
  (default the first run directory's plots/); returns the PNG's path."""
  _, _, style = _plots()
  figure, names, runs = comparison_figure(items)
  if output_dir is None and not runs:
    raise errors.ConfigError("--compare of reference runs alone: give --output_dir for the PNG")
  path = os.path.join(
    output_dir or os.path.join(runs[0], "plots"), f"compare_{'_vs_'.join(names)}.png"
  )
  style.save_png(figure, path)
  return path


@errors.report_user_errors
def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  if FLAGS.compare is not None:
    items = [item.strip() for item in FLAGS.compare.split(",") if item.strip()]
    if FLAGS.workdir:  # the run first (solid), what it is compared with after
      if not os.path.isdir(FLAGS.workdir):
        raise errors.WorkdirError(f"--workdir={FLAGS.workdir}: no such run directory")
      items.insert(0, FLAGS.workdir)
    print(f"wrote {write_comparison(items, FLAGS.output_dir)}")
    return
  if not FLAGS.workdir:
    raise app.UsageError("--workdir is required")
  errors.quiet_library_info()
  written = write_plots(
    FLAGS.workdir,
    FLAGS.output_dir,
    step=FLAGS.step,
    num_examples=FLAGS.num_examples,
    curves_only=FLAGS.curves_only,
  )
  for path in written.values():
    print(f"wrote {path}")


if __name__ == "__main__":
  define_flags()
  app.run(main)
