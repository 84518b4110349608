"""Released PyTorch checkpoint -> run directory of this codebase.

  python -m hyperbolic_vl.convert --source=meru --checkpoint=meru_vit_l.pth \
      --config=configs/meru.py:vit_l --workdir=/runs/meru_vit_l
  python -m hyperbolic_vl.convert --source=uncha --checkpoint=uncha_vit_b.pth \
      --config=configs/uncha.py:vit_b --workdir=/runs/uncha_vit_b
  python -m hyperbolic_vl.convert --source=open_clip --checkpoint=ViT-B-32.pt \
      --config=configs/clip.py:openai_vit_b32 --workdir=/runs/openai_b32
  python -m hyperbolic_vl.convert --source=hf_clip --checkpoint=model.safetensors \
      --config=configs/clip.py:openai_vit_b32 --workdir=/runs/hf_b32
  python -m hyperbolic_vl.convert --source=hysac --checkpoint=hysac_model.pth \
      --bounds=hysac_bounds.json --config=configs/hysac.py:vit_l14 --workdir=/runs/hysac
  python -m hyperbolic_vl.convert --source=hac --checkpoint=hac_vit_b_lora.pth \
      --config=configs/hac.py --workdir=/runs/hac_vit_b_lora

A released model by name (hyperbolic_vl/interop/releases.py) needs neither
--source nor --config: it is downloaded into the cache ($HYPERBOLIC_VL_CACHE
or --cache_dir), checked and converted (into --workdir when given, else the
cache, where hyperbolic_vl.load(NAME) finds it); --checkpoint=FILE converts
a copy fetched by hand, for machines without network:

  python -m hyperbolic_vl.convert --pretrained=meru_vit_l [--workdir=/runs/meru_vit_l]
  python -m hyperbolic_vl.convert --list    # the names, with paper, size and address

The config names the target architecture; every checkpoint tensor must map
onto it (see hyperbolic_vl/interop). Keys a release adds that this codebase
has no use for are skipped only when named with --ignore (regular
expressions), and are listed in the output.
"""

import sys

from absl import app, flags
from ml_collections import config_flags

from hyperbolic_vl import command_line, errors

errors.define_log_info_flag()
flags.DEFINE_enum(
  "source", None, ["meru", "uncha", "open_clip", "hf_clip", "hysac", "hac"], "Checkpoint format."
)
flags.DEFINE_string("bounds", "", "HySAC: hysac_bounds.json, written into the run.")
flags.DEFINE_string("checkpoint", None, "Checkpoint file (.pth, .pt, .bin or .safetensors).")
flags.DEFINE_string("workdir", None, "New run directory to write (must not hold files).")
flags.DEFINE_bool("verbose", False, "Show the traceback of a configuration or file error.")
flags.DEFINE_multi_string("ignore", [], "Regex of checkpoint tensors to skip (reported).")
config_flags.DEFINE_config_file("config", None, "Target config, e.g. configs/meru.py:vit_l.")
flags.DEFINE_string(
  "pretrained",
  None,
  "A released model by name (e.g. meru_vit_l): source and config from its entry.",
)
flags.DEFINE_bool(
  "list", False, "List the released models by name (hyperbolic_vl.list_pretrained)."
)
flags.DEFINE_string(
  "cache_dir", None, "Releases cache for --pretrained (default $HYPERBOLIC_VL_CACHE/releases)."
)
FLAGS = flags.FLAGS
WITHOUT_PRETRAINED = ("source", "checkpoint", "workdir", "config")


def convert_pretrained() -> None:
  from hyperbolic_vl.interop import pretrained

  given = [f"--{name}" for name in ("source", "config", "bounds", "ignore") if FLAGS[name].present]
  if given:
    raise errors.ConfigError(
      f"--pretrained takes its source and config from the release table; drop {', '.join(given)}"
    )
  try:
    run = pretrained.ensure_run(
      FLAGS.pretrained,
      workdir=FLAGS.workdir,
      cache_dir=FLAGS.cache_dir,
      checkpoint=FLAGS.checkpoint,
    )
  except KeyboardInterrupt:
    # Ctrl-C: no run is written (conversion stages it). A partial download
    # from a plain address stays as FILE.part, which the same command
    # continues; the Hub's client removes its own partial file.
    print(
      f"interrupted: {FLAGS.pretrained} not converted; run the same command again to resume "
      "(a finished download is reused; a partial one is continued, from the Hub restarted)",
      file=sys.stderr,
      flush=True,
    )
    sys.exit(130)  # a shell's code for SIGINT
  print(f"{FLAGS.pretrained}: {run}")


@errors.report_user_errors
def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  errors.quiet_library_info()
  if FLAGS.list:
    from hyperbolic_vl.interop import pretrained

    print(pretrained.format_list(pretrained.list_pretrained()))
    return
  if FLAGS.pretrained:
    convert_pretrained()
    return
  missing = [f"--{name}" for name in WITHOUT_PRETRAINED if not FLAGS[name].present]
  if missing:
    raise errors.ConfigError(f"give --pretrained=NAME, or {', '.join(missing)} for a file")
  from hyperbolic_vl.interop import common, workdir

  try:
    summary = workdir.convert_checkpoint(
      FLAGS.source,
      FLAGS.checkpoint,
      FLAGS.config,
      FLAGS.workdir,
      ignore=tuple(FLAGS.ignore),
      bounds=FLAGS.bounds,
    )
  except (common.ConversionError, FileExistsError) as e:
    raise errors.DataError(f"conversion failed, nothing written: {e}") from None
  print(
    f"wrote {summary['workdir']}: {summary['params']:,} parameters from "
    f"{summary['source_tensors']} checkpoint tensors"
  )
  for name in summary["ignored"]:
    print(f"  ignored (--ignore): {name}")


HELP_FLAGS = ("--help", "-help", "-h", "-?", "--helpshort", "--helpfull")


def parse_flags(argv):
  """The package's one parser of a `--config` command (hyperbolic_vl.command_line)."""
  return command_line.parse_flags(
    argv,
    FLAGS,
    example="python -m hyperbolic_vl.convert --pretrained=meru_vit_l --workdir=runs/meru_vit_l",
  )


def run(argv: list[str]) -> None:
  """app.run(main), but asked for help (which absl prints, then exits 1)
  the command exits 0."""
  try:
    app.run(main, argv=argv, flags_parser=parse_flags)
  except SystemExit as stop:
    if stop.code == 1 and any(arg in HELP_FLAGS for arg in argv[1:]):
      sys.exit(0)
    raise


if __name__ == "__main__":
  run(sys.argv)
