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

(a Hugging Face file is in the hub's cache instead, below).

Nothing incomplete is ever under a final name: the file is downloaded to
`.part` and renamed once its size and checksum are right; the run is
converted in a sibling temporary folder and renamed. Errors a user meets
(no network, a wrong checksum, a full disk, an interrupted download, an
unknown name) are `PretrainedError`s: one line, and the cache as it was,
except that an interrupted download keeps its `.part` so that the next call
continues it (HTTP Range) instead of starting over.

Hugging Face files (an entry's `hub`) are the exception: they go through
the hub's own client, `huggingface_hub.hf_hub_download` (the `interop`
extra), into the hub's cache ($HF_HUB_CACHE), so that a file is shared
with every other user of the hub on the machine and `HF_ENDPOINT`,
`HF_HUB_OFFLINE` and `HF_TOKEN` work as the hub documents; the hub resumes
a connection cut mid-file within a call, and removes its partial file when
a call fails. Other addresses are downloaded here with the standard
library (urllib).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import hashlib
import http.client
import logging
import os
import pathlib
import re
import shutil
import sys
import tempfile
import time
import urllib.error
import urllib.request

from hyperbolic_vl import command_line, errors
from hyperbolic_vl.interop import releases

CACHE_SUBDIR = "releases"
RUN_DIR = "run"
CHUNK = 1 << 20
TIMEOUT_S = 60
# Connections tried per call; a connection cut mid-file is resumed from the
# byte it reached (Range), so only a server that keeps failing ends a call.
ATTEMPTS = 3


class PretrainedError(errors.UserError, ValueError):
  """A release that cannot be fetched or used, said in one line."""


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


def address(download: releases.Download) -> str | None:
  """The file's address; a Hugging Face file through $HF_ENDPOINT when set."""
  endpoint = os.environ.get("HF_ENDPOINT")
  if download.hub and endpoint:
    repository, filename = download.hub
    return f"{endpoint.rstrip('/')}/{repository}/resolve/main/{filename}"
  return download.url


def offline_hint(name: str) -> str:
  return (
    f"on a machine without network, download it elsewhere and run "
    f"python -m hyperbolic_vl.convert --pretrained={name} --checkpoint=FILE"
  )


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


# -- downloading -------------------------------------------------------------
class _Progress:
  """One self-rewriting line on stderr: percent, MiB done / total, rate."""

  def __init__(self, label: str, total: int | None, done: int, stream=None):
    self.label, self.total, self.stream = label, total, stream or sys.stderr
    self.start, self.start_bytes, self.last = time.monotonic(), done, -1.0
    self.update(done)

  def update(self, done: int, final: bool = False) -> None:
    now = time.monotonic()
    if not final and now - self.last < 0.2:
      return
    self.last = now
    rate = (done - self.start_bytes) / max(now - self.start, 1e-6) / 2**20
    if self.total:
      text = f"{100 * done // self.total:3d}% {done / 2**20:.1f}/{self.total / 2**20:.1f} MiB"
    else:
      text = f"{done / 2**20:.1f} MiB"
    self.stream.write(f"\r{self.label}: {text} {rate:.1f} MiB/s")
    if final:
      self.stream.write("\n")
    self.stream.flush()


def _open(url: str, offset: int, name: str):
  """(response, offset it starts at): a Range request from `offset`; a
  server that answers with the whole file restarts the count at 0.
  Response None: the server refused the range (416)."""
  headers = {"User-Agent": "hyperbolic_vl"}
  if offset:
    headers["Range"] = f"bytes={offset}-"
  try:
    response = urllib.request.urlopen(
      urllib.request.Request(url, headers=headers), timeout=TIMEOUT_S
    )
  except urllib.error.HTTPError as e:
    if e.code == 416 and offset:  # the partial file is no prefix of this one
      return None, 0
    raise PretrainedError(
      f"cannot download {name}: HTTP {e.code} {e.reason} from {url}; {offline_hint(name)}"
    ) from None
  except (urllib.error.URLError, OSError) as e:
    reason = getattr(e, "reason", e)
    raise PretrainedError(
      f"cannot download {name}: {url} is unreachable ({reason}); {offline_hint(name)}"
    ) from None
  if offset and response.status != 206:
    return response, 0
  return response, offset


def _total_size(response, offset: int) -> int | None:
  content_range = response.headers.get("Content-Range", "")
  if "/" in content_range and content_range.rsplit("/", 1)[1].isdigit():
    return int(content_range.rsplit("/", 1)[1])
  length = response.headers.get("Content-Length")
  return offset + int(length) if length and length.isdigit() else None


def _sha256_of(path: pathlib.Path, hasher=None):
  hasher = hasher or hashlib.sha256()
  with open(path, "rb") as f:
    while block := f.read(CHUNK):
      hasher.update(block)
  return hasher


def _no_space(e: OSError) -> bool:
  return e.errno in (errno.ENOSPC, errno.EDQUOT)


def download(
  download: releases.Download, directory: pathlib.Path, name: str, *, progress=None
) -> pathlib.Path:
  """The checked file, downloaded (or resumed) if absent: a Hugging Face
  file through the hub's client into the hub's cache (`_hub_download`),
  any other address here into `directory`, checked against the table's
  size and SHA-256, else the server's Content-Length."""
  if download.hub:
    return _hub_download(download, name)
  target = directory / download.filename
  if target.is_file():
    return target
  url = address(download)
  if url is None:
    note = release(name).note if name in releases.RELEASES else ""
    raise PretrainedError(
      f"{name}: the release gives no download address ({note}): "
      f"python -m hyperbolic_vl.convert --pretrained={name} --checkpoint=FILE"
    )
  part = directory / (download.filename + ".part")
  offset = part.stat().st_size if part.is_file() else 0
  expected = dict(size=download.size, sha256=download.sha256, whose="the release's")
  total, reason = download.size, ""
  for _ in range(ATTEMPTS):
    response, start = _open(url, offset, name)
    if response is None:  # 416: start over
      part.unlink()
      offset = 0
      response, start = _open(url, 0, name)
    with response:
      served = _total_size(response, start)
      if expected["size"] is not None and served is not None and served != expected["size"]:
        raise PretrainedError(
          f"cannot download {name}: {url} serves {served:,} bytes, {expected['whose']} file "
          f"has {expected['size']:,}; {offline_hint(name)}"
        )
      total = served if served is not None else total
      offset, reason = _receive(response, part, start, total, download.filename, progress)
    if total is not None and offset >= total:
      break
    if total is None and not reason:
      break
  else:
    raise PretrainedError(
      f"download of {name} interrupted at {offset:,} of {total or 0:,} bytes ({reason}); "
      f"run the same command again to resume from {part}"
    )
  _check(part, download.filename, name, url, **expected)
  os.replace(part, target)
  return target


# -- Hugging Face files, through the hub's own client -------------------------
# The hub's log lines held back while it downloads (its retries and resumes
# say themselves in several lines; the caller reports one); HF_HUB_VERBOSITY
# set by the user leaves them as asked.
HUB_LOGGER = "huggingface_hub"
HUB_TRUE = ("1", "on", "yes", "true")  # the values huggingface_hub reads as set


@contextlib.contextmanager
def _hub_logs_held():
  """The hub's logger at CRITICAL for the length of the block, its level
  put back after (the process as it was found)."""
  logger = logging.getLogger(HUB_LOGGER)
  level = logger.level
  if not os.environ.get("HF_HUB_VERBOSITY"):
    logger.setLevel(logging.CRITICAL)
  try:
    yield
  finally:
    logger.setLevel(level)


def _hub_failure(e: BaseException, url: str, offline: bool) -> str:
  """Why a hub call failed, in a few words: not cached while offline, the
  HTTP status when the server answered, an answer that is no hub's (a
  wrong HF_ENDPOINT), else the connection's error."""
  from huggingface_hub import errors as hub_errors

  if offline and isinstance(e, hub_errors.LocalEntryNotFoundError):
    return "it is not in the hub's cache and HF_HUB_OFFLINE is set"
  cause = e.__cause__ if isinstance(e, hub_errors.LocalEntryNotFoundError) and e.__cause__ else e
  if isinstance(cause, hub_errors.HfHubHTTPError) and cause.response is not None:
    return f"HTTP {cause.response.status_code} from {url}"
  if isinstance(cause, hub_errors.FileMetadataError):
    return f"{url} answers as no Hugging Face Hub does (FileMetadataError); check HF_ENDPOINT"
  said = str(cause).strip().splitlines()
  return f"{url} is unreachable ({type(cause).__name__}{': ' + said[0] if said else ''})"


def _hub_download(download: releases.Download, name: str) -> pathlib.Path:
  """A Hugging Face file through the hub's own client, `hf_hub_download`:
  its cache ($HF_HUB_CACHE, else $HF_HOME/hub), its resume of a connection
  cut mid-file, its etag, `HF_ENDPOINT` and `HF_HUB_OFFLINE` (the three read
  at each call, not only when the hub is imported). The file is checked
  against the table's size and SHA-256 where it gives them, and against the
  SHA-256 that names an LFS file's blob in the hub's cache (its etag)."""
  try:
    import httpx2  # huggingface_hub's HTTP client
    from huggingface_hub import (
      constants,
      get_hf_file_metadata,
      hf_hub_download,
      hf_hub_url,
      try_to_load_from_cache,
    )
    from huggingface_hub import errors as hub_errors
  except ImportError:
    raise PretrainedError(
      f"downloading {name} from the Hugging Face Hub needs huggingface_hub: pip install "
      f"'hyperbolic_vl[interop]'; or {offline_hint(name).removeprefix('on a machine without network, ')}"
    ) from None

  repository, filename = download.hub
  url = address(download)
  endpoint = os.environ.get("HF_ENDPOINT") or None
  cache = pathlib.Path(os.environ.get("HF_HUB_CACHE") or constants.HF_HUB_CACHE).expanduser()
  offline = os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in HUB_TRUE
  if not offline:
    _check_writable(cache, "the hub's cache", "set HF_HUB_CACHE (or HF_HOME)")
  try:
    with _hub_logs_held():
      if not offline and not isinstance(try_to_load_from_cache(repository, filename, cache), str):
        # Not cached: one HEAD, not retried. Finding no copy and no answer,
        # hf_hub_download retries with backoff for ~23 s (no setting
        # shortens it); a machine without network gets its line at once.
        get_hf_file_metadata(hf_hub_url(repository, filename, endpoint=endpoint), endpoint=endpoint)
      path = pathlib.Path(
        hf_hub_download(
          repository,
          filename,
          endpoint=endpoint,
          cache_dir=cache,
          local_files_only=offline,
        )
      )
  except (
    hub_errors.LocalEntryNotFoundError,
    hub_errors.HfHubHTTPError,
    hub_errors.FileMetadataError,
    httpx2.TransportError,
  ) as e:
    raise PretrainedError(
      f"cannot download {name}: {_hub_failure(e, url, offline)}; {offline_hint(name)}"
    ) from None
  except OSError as e:
    # The hub removes its partial file on any failure (its resume is within
    # a call), so a failed call keeps nothing.
    if _no_space(e):
      raise PretrainedError(
        f"no space left on the device downloading {name} into the hub's cache {cache}; free "
        "space or move it (HF_HUB_CACHE); nothing was kept"
      ) from None
    said = str(e).strip().splitlines()
    raise PretrainedError(
      f"cannot download {name} into the hub's cache {cache}: {type(e).__name__}"
      f"{': ' + said[0] if said else ''}"
    ) from None
  _check_hub_file(path, download, name, url)
  return path


def _check_hub_file(path: pathlib.Path, download: releases.Download, name: str, url: str) -> None:
  """The release's size and SHA-256, then the hub's (the blob's name, when
  it is a SHA-256: an LFS file's); a file that fails is removed from the
  hub's cache, blob and snapshot link."""
  blob = path.resolve()
  hub_sha256 = blob.name if re.fullmatch(r"[0-9a-f]{64}", blob.name) else None
  for sha256, size, whose in (
    (download.sha256, download.size, "the release's"),
    (hub_sha256, None, "the hub's"),
  ):
    if sha256 is None and size is None:
      continue
    try:
      _check(blob, download.filename, name, url, size=size, sha256=sha256, whose=whose)
    except PretrainedError:
      path.unlink(missing_ok=True)  # the snapshot's link to the removed blob
      raise


def _receive(response, part: pathlib.Path, start: int, total, label: str, progress):
  """Appends the response's body to `part` from byte `start`: (bytes the
  file now holds, why the body ended early or "")."""
  done, reason = start, ""
  bar = _Progress(label, total, done, progress)
  try:
    part.parent.mkdir(parents=True, exist_ok=True)
    with open(part, "r+b" if start and part.exists() else "wb") as f:
      f.seek(start)
      f.truncate()
      while True:
        try:
          block = response.read(CHUNK)
        except (TimeoutError, http.client.IncompleteRead, OSError) as e:
          reason = f"{type(e).__name__}: connection closed" if not str(e) else str(e)
          break
        if not block:
          break
        f.write(block)
        done += len(block)
        bar.update(done)
  except BaseException as e:
    bar.update(done, final=True)  # the error's line (or a traceback) starts on a line of its own
    if isinstance(e, OSError) and _no_space(e):
      part.unlink(missing_ok=True)
      raise PretrainedError(
        f"no space left on the device writing {part} ({done:,} of {total or 0:,} bytes); "
        "free space or move the cache (HYPERBOLIC_VL_CACHE or --cache_dir); nothing was kept"
      ) from None
    raise
  bar.update(done, final=True)
  if total is not None and done < total and not reason:
    reason = "connection closed early"
  return done, reason


def _check(path: pathlib.Path, filename: str, name: str, url: str, *, size, sha256, whose) -> None:
  """Size and SHA-256 against `whose` where known; a file that fails is
  removed. Prints the SHA-256 where nobody gives one."""
  got = path.stat().st_size
  if size is not None and got != size:
    path.unlink()
    raise PretrainedError(
      f"{name}: downloaded {got:,} bytes, {whose} file has {size:,}; "
      "the download was removed, run again to fetch it afresh"
    )
  digest = _sha256_of(path).hexdigest()
  if sha256 is None:
    print(f"{filename}: sha256 {digest} ({got:,} bytes)", file=sys.stderr)
    return
  if digest != sha256:
    path.unlink()
    raise PretrainedError(
      f"{name}: checksum mismatch for {url}: sha256 {digest}, {whose} is {sha256}; "
      "the download was removed, run again to fetch it afresh"
    )


def check_given_file(path: str, download: releases.Download, name: str) -> None:
  """A --checkpoint=FILE for a release: its size and SHA-256 where known."""
  if not os.path.isfile(path):
    raise PretrainedError(f"{name}: --checkpoint={path} does not exist")
  size = os.path.getsize(path)
  if download.size is not None and size != download.size:
    raise PretrainedError(
      f"{name}: {path} has {size:,} bytes, the release's file {download.size:,}"
    )
  if download.sha256 is not None:
    digest = _sha256_of(pathlib.Path(path)).hexdigest()
    if digest != download.sha256:
      raise PretrainedError(
        f"{name}: {path} has sha256 {digest}, the release's file {download.sha256}"
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
    if _no_space(e):
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
    _check_writable(folder)
    if checkpoint:
      check_given_file(checkpoint, entry.weights, name)
      weights = pathlib.Path(checkpoint)
    else:
      weights = download(entry.weights, folder, name, progress=progress)
    bounds = download(entry.bounds, folder, name, progress=progress) if entry.bounds else None
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


def _check_writable(
  folder: pathlib.Path,
  what: str = "the releases cache",
  remedy: str = "set HYPERBOLIC_VL_CACHE or --cache_dir",
) -> None:
  """Refuses, before anything is downloaded, a cache that cannot be written:
  its nearest existing folder is a file, or is not writable."""
  existing = next(path for path in [folder, *folder.parents] if path.exists())
  if not existing.is_dir():
    reason = f"{existing} is a file"
  elif not os.access(existing, os.W_OK | os.X_OK):
    reason = f"{existing} is not writable"
  else:
    return
  raise PretrainedError(
    f"cannot write {what} {folder} ({reason}); {remedy} to a folder you can write"
  )


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
