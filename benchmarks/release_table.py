"""Reproduce released checkpoints' tables: convert each release's weights on
disk into a run directory, evaluate it with its paper's suite, and append
its row to one results table (markdown and picture).

A released model by name (hyperbolic_vl/interop/releases.py) needs nothing
else: --pretrained=NAME downloads, checks and converts it into the releases
cache (or reads it from there), evaluates it with its paper's suite and
prints our figures beside the paper's (OUT_DIR/paper_comparison.md):

  python benchmarks/release_table.py --out_dir=/runs/releases --pretrained=meru_vit_l \
      --evaluate_flag=--tfds_data_dir=/data/tfds \
      --evaluate_flag=--flickr30k_csv=flickr30k_test.csv \
      --evaluate_flag=--flickr30k_images=/data/flickr30k/images

  python benchmarks/release_table.py --out_dir=/runs/releases \
      --release=meru_vit_l,meru,/weights/meru_vit_l.pth,configs/meru.py:vit_l,meru \
      --release=meru_vit_b,meru,/weights/meru_vit_b.pth,configs/meru.py:vit_b,meru \
      --evaluate_flag=--tfds_data_dir=/data/tfds \
      --evaluate_flag=--flickr30k_csv=flickr30k_test.csv \
      --evaluate_flag=--flickr30k_images=/data/flickr30k/images

--release=NAME,SOURCE,CHECKPOINT,CONFIG[,SUITE]: SOURCE is a
`python -m hyperbolic_vl.convert --source` (meru, open_clip, hf_clip),
CONFIG the target config (file[:variant]), SUITE an evaluate suite (meru,
phyclip, uncha, config); without SUITE the --evaluate_flag flags say what
to evaluate (e.g. --evaluate_flag=--eval=TYPE --evaluate_flag=--set=...). --override=NAME:KEY=VALUE sets a
config key of one release before conversion (a shrunk test model, a
checkpoint's own sizes). A release whose run directory exists is not
converted again. Each --evaluate_flag=FLAG goes to `python -m
hyperbolic_vl.evaluate` for every release (data folders, --batch_size).
Writes OUT_DIR/results.jsonl, OUT_DIR/table.md and, with --plot,
OUT_DIR/table.png.
"""

import argparse
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hyperbolic_vl import command_line, errors  # noqa: E402
from hyperbolic_vl.interop import pretrained, releases  # noqa: E402
from hyperbolic_vl.interop import workdir as interop_workdir  # noqa: E402
from hyperbolic_vl.runs import results_table  # noqa: E402


def parse_release(text: str) -> dict:
  parts = text.split(",")
  if len(parts) not in (4, 5) or not all(parts):
    raise SystemExit(f"--release={text!r}: expected NAME,SOURCE,CHECKPOINT,CONFIG[,SUITE]")
  name, source, checkpoint, config = parts[:4]
  return dict(name=name, source=source, checkpoint=checkpoint, config=config, suite=parts[4:])


def load_config(spec: str):
  """A config file[:variant] -> its ConfigDict (as --config of the commands)."""
  import importlib.util

  path, _, variant = spec.partition(":")
  module_spec = importlib.util.spec_from_file_location("release_config", ROOT / path)
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  return module.get_config(variant) if variant else module.get_config()


def apply_overrides(config, overrides: list[str]):
  """KEY=VALUE pairs, each value of its key's type (hyperbolic_vl.command_line.apply_overrides)."""
  try:
    command_line.apply_overrides(config, overrides)
  except errors.ConfigError as e:
    raise SystemExit(f"--override: {e} (as NAME:KEY=VALUE)") from None
  return config


def pretrained_release(name: str, cache_dir: str | None) -> dict:
  """--pretrained=NAME: its converted run in the releases cache (downloaded
  and converted on first use) and its paper's suite."""
  try:
    run = pretrained.ensure_run(name, cache_dir=cache_dir)
  except pretrained.PretrainedError as e:
    raise SystemExit(f"error: {e}") from None
  return dict(name=name, run=str(run), suite=[releases.RELEASES[name].suite])


def paper_comparison(rows: list[dict], names: list[str]) -> str:
  """Markdown: for each release's paper figures, the paper's value and ours
  (the latest row of that run in `rows`), in percent."""
  latest = {row["run"]: row["figures"] for row in rows}
  lines = [
    "| release | figure | paper (where) | ours | ours - paper |",
    "|---|---|---:|---:|---:|",
  ]
  for name in names:
    entry = releases.RELEASES[name]
    if not entry.figures:
      lines.append(f"| {name} | (no paper figures recorded: {entry.note}) | | | |")
    for figure in entry.figures:
      ours = latest.get(name, {}).get(figure.figure)
      shown = "" if ours is None else f"{100 * ours:.1f}"
      difference = "" if ours is None else f"{100 * ours - figure.value:+.1f}"
      lines.append(
        f"| {name} | {figure.figure} | {figure.value:.1f} ({figure.where}) | {shown} | "
        f"{difference} |"
      )
  return "\n".join(lines) + "\n"


def convert(release: dict, out_dir: str, overrides: list[str]) -> str:
  run = os.path.join(out_dir, release["name"])
  if os.path.isdir(run):
    print(f"{release['name']}: {run} exists, not converted again", flush=True)
    return run
  config = apply_overrides(load_config(release["config"]), overrides)
  summary = interop_workdir.convert_checkpoint(
    release["source"], release["checkpoint"], config, run
  )
  print(f"{release['name']}: {summary['params']:,} parameters -> {run}", flush=True)
  return run


def evaluate(release: dict, run: str, out_dir: str, plot: bool, evaluate_flags: list[str]) -> None:
  flags = [
    f"--workdir={run}",
    f"--run_name={release['name']}",
    f"--results={os.path.join(out_dir, 'results.jsonl')}",
    f"--table={os.path.join(out_dir, 'table.md')}",
  ]
  if plot:
    flags.append(f"--plot={os.path.join(out_dir, 'table.png')}")
  if release["suite"]:
    flags.append(f"--suite={release['suite'][0]}")
  completed = subprocess.run(
    [sys.executable, "-m", "hyperbolic_vl.evaluate", *flags, *evaluate_flags], cwd=ROOT
  )
  if completed.returncode != 0:
    raise SystemExit(f"{release['name']}: evaluation failed (exit {completed.returncode})")


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out_dir", required=True)
  parser.add_argument("--release", action="append", default=[], type=parse_release)
  parser.add_argument(
    "--pretrained",
    action="append",
    default=[],
    help="A released model by name (hyperbolic_vl/interop/releases.py); repeat.",
  )
  parser.add_argument(
    "--cache_dir", default=None, help="Releases cache (default $HYPERBOLIC_VL_CACHE/releases)."
  )
  parser.add_argument("--override", action="append", default=[], help="NAME:KEY=VALUE")
  parser.add_argument(
    "--evaluate_flag", action="append", default=[], help="A flag of hyperbolic_vl.evaluate."
  )
  parser.add_argument("--plot", action="store_true", help="Also draw OUT_DIR/table.png.")
  args = parser.parse_args(argv)
  if not args.release and not args.pretrained:
    parser.error("give --release or --pretrained")
  unknown = [name for name in args.pretrained if name not in releases.RELEASES]
  if unknown:
    raise SystemExit(
      f"error: no released model named {unknown[0]!r}; valid names: "
      f"{', '.join(sorted(releases.RELEASES))}"
    )
  names = [r["name"] for r in args.release] + args.pretrained
  if len(set(names)) != len(names):
    raise SystemExit(f"release names repeat: {names}")
  os.makedirs(args.out_dir, exist_ok=True)
  for release in args.release:
    overrides = [
      o.partition(":")[2] for o in args.override if o.partition(":")[0] == release["name"]
    ]
    run = convert(release, args.out_dir, overrides)
    evaluate(release, run, args.out_dir, args.plot, args.evaluate_flag)
  for name in args.pretrained:
    release = pretrained_release(name, args.cache_dir)
    evaluate(release, release["run"], args.out_dir, args.plot, args.evaluate_flag)
  print(pathlib.Path(args.out_dir, "table.md").read_text(), end="")
  if args.pretrained:
    rows = results_table.read_rows(os.path.join(args.out_dir, "results.jsonl"))
    comparison = paper_comparison(rows, args.pretrained)
    pathlib.Path(args.out_dir, "paper_comparison.md").write_text(comparison)
    print(comparison, end="")


if __name__ == "__main__":
  main()
