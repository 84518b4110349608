"""Evaluate a run with any registered evaluator; one command, one results file.

  # MERU's whole table: zero-shot on 20 datasets + COCO + Flickr30K
  python -m hyperbolic_vl.evaluate --workdir=RUN --suite=meru \
      --tfds_data_dir=DIR --flickr30k_csv=F.csv --flickr30k_images=IMAGES \
      --output=RUN/eval.json
  # the evaluators the run's own config lists (config.evals)
  python -m hyperbolic_vl.evaluate --workdir=RUN --suite=config
  # one evaluator of any type, its settings given by --set=KEY=VALUE (repeat)
  python -m hyperbolic_vl.evaluate --workdir=RUN --eval=TYPE --set=KEY=VALUE ...
  python -m hyperbolic_vl.evaluate --workdir=RUN --eval=hierarchy \
      --set=source=hierarcaps --set=path=hierarcaps_test.csv --set=image_root=IMAGES \
      --set=root=zero --set=method=interpolation
  # a type registered by your own module (it calls evaluators.registry.register)
  python -m hyperbolic_vl.evaluate --workdir=RUN --module=my_package.my_evals --eval=my_type

--set values are read as the type of the setting's default: true/false for
booleans, numbers, text; a tuple setting takes a JSON list or comma-separated
values. `--eval=TYPE --help_eval` lists a type's settings and defaults (with
no --eval, every type). The evaluator's name (its figures' and output
folder's label) is --name, else the stem of its dataset / path, else TYPE.

Shorthand flags set the settings of the same meaning when the type has them:
  --dataset=D       dataset=D; for types with a `source` instead (hierarchy,
                    atmg_analysis): "world" -> source=world, "csv:FILE" ->
                    source=hierarcaps, path=FILE
  --split, --num_examples, --batch_size   the settings of those names
  --images=DIR      images=DIR (retrieval), else image_root=DIR
  --tfds_data_dir   data_dir
  --prompt=T        prompts (repeat the flag)
so these documented forms work:
  python -m hyperbolic_vl.evaluate --workdir=RUN --eval=zero_shot \
      --dataset=tfds:NAME --split=test --tfds_data_dir=DIR --output=F.json
  python -m hyperbolic_vl.evaluate --workdir=RUN --eval=retrieval \
      --dataset=csv:FILE.csv --images=DIR
  # ATMG's hierarchy accuracies + eigenvalue plot (RUN/eval/atmg_analysis[_CSV]/)
  python -m hyperbolic_vl.evaluate --workdir=RUN --eval=atmg_analysis --dataset=world
  python -m hyperbolic_vl.evaluate --workdir=RUN --eval=atmg_analysis \
      --dataset=csv:hierarcaps_test.csv [--images=DIR]
  # HierarCaps P / R / tau_d
  python -m hyperbolic_vl.evaluate --workdir=RUN --eval=hierarchy \
      --dataset=csv:hierarcaps_test.csv --images=DIR

Result keys: zero_shot/<dataset>/top1_mean_per_class (and top1),
retrieval/<dataset>/{i2t,t2i}_recall@{1,5,10}, linear_probe/<dataset>/top1,
and each other type's own. A dataset missing from the data directory gets
one line saying which, where and how to prepare it; the other evaluators
still run. An evaluator that refuses a run (its data is absent, or it does
not define its figures for the run's geometry) prints one line; over
several --workdir the other runs go on, and the refused run's --results row
carries the reason ("refused"), shown in the table and picture. Every file
the command writes (--output, --results, --table, --plot) is checked before
any model loads. The command exits 2 (one line) when nothing could be
evaluated, 130 on Ctrl-C (the rows already appended are kept). The model is
rebuilt from the workdir's config.json (`hyperbolic_vl.load`); embedding is
sharded over every local device.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import sys
import time

import ml_collections
from absl import app, flags

from hyperbolic_vl import errors, files, inference
from hyperbolic_vl.evaluators import command_entries, registry
from hyperbolic_vl.runs import results_table

SUITES = ("meru", "phyclip", "uncha", "config")


def define_flags(flag_values: flags.FlagValues | None = None) -> None:
  """The command line's flags; defined only when this module runs as the
  program, so that importing it (for its functions) next to another
  command-line module never defines a flag twice. `flag_values`: where
  (absl's FLAGS by default; a test passes its own, see `FLAGS`)."""
  fv = flags.FLAGS if flag_values is None else flag_values
  errors.define_log_info_flag(fv)
  flags.DEFINE_bool(
    "verbose",
    False,
    "Show the traceback of a configuration, data or workdir error.",
    flag_values=fv,
  )
  _define_run_flags(fv)
  _define_evaluation_flags(fv)
  _define_data_flags(fv)
  _define_embedding_flags(fv)


def _define_run_flags(fv: flags.FlagValues) -> None:
  """The runs evaluated and where their figures go."""
  flags.DEFINE_multi_string(
    "workdir",
    [],
    "Run directory (config.json + checkpoints); repeat for several runs.",
    flag_values=fv,
  )
  flags.DEFINE_multi_string(
    "run_name",
    [],
    "The table's name of each --workdir, in order (default: its folder name).",
    flag_values=fv,
  )
  flags.DEFINE_integer("step", None, "Checkpoint step (default: latest).", flag_values=fv)
  flags.DEFINE_string(
    "results",
    None,
    "JSON-lines results file: each run's figures are appended as one row.",
    flag_values=fv,
  )
  flags.DEFINE_string(
    "table", None, "Markdown file: the table of every run in --results.", flag_values=fv
  )
  flags.DEFINE_string(
    "plot", None, "PNG file: the picture of that table (the plots extra).", flag_values=fv
  )
  flags.DEFINE_string(
    "columns", "", "Regular expression choosing the table's figures.", flag_values=fv
  )
  flags.DEFINE_string("output", None, "JSON file for the figures.", flag_values=fv)


def _define_evaluation_flags(fv: flags.FlagValues) -> None:
  """What is evaluated: a paper's suite, the run's own evaluators, or one
  evaluator on one dataset."""
  flags.DEFINE_enum(
    "suite",
    None,
    SUITES,
    "A paper's table (meru, phyclip, uncha), or the run's config.evals.",
    flag_values=fv,
  )
  flags.DEFINE_string("eval", None, "One evaluator type (any registered one).", flag_values=fv)
  flags.DEFINE_multi_string(
    "set", [], "KEY=VALUE: a setting of --eval's type (repeat).", flag_values=fv
  )
  flags.DEFINE_string(
    "name", None, "The evaluator's name (default: its dataset's stem or type).", flag_values=fv
  )
  flags.DEFINE_multi_string(
    "module",
    [],
    "Python module to import first, e.g. one registering its own evaluator types.",
    flag_values=fv,
  )
  flags.DEFINE_bool(
    "help_eval", False, "List the settings of --eval's type (or of every type).", flag_values=fv
  )
  flags.DEFINE_string(
    "dataset", None, "Benchmark name, tfds:NAME, folder:DIR, csv:FILE or world.", flag_values=fv
  )
  flags.DEFINE_string(
    "split", "", "Split (default: the benchmark's test split, else 'test').", flag_values=fv
  )
  flags.DEFINE_string("images", "", "Image folder of a csv: dataset.", flag_values=fv)
  flags.DEFINE_multi_string(
    "prompt",
    [],
    "Zero-shot prompt template with {} (repeat the flag; default: the dataset's).",
    flag_values=fv,
  )
  flags.DEFINE_integer(
    "num_examples", None, "Evaluate only the first N images per dataset.", flag_values=fv
  )


def _define_data_flags(fv: flags.FlagValues) -> None:
  """Where each benchmark's files are."""
  flags.DEFINE_string(
    "tfds_data_dir", "", "TFDS data directory (default: TFDS's own).", flag_values=fv
  )
  flags.DEFINE_string(
    "flickr30k_csv", "", "Flickr30K Karpathy test CSV (image, caption).", flag_values=fv
  )
  flags.DEFINE_string("flickr30k_images", "", "Flickr30K image folder.", flag_values=fv)
  flags.DEFINE_string(
    "sugarcrepe_dir", "", "SugarCrepe's data/ folder (its seven JSON files).", flag_values=fv
  )
  flags.DEFINE_string(
    "coco_val2017", "", "COCO val2017 image folder (SugarCrepe's images).", flag_values=fv
  )
  flags.DEFINE_string(
    "vl_checklist_dir", "", "A VL-Checklist checkout (corpus/ and data/).", flag_values=fv
  )
  flags.DEFINE_string(
    "vl_checklist_images",
    "",
    "The folder of VL-Checklist's image folders (vg/, hake/, swig/).",
    flag_values=fv,
  )
  flags.DEFINE_string(
    "voc2007_dir", "", "VOCdevkit/VOC2007 (ImageSets/Main, JPEGImages).", flag_values=fv
  )
  flags.DEFINE_string(
    "coco_instances", "", "COCO instances_<split>.json for multi-label mAP.", flag_values=fv
  )
  flags.DEFINE_string("coco_images", "", "The image folder of --coco_instances.", flag_values=fv)


def _define_embedding_flags(fv: flags.FlagValues) -> None:
  """How the towers embed: the batch, the dtype and the processes that share
  the work."""
  flags.DEFINE_integer("batch_size", 256, "Images / texts per embedding batch.", flag_values=fv)
  flags.DEFINE_enum(
    "dtype",
    "float32",
    ["float32", "bfloat16"],
    "The towers' compute dtype (float32 whatever the run trained in; bfloat16 is faster).",
    flag_values=fv,
  )
  flags.DEFINE_bool(
    "multihost",
    False,
    "Join JAX's distributed runtime; each process embeds its slice of every set.",
    flag_values=fv,
  )
  flags.DEFINE_string(
    "coordinator_address", None, "host:port of process 0 (with --multihost).", flag_values=fv
  )
  flags.DEFINE_integer(
    "num_processes", None, "Number of processes (with --multihost).", flag_values=fv
  )
  flags.DEFINE_integer(
    "process_id", None, "This process's index (with --multihost).", flag_values=fv
  )


# The flags main reads; a test of main points it (and absl's flags.FLAGS,
# which errors.report_user_errors reads) at a FlagValues of its own.
FLAGS = flags.FLAGS


def evaluate(run_config, evals: dict, predictor, refusals: dict | None = None) -> dict:
  """Builds the named evaluators for the run (each from its settings and the
  run's `config.input`, registry.build_all) and runs them on `predictor`.
  An evaluator that cannot be built or refuses this model prints one line
  (registry) and, when `refusals` is given, is entered there {name: reason}."""
  refusals = {} if refusals is None else refusals
  config = ml_collections.ConfigDict(run_config.to_dict())
  config.evals = ml_collections.ConfigDict(evals)
  evaluators = registry.build_all(
    config, predictor.tokenizer, workdir=getattr(predictor, "workdir", None), refusals=refusals
  )
  figures = {}
  for evaluator in evaluators:
    start = time.perf_counter()
    print(f"{evaluator.name} ...", flush=True)
    figures.update(registry.run_all([evaluator], predictor, refusals=refusals))
    if evaluator.name not in refusals:  # its refusal was its last line
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


def write_output(path: str, workdir: str, figures: dict, **extra) -> None:
  text = json.dumps(
    {"workdir": os.path.abspath(workdir), **extra, "figures": figures}, indent=2, sort_keys=True
  )
  files.write_file_atomically(path, text)  # an interrupted write leaves the old file
  print(f"wrote {path}")


def check_output_file(flag: str, path: str) -> None:
  """ConfigError (one line) unless `path` can be written as a file: not a
  folder, under folders that are folders (or can be made) and writable.
  Checked before any model loads, so a bad path costs no evaluation."""
  where = os.path.abspath(path)
  if os.path.isdir(where):
    raise errors.ConfigError(f"--{flag}={path} is a folder; give a file path")
  if os.path.exists(where) and not os.access(where, os.W_OK):
    raise errors.ConfigError(f"--{flag}={path} is not writable")
  parent = os.path.dirname(where)
  while not os.path.exists(parent):  # the nearest folder that exists must take the new ones
    parent = os.path.dirname(parent)
  if not os.path.isdir(parent):
    raise errors.ConfigError(f"--{flag}={path}: {parent} is a file, not a folder")
  if not os.access(parent, os.W_OK | os.X_OK):
    raise errors.ConfigError(f"--{flag}={path}: cannot write in {parent}")


def check_outputs() -> None:
  """Every file the command will write, and the plots extra for --plot."""
  for flag in ("output", "results", "table", "plot"):
    if FLAGS[flag].value:
      check_output_file(flag, FLAGS[flag].value)
  if FLAGS.plot and importlib.util.find_spec("matplotlib") is None:
    raise errors.ConfigError("--plot needs matplotlib: pip install -e '.[plots]'")


def check_workdirs(workdirs: list[str]) -> None:
  """Every --workdir is a run directory, before the first one is evaluated."""
  for workdir in workdirs:
    if not os.path.isdir(workdir):
      raise errors.WorkdirError(f"--workdir={workdir}: no such run directory")


def suite_evaluators(suite: str, common: dict) -> dict:
  """config.evals entries of a paper suite, from the data flags."""
  tables = (FLAGS.tfds_data_dir, FLAGS.flickr30k_csv, FLAGS.flickr30k_images)
  if suite == "meru":
    return command_entries.meru_suite(*tables, **common)
  if suite == "phyclip":
    return command_entries.phyclip_suite(
      *tables,
      FLAGS.sugarcrepe_dir,
      FLAGS.coco_val2017,
      FLAGS.vl_checklist_dir,
      FLAGS.vl_checklist_images,
      **common,
    )
  if suite == "uncha":
    return command_entries.uncha_suite(
      *tables, FLAGS.voc2007_dir, FLAGS.coco_instances, FLAGS.coco_images, **common
    )
  raise ValueError(f"unknown suite {suite!r}")


def start_processes() -> None:
  """--multihost: joins JAX's distributed runtime (as hyperbolic_vl.main
  does); the processes then split every embedding (predictor.py) and only
  process 0 prints and writes."""
  explicit = (FLAGS.coordinator_address, FLAGS.num_processes, FLAGS.process_id)
  if any(v is not None for v in explicit) and not FLAGS.multihost:
    raise errors.ConfigError("--coordinator_address/--num_processes/--process_id need --multihost")
  if not FLAGS.multihost:
    return
  import jax

  # CPU collectives cross processes through gloo; accelerators are unaffected.
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  jax.distributed.initialize(
    coordinator_address=FLAGS.coordinator_address,
    num_processes=FLAGS.num_processes,
    process_id=FLAGS.process_id,
  )
  if jax.process_index() != 0:
    sys.stdout = open(os.devnull, "w")  # noqa: SIM115 (lives as long as the process)


def is_lead_process() -> bool:
  import jax

  return jax.process_index() == 0


def run_names(workdirs: list[str], names: list[str]) -> list[str]:
  """The table's name of each run: --run_name in order, else the folder's name."""
  if names and len(names) != len(workdirs):
    raise errors.ConfigError(f"{len(names)} --run_name for {len(workdirs)} --workdir")
  chosen = names or [os.path.basename(os.path.normpath(w)) for w in workdirs]
  if len(set(chosen)) != len(chosen):
    raise errors.ConfigError(
      f"two runs share a name in {chosen}; set --run_name for each --workdir"
    )
  return chosen


def render_results() -> str:
  """--results' markdown table (written to --table) and, with --plot, its
  picture, drawn here where it is asked for: runs/ reads the file, plots/
  draws it, and neither imports the command."""
  table = results_table.read_table(FLAGS.results, FLAGS.columns)
  text = results_table.write_markdown(table, FLAGS.table)
  if FLAGS.plot:  # check_outputs found matplotlib before any model loaded
    from hyperbolic_vl.plots import results_views  # pylint: disable=g-import-not-at-top

    results_views.save_results_figure(table.runs, table.columns, FLAGS.plot, table.refused)
  return text


@errors.report_user_errors
def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  errors.quiet_library_info()
  for module in FLAGS.module:
    importlib.import_module(module)
  if FLAGS.help_eval:
    print(command_entries.describe_types([FLAGS.eval] if FLAGS.eval else registry.names()))
    return
  start_processes()
  check_outputs()
  if not FLAGS.workdir:
    if FLAGS.results and (FLAGS.table or FLAGS.plot):  # render an existing results file
      print(render_results(), end="")
      return
    # One line and exit code 2 (errors.report_user_errors): absl's UsageError
    # would print the whole --help first and exit 1.
    raise errors.ConfigError("--workdir is required (or --results with --table / --plot to render)")
  if bool(FLAGS.suite) == bool(FLAGS.eval):
    raise errors.ConfigError("give exactly one of --suite or --eval")
  if FLAGS.output and len(FLAGS.workdir) > 1:
    raise errors.ConfigError("--output takes one --workdir; for several runs use --results")
  if (FLAGS.table or FLAGS.plot) and not FLAGS.results:
    raise errors.ConfigError("--table and --plot render a --results file; set --results")
  names = run_names(FLAGS.workdir, FLAGS.run_name)
  common = dict(batch_size=FLAGS.batch_size, num_examples=FLAGS.num_examples)
  evals = {}
  if FLAGS.eval:
    # Checked before the model loads: a typo costs no checkpoint restore.
    try:
      evals = command_entries.one_evaluator(
        FLAGS.eval,
        FLAGS.set,
        FLAGS.name,
        dataset=FLAGS.dataset,
        split=FLAGS.split,
        images=FLAGS.images,
        data_dir=FLAGS.tfds_data_dir,
        prompts=FLAGS.prompt,
        **common,
      )
    except ValueError as error:
      raise errors.ConfigError(str(error)) from None
  elif FLAGS.suite != "config":
    evals = suite_evaluators(FLAGS.suite, common)
  # After the flags: a misspelt --eval is named whatever the run directory.
  check_workdirs(FLAGS.workdir)
  done = []  # the names of the runs whose figures or refusals are written
  try:
    evaluate_runs(names, evals, done)
  except KeyboardInterrupt:
    kept = f"; {FLAGS.results} keeps their rows" if FLAGS.results and done else ""
    print(
      f"interrupted: {len(done)} of {len(names)} run(s) evaluated{kept}",
      file=sys.stderr,
      flush=True,
    )
    sys.exit(130)  # a shell's code for SIGINT


def evaluate_runs(names: list[str], evals: dict, done: list[str]) -> None:
  """Evaluates each --workdir in turn; a run whose every evaluator refuses
  it gets its row (marked refused) and the others go on. Appends to `done`
  the name of each run whose row is written. Refused runs' rows wait for the
  first run with figures: a command that evaluates nothing writes nothing."""
  evaluation = FLAGS.suite or FLAGS.eval
  several = len(FLAGS.workdir) > 1
  evaluated, every_refusal, waiting = [], {}, []
  for workdir, name in zip(FLAGS.workdir, names):
    model = inference.load(
      workdir,
      step=FLAGS.step,
      batch_size=FLAGS.batch_size,
      dtype=FLAGS.dtype,
      split_across_processes=FLAGS.multihost,
    )
    if FLAGS.suite == "config":
      evals = dict(model.config.get("evals", {}) or {})
    refusals = {}
    figures = evaluate(model.config, evals, model, refusals)
    every_refusal.update({(name, evaluator): why for evaluator, why in refusals.items()})
    if several:
      print(f"{name} ({workdir})", flush=True)
    if figures:
      evaluated.append(name)
      print(format_table(figures), flush=True)
    else:
      print(f"  nothing evaluated: {len(refusals)} evaluator(s) refused (see above)", flush=True)
    waiting.append(
      results_table.evaluation_row(
        name, workdir, evaluation, FLAGS.step, figures, refused=refusals, evaluators=list(evals)
      )
    )
    if not evaluated:
      continue
    if is_lead_process():  # every process computed the figures; one writes them
      if FLAGS.output:
        write_output(FLAGS.output, workdir, figures)
      if FLAGS.results:
        results_table.append_rows(FLAGS.results, waiting)
    done.extend(row["run"] for row in waiting)
    waiting = []
  if not evaluated:
    if len(every_refusal) == 1:  # the one reason is the line
      ((_, evaluator), why), *_ = every_refusal.items()
      raise errors.DataError(f"{evaluator}: {why}")
    which = "any run" if several else FLAGS.workdir[0]
    raise errors.DataError(
      f"nothing could be evaluated on {which} (evaluators: {sorted(evals)}); see above"
    )
  if FLAGS.results and is_lead_process():
    print(f"appended {len(names)} row(s) to {FLAGS.results}")
    if FLAGS.table or FLAGS.plot:
      print(render_results(), end="")
      for path in (FLAGS.table, FLAGS.plot):
        if path:
          print(f"wrote {path}")


if __name__ == "__main__":
  define_flags()
  app.run(main)
