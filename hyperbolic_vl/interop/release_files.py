"""A released model's file, fetched and checked (`pretrained.py` names,
converts and caches the releases; this module gets their files).

`download` gives the checked file, fetching it if absent. Any address but a
Hugging Face one is downloaded here with the standard library (urllib) into
`<file>.part`, renamed once its size and SHA-256 are right (the table's,
else the server's Content-Length, with the SHA-256 printed so that a user
can pin it); an interrupted download keeps its `.part`, and the next call
continues it with an HTTP Range request instead of starting over. Every
failure a user meets (no network, a wrong checksum, a full disk, an
interrupted download) is a `PretrainedError`: one line.

Hugging Face files (an entry's `hub`) go through the hub's own client,
`huggingface_hub.hf_hub_download` (the `interop` extra), into the hub's
cache ($HF_HUB_CACHE), so that a file is shared with every other user of
the hub on the machine and `HF_ENDPOINT`, `HF_HUB_OFFLINE` and `HF_TOKEN`
work as the hub documents; the hub resumes a connection cut mid-file within
a call, and removes its partial file when a call fails.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import http.client
import logging
import os
import pathlib
import re
import sys
import time
import urllib.error
import urllib.request

from hyperbolic_vl import errors
from hyperbolic_vl.interop import releases

CHUNK = 1 << 20
TIMEOUT_S = 60
# Connections tried per call; a connection cut mid-file is resumed from the
# byte it reached (Range), so only a server that keeps failing ends a call.
ATTEMPTS = 3


class PretrainedError(errors.UserError, ValueError):
  """A release that cannot be fetched or used, said in one line."""


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


def no_space(e: OSError) -> bool:
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
    note = releases.RELEASES[name].note if name in releases.RELEASES else ""
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
    check_writable(cache, "the hub's cache", "set HF_HUB_CACHE (or HF_HOME)")
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
    if no_space(e):
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
    if isinstance(e, OSError) and no_space(e):
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


def check_writable(
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
