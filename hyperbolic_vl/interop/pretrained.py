"""Released models by name: download, check, convert and cache.

    hyperbolic_vl.load("meru_vit_l")
    python -m hyperbolic_vl.convert --pretrained=meru_vit_l [--workdir=DIR]

`ensure_run(NAME)` looks the name up in `releases.RELEASES`, downloads its
file into the cache, checks it, converts it with the entry's `--source` and
config, and returns the converted run directory; a second call finds the
run in the cache and downloads nothing.

The cache is `$HYPERBOLIC_VL_CACHE/releases` (`~/.cache/hyperbolic_vl/
releases` by default; the tokenizer cache's variable, data/tokenizer.py),
or the folder `cache_dir` / `--cache_dir` names:

    <cache>/<name>/<file>        the released file, once complete and checked
    <cache>/<name>/<file>.part   a download in progress (resumed by the next call)
    <cache>/<name>/run/          the converted run (config.json + checkpoints)

(a Hugging Face file is in the hub's own cache instead: `release_files.py`
fetches and checks the files).

Nothing incomplete is ever under a final name: the file is downloaded to
`.part` and renamed once its size and checksum are right; the run is
converted in a sibling temporary folder and renamed. Errors a user meets
(no network, a wrong checksum, a full disk, an interrupted download, an
unknown name) are `PretrainedError`s: one line, and the cache as it was,
except that an interrupted download keeps its `.part` so that the next call
continues it (HTTP Range) instead of starting over.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import re
import shutil
import sys
import tempfile

from hyperbolic_vl import command_line
from hyperbolic_vl.interop import release_files, releases
from hyperbolic_vl.interop.release_files import PretrainedError

CACHE_SUBDIR = "releases"
RUN_DIR = "run"


class UnknownRelease(PretrainedError, LookupError):
  """A name the release table does not hold."""


class NotACheckpoint(PretrainedError):
  """A file that is no checkpoint (conversion cannot read it at all)."""


def cache_root(cache_dir: str | os.PathLike | None = None) -> pathlib.Path:
  """The releases cache: `cache_dir`, else $HYPERBOLIC_VL_CACHE/releases."""
  if cache_dir:
    return pathlib.Path(cache_dir).expanduser()
  from hyperbolic_vl.data import tokenizer

  return tokenizer.default_cache_dir() / CACHE_SUBDIR


def release(name: str) -> releases.Release:
  try:
    return releases.RELEASES[name]
  except KeyError:
    raise UnknownRelease(
      f"no released model named {name!r}; valid names: {', '.join(sorted(releases.RELEASES))}"
    ) from None


# -- the list ------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class ReleasedModel:
  """One name `hyperbolic_vl.load(NAME)` takes, as `list_pretrained` gives it."""

  name: str
  title: str
  paper: str  # "" where the release cites none
  size: str  # the image tower, "ViT-L/16"
  where_from: str  # the download address, or how to get the file by hand
  license: str


def _where_from(entry: releases.Release) -> str:
  if entry.weights.hub:
    repository, filename = entry.weights.hub
    return f"Hugging Face {repository} ({filename})"
  if entry.weights.url:
    return entry.weights.url
  return "no download address: fetch it by hand, then --checkpoint=FILE (its note says where)"


def list_pretrained() -> list[ReleasedModel]:
  """Every released model by name, in the table's order."""
  return [
    ReleasedModel(
      name=entry.name,
      title=entry.title,
      paper=entry.paper,
      size=re.search(r"ViT-[SBLH]/\d+", entry.title)[0],
      where_from=_where_from(entry),
      license=entry.license,
    )
    for entry in releases.RELEASES.values()
  ]


def format_list(models: list[ReleasedModel]) -> str:
  """The list as `convert --list` prints it: one model a line."""
  width = max(len(model.name) for model in models)
  return "\n".join(
    f"{model.name:<{width}}  {model.size:<8}  {model.paper or '(no paper)'}  <- {model.where_from}"
    for model in models
  )


# -- converting ---------------------------------------------------------------
def release_config(entry: releases.Release):
  """The entry's target config (configs/<file>.py:<variant>), overrides applied."""
  import importlib

  path, _, variant = entry.config.partition(":")
  module = importlib.import_module("configs." + pathlib.Path(path).stem)
  config = module.get_config(variant) if variant else module.get_config()
  return command_line.apply_overrides(config, entry.overrides)


def convert(entry: releases.Release, checkpoint, workdir, *, bounds=None) -> dict:
  """Converts into `workdir` whole or not at all: the run (and HySAC's
  bounds file) is written in a sibling temporary folder, then renamed."""
  from hyperbolic_vl.interop import common
  from hyperbolic_vl.interop import workdir as interop_workdir

  workdir = pathlib.Path(workdir).absolute()
  if workdir.exists() and any(workdir.iterdir()):
    raise PretrainedError(f"{workdir} exists and is not empty; choose a new --workdir")
  workdir.parent.mkdir(parents=True, exist_ok=True)
  staging = pathlib.Path(tempfile.mkdtemp(prefix=f".{workdir.name}.", dir=workdir.parent))
  try:
    summary = interop_workdir.convert_checkpoint(
      entry.source,
      str(checkpoint),
      release_config(entry),
      str(staging / RUN_DIR),
      bounds=str(bounds) if bounds else "",
    )
    if workdir.exists():
      workdir.rmdir()  # empty, checked above
    os.rename(staging / RUN_DIR, workdir)
  except common.UnreadableCheckpoint as e:
    raise NotACheckpoint(f"{entry.name}: {e}") from None
  except common.ConversionError as e:
    raise PretrainedError(f"{entry.name}: conversion failed, nothing written: {e}") from None
  except OSError as e:
    if release_files.no_space(e):
      raise PretrainedError(
        f"no space left on the device converting {entry.name} in {workdir.parent}; free space "
        "or move the cache (HYPERBOLIC_VL_CACHE or --cache_dir); nothing was kept"
      ) from None
    raise
  finally:
    shutil.rmtree(staging, ignore_errors=True)
  summary["workdir"] = str(workdir)
  return summary


def ensure_run(
  name: str,
  *,
  workdir: str | os.PathLike | None = None,
  cache_dir: str | os.PathLike | None = None,
  checkpoint: str | None = None,
  progress=None,
) -> pathlib.Path:
  """The converted run of release `name`: from the cache when there (nothing
  downloaded), else downloaded (or `checkpoint`, a file the user fetched),
  checked and converted into `workdir` (default: the cache's)."""
  entry = release(name)
  folder = cache_root(cache_dir) / name
  run = pathlib.Path(workdir) if workdir else folder / RUN_DIR
  if workdir is None and (run / "config.json").is_file():
    return run
  # The folders this call may create, removed again (when empty) if it fails.
  new_folders = _missing_folders(folder) + (_missing_folders(run.parent) if workdir else [])
  try:
    release_files.check_writable(folder)
    if checkpoint:
      release_files.check_given_file(checkpoint, entry.weights, name)
      weights = pathlib.Path(checkpoint)
    else:
      weights = release_files.download(entry.weights, folder, name, progress=progress)
    bounds = (
      release_files.download(entry.bounds, folder, name, progress=progress)
      if entry.bounds
      else None
    )
    try:
      summary = convert(entry, weights, run, bounds=bounds)
    except NotACheckpoint as e:
      if checkpoint:
        raise
      # Removed (a hub file: its blob and link), so that the next call
      # fetches it afresh instead of failing the same way.
      blob = weights.resolve()
      blob.unlink(missing_ok=True)
      weights.unlink(missing_ok=True)
      raise NotACheckpoint(
        f"{e}; the download {weights} is no checkpoint and was removed, run again to fetch "
        "it afresh"
      ) from None
  except PretrainedError:
    for path in sorted(new_folders, key=lambda p: len(p.parts), reverse=True):
      if path.is_dir() and not any(path.iterdir()):
        path.rmdir()
    raise
  print(
    f"{name}: {summary['params']:,} parameters from {summary['source_tensors']} checkpoint "
    f"tensors -> {run}",
    file=sys.stderr,
  )
  return run


def _missing_folders(folder: pathlib.Path) -> list[pathlib.Path]:
  """The folders above and including `folder` that do not exist yet,
  outermost first."""
  missing = []
  for path in [folder, *folder.parents]:
    if path.exists():
      break
    missing.append(path)
  return missing[::-1]


def resolve_workdir(workdir_or_name: str | os.PathLike, **options) -> str:
  """What `hyperbolic_vl.load` reads: an existing folder as it is, else a
  name of the release table (downloaded and converted on first use)."""
  path = os.fspath(workdir_or_name)
  if os.path.isdir(path) or os.sep in path:
    return path
  if path in releases.RELEASES:
    return str(ensure_run(path, **options))
  raise UnknownRelease(
    f"{path!r} is neither a run directory nor a released model; released models: "
    f"{', '.join(sorted(releases.RELEASES))}"
  )
