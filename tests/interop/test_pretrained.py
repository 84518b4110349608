"""Released models by name (interop/pretrained.py, interop/releases.py),
with no outside network: a server on 127.0.0.1 started here serves
release-format files written here (MERU's layout with random weights, the
2-layer reference of test_interop.py), and the table's entries for these
tests point at it (monkeypatch.setitem on releases.RELEASES).

One conversion, shared by the module: `hyperbolic_vl.load("meru_vit_s")`
downloads (progress bar), converts and caches; the later tests read that
cache. The error cases use small files of random bytes, which fail (or are
checked) before any conversion.
"""

import contextlib
import dataclasses
import errno
import hashlib
import http.server
import io
import logging
import os
import pathlib
import re
import subprocess
import sys
import threading

import interactive
import numpy as np
import pytest
from paths import REPO

torch = pytest.importorskip("torch")
pytest.importorskip("timm")

import test_interop as refs  # noqa: E402

import hyperbolic_vl  # noqa: E402
from hyperbolic_vl.interop import common, pretrained, release_files, releases, workdir  # noqa: E402
from hyperbolic_vl.runs import loading  # noqa: E402

# The 2-layer MERU reference's sizes (as test_release_table.py shrinks them).
OVERRIDES = (
  "input.image_size=32",
  "input.tokenizer.context_length=16",
  "model.text_variant=mu",
  "model.image_variant=mu/8",
  "model.image_num_heads=4",
  "model.embed_dim=32",
)


class ReleaseServer:
  """http.server in a thread: GET with byte ranges; `cuts[path] = [at, n]`
  ends the next n responses for `path` after byte `at` (the connection
  closes mid-file); `redirects` answers a path with a 302 and headers (a
  Hugging Face `resolve` address); `requests` logs (path, Range header)."""

  def __init__(self, files: dict[str, bytes], redirects=None):
    self.files, self.cuts, self.requests = dict(files), {}, []
    self.redirects = dict(redirects or {})  # path -> (location, extra headers)
    server = self

    class Handler(http.server.BaseHTTPRequestHandler):
      def redirect(self) -> bool:
        if self.path not in server.redirects:
          return False
        location, headers = server.redirects[self.path]
        self.send_response(302)
        # Another host name for the same server, as the hub's CDN is one:
        # the hub's client takes the file's facts from this answer.
        self.send_header("Location", server.url(location).replace("127.0.0.1", "localhost"))
        for key, value in headers.items():
          self.send_header(key, value)
        self.end_headers()
        return True

      def do_HEAD(self):  # noqa: N802 (the hub's client asks a file's facts first)
        server.requests.append(("HEAD " + self.path, None))
        if not self.redirect():
          self.send_error(404)

      def do_GET(self):  # noqa: N802 (http.server's name)
        server.requests.append((self.path, self.headers.get("Range")))
        if self.redirect():
          return
        body = server.files.get(self.path)
        if body is None:
          self.send_error(404)
          return
        start = 0
        match = re.fullmatch(r"bytes=(\d+)-", self.headers.get("Range") or "")
        if match:
          start = int(match[1])
          if start >= len(body):
            self.send_error(416)
            return
          self.send_response(206)
          self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
        else:
          self.send_response(200)
        self.send_header("Content-Length", str(len(body) - start))
        self.end_headers()
        end = len(body)
        cut = server.cuts.get(self.path)
        if cut and cut[1] > 0:
          cut[1] -= 1
          end = max(cut[0], start)
        self.wfile.write(body[start:end])

      def log_message(self, *args):
        pass

    self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    self.thread = threading.Thread(
      target=self.httpd.serve_forever, kwargs=dict(poll_interval=0.05), daemon=True
    )
    self.thread.start()

  def url(self, path: str) -> str:
    return f"http://127.0.0.1:{self.httpd.server_port}{path}"

  def stop(self) -> None:
    self.httpd.shutdown()
    self.httpd.server_close()


def closed_port() -> int:
  """A port nothing listens on (bound, then released)."""
  import socket

  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def listing(root) -> list[str]:
  """Every file and folder under `root`, relative, sorted."""
  if not os.path.isdir(root):
    return []
  return sorted(
    os.path.relpath(os.path.join(d, n), root) for d, ds, fs in os.walk(root) for n in ds + fs
  )


def meru_entry(url: str, sha256: str | None, size: int | None = None) -> releases.Release:
  """The real meru_vit_s entry at `url`, shrunk to the reference's sizes."""
  real = releases.RELEASES["meru_vit_s"]
  return dataclasses.replace(
    real,
    weights=dataclasses.replace(real.weights, url=url, sha256=sha256, size=size),
    overrides=OVERRIDES,
  )


def release_file(folder):
  """(reference module, its MERU-format file, the file's bytes)."""
  torch.manual_seed(0)
  reference = refs.MeruReference(
    width=64, depth=2, heads=4, mlp_ratio=2, patch=8, embed_dim=32, vocab=49408, hyperbolic=True
  ).eval()
  file = folder / "meru_vit_s.pth"
  torch.save({"model": reference.state_dict(), "optimizer": {}}, file)
  return reference, file, file.read_bytes()


@pytest.fixture(scope="module")
def release(tmp_path_factory):
  """The release file, the server, and the cache after the first use of
  the name (what `hyperbolic_vl.load("meru_vit_s")` runs before building
  the model: pretrained.resolve_workdir), stderr captured."""
  folder = tmp_path_factory.mktemp("release")
  reference, file, data = release_file(folder)
  server = ReleaseServer({"/meru/meru_vit_s.pth": data})
  cache = folder / "cache"
  entry = meru_entry(
    server.url("/meru/meru_vit_s.pth"), hashlib.sha256(data).hexdigest(), len(data)
  )
  stderr = io.StringIO()
  with pytest.MonkeyPatch.context() as patch:  # undone before the module's tests run
    patch.setenv("HYPERBOLIC_VL_CACHE", str(cache))
    patch.setitem(releases.RELEASES, "meru_vit_s", entry)
    with contextlib.redirect_stderr(stderr):
      run = pretrained.resolve_workdir("meru_vit_s")
  yield dict(
    reference=reference,
    file=file,
    data=data,
    server=server,
    entry=entry,
    cache=cache / "releases",
    run=run,
    stderr=stderr.getvalue(),
    requests=list(server.requests),
  )
  server.stop()


def test_first_use_downloads_with_progress_converts_and_caches(release):
  data, cache = release["data"], release["cache"]
  assert release["requests"] == [("/meru/meru_vit_s.pth", None)]  # one plain GET
  # The progress line reaches 100% of the file's size.
  assert re.search(rf"meru_vit_s\.pth: 100% .*/{len(data) / 2**20:.1f} MiB", release["stderr"])
  assert (cache / "meru_vit_s" / "meru_vit_s.pth").read_bytes() == data
  assert sorted(os.listdir(cache / "meru_vit_s")) == ["meru_vit_s.pth", "run"]
  assert sorted(os.listdir(cache / "meru_vit_s" / "run")) == ["checkpoints", "config.json"]
  assert os.listdir(cache) == ["meru_vit_s"]  # no staging folder left
  assert release["run"] == str(cache / "meru_vit_s" / "run")


def test_converted_run_is_the_converters(release):
  """The cached run holds what the documented converter makes of the same
  file and config: the same config, every param bit for bit (restored onto
  the abstract model: no initialisation compiled)."""
  config = workdir.release_config(pretrained.release_config(release["entry"]))
  params, ignored = workdir.convert_state_dict(
    "meru", common.load_state_dict(str(release["file"])), config
  )
  run_config = loading.load_run_config(release["run"])
  abstract, _ = workdir.target_param_shapes(run_config)
  run_params = loading._restore_part(release["run"], run_config, "params", abstract, None)
  assert ignored == [] and run_config.model.to_json() == config.model.to_json()
  assert run_config.input.tokenizer.name == "clip_bpe"
  ours, theirs = common.flatten(run_params), common.flatten(params)
  assert sorted(ours) == sorted(theirs)
  for name in theirs:
    np.testing.assert_array_equal(np.asarray(ours[name]), np.asarray(theirs[name]), err_msg=name)


def test_second_use_reads_the_cache_with_the_server_stopped(release, monkeypatch):
  release["server"].stop()
  monkeypatch.setenv("HYPERBOLIC_VL_CACHE", str(release["cache"].parent))
  monkeypatch.setitem(releases.RELEASES, "meru_vit_s", meru_entry("http://127.0.0.1:9/x", None))
  before = listing(release["cache"])
  assert pretrained.resolve_workdir("meru_vit_s") == release["run"]
  assert listing(release["cache"]) == before
  assert len(release["server"].requests) == 1  # nothing fetched


@pytest.mark.slow  # builds and compiles the model twice; the tests above cover each step
def test_load_by_name_end_to_end(tmp_path, monkeypatch):
  """The acceptance path: `hyperbolic_vl.load("meru_vit_s")` against the
  server downloads (progress bar), converts, caches and embeds as the
  PyTorch release (test_interop.py's bound: float32 towers of depth 2, ~1e-6
  seen, 1e-4 allowed); with the server stopped a second call loads the cache."""
  reference, _, data = release_file(tmp_path)
  server = ReleaseServer({"/meru_vit_s.pth": data})
  monkeypatch.setenv("HYPERBOLIC_VL_CACHE", str(tmp_path / "cache"))
  entry = meru_entry(server.url("/meru_vit_s.pth"), hashlib.sha256(data).hexdigest())
  monkeypatch.setitem(releases.RELEASES, "meru_vit_s", entry)
  stderr = io.StringIO()
  with contextlib.redirect_stderr(stderr):
    model = hyperbolic_vl.load("meru_vit_s")
  server.stop()
  assert "meru_vit_s.pth: 100%" in stderr.getvalue()
  image_error, text_error = refs.compare(
    model, reference, refs.images("generated"), refs.token_ids()
  )
  assert image_error < refs.RELATIVE_TOLERANCE and text_error < refs.RELATIVE_TOLERANCE
  again = hyperbolic_vl.load("meru_vit_s")
  assert again.workdir == model.workdir and len(server.requests) == 1
  np.testing.assert_array_equal(
    again.encode_tokens(refs.token_ids()), model.encode_tokens(refs.token_ids())
  )


# -- downloads and their error lines (random bytes, no conversion) ---------------
PAYLOAD = np.random.default_rng(0).bytes(300_000)


@pytest.fixture
def server():
  served = ReleaseServer({"/f.pth": PAYLOAD})
  yield served
  served.stop()


def fetch(url, directory, sha256=None, size=None, name="test_release", progress=None):
  download = releases.Download("f.pth", url, size=size, sha256=sha256)
  return release_files.download(download, directory, name, progress=progress or io.StringIO())


def assert_one_line(error):
  text = str(error.value)
  assert "\n" not in text and text, text
  return text


def test_a_cut_connection_is_resumed_with_a_range_request(server, tmp_path):
  server.cuts["/f.pth"] = [100_000, 1]  # the first response stops at byte 100,000
  path = fetch(server.url("/f.pth"), tmp_path, sha256=hashlib.sha256(PAYLOAD).hexdigest())
  assert path.read_bytes() == PAYLOAD
  assert server.requests == [("/f.pth", None), ("/f.pth", "bytes=100000-")]
  assert listing(tmp_path) == ["f.pth"]


def test_an_interrupted_download_is_one_line_and_the_next_call_resumes(
  server, tmp_path, monkeypatch
):
  monkeypatch.setattr(release_files, "ATTEMPTS", 1)
  server.cuts["/f.pth"] = [120_000, 1]
  with pytest.raises(pretrained.PretrainedError) as error:
    fetch(server.url("/f.pth"), tmp_path)
  text = assert_one_line(error)
  assert "interrupted at 120,000 of 300,000 bytes" in text and "run the same command again" in text
  # Only the partial file, under its .part name, which the next call continues.
  assert listing(tmp_path) == ["f.pth.part"]
  path = fetch(server.url("/f.pth"), tmp_path, sha256=hashlib.sha256(PAYLOAD).hexdigest())
  assert path.read_bytes() == PAYLOAD and server.requests[-1] == ("/f.pth", "bytes=120000-")
  assert listing(tmp_path) == ["f.pth"]


UNCHA_RESOLVE = "/hayeonkim/uncha/resolve/main/uncha_vit_s.pth"


def hub_server(payload: bytes, sha256: str) -> ReleaseServer:
  """A stand-in for the hub (HF_ENDPOINT) serving UNCHA's file: its resolve
  address answers as the hub's does, a redirect carrying the commit, the
  stored file's SHA-256 and its size (what huggingface_hub reads), to the
  file on another host name (the hub's CDN)."""
  headers = {
    "X-Repo-Commit": "0" * 40,
    "X-Linked-Etag": f'"{sha256}"',
    "X-Linked-Size": str(len(payload)),
  }
  return ReleaseServer(
    {"/blobs/uncha": payload}, redirects={UNCHA_RESOLVE: ("/blobs/uncha", headers)}
  )


def blobs(hub_cache) -> list[str]:
  """The files the hub's cache holds (its links and refs aside)."""
  return [p for p in listing(hub_cache) if os.sep + "blobs" + os.sep in p]


def fetch_uncha(directory=None):
  weights = releases.RELEASES["uncha_vit_s"].weights
  return release_files.download(weights, directory, "uncha_vit_s", progress=io.StringIO())


# The hub's client asks the resolve address first; a file not yet cached is
# asked for once more before it (ours: a HEAD that is not retried, so that
# no network is one line at once).
HUB_FIRST_DOWNLOAD = [("HEAD " + UNCHA_RESOLVE, None)] * 2


@pytest.mark.parametrize("hub_sha256", ["right", "wrong"])
def test_a_hub_file_is_checked_against_the_hubs_checksum(tmp_path, monkeypatch, hub_sha256):
  """UNCHA's real entry through HF_ENDPOINT, downloaded by huggingface_hub
  into its cache (HF_HUB_CACHE): the resolve address redirects (as the hub
  does) with the file's SHA-256, which names the cache's blob and which the
  file is checked against since the release publishes none."""
  digest = hashlib.sha256(PAYLOAD).hexdigest() if hub_sha256 == "right" else "1" * 64
  served = hub_server(PAYLOAD, digest)
  monkeypatch.setenv("HF_ENDPOINT", served.url(""))
  monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
  try:
    if hub_sha256 == "right":
      path = fetch_uncha(tmp_path / "ours")
      assert path.read_bytes() == PAYLOAD and path.name == "uncha_vit_s.pth"
      assert blobs(tmp_path / "hub") == [f"models--hayeonkim--uncha/blobs/{digest}"]
    else:
      with pytest.raises(pretrained.PretrainedError) as error:
        fetch_uncha(tmp_path / "ours")
      text = assert_one_line(error)
      assert f"the hub's is {'1' * 64}" in text and served.url(UNCHA_RESOLVE) in text
      assert blobs(tmp_path / "hub") == []
  finally:
    served.stop()
  assert served.requests == [*HUB_FIRST_DOWNLOAD, ("/blobs/uncha", None)]
  assert not (tmp_path / "ours").exists()  # the hub's cache only


def test_a_hub_download_cut_midway_is_resumed_quietly_and_then_read_offline(tmp_path, monkeypatch):
  """The hub's client continues a connection cut mid-file with a Range
  request within the call (after its 1 s pause), from the last whole block
  it wrote (its blocks are 10 MiB, hence an 11 MiB file cut at 10.5 MiB),
  its warnings about it held back (one line is all a command prints) and
  its logger's level put back after; then, with the server stopped and
  HF_HUB_OFFLINE set, the file comes from the hub's cache, and a file the
  cache lacks is one line."""
  payload = np.random.default_rng(2).bytes(11 * 2**20)
  served = hub_server(payload, hashlib.sha256(payload).hexdigest())
  served.cuts["/blobs/uncha"] = [21 * 2**19, 1]
  monkeypatch.setenv("HF_ENDPOINT", served.url(""))
  monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
  monkeypatch.delenv("HF_HUB_VERBOSITY", raising=False)  # a user's own would show them
  hub_logger = logging.getLogger("huggingface_hub")
  records = []
  seen = logging.Handler(logging.NOTSET)
  seen.emit = records.append
  monkeypatch.setattr(hub_logger, "level", logging.INFO)  # the user's own setting
  hub_logger.addHandler(seen)
  try:
    path = fetch_uncha()
  finally:
    hub_logger.removeHandler(seen)
    served.stop()
  assert path.read_bytes() == payload
  assert served.requests == [
    *HUB_FIRST_DOWNLOAD,
    ("/blobs/uncha", None),
    ("/blobs/uncha", f"bytes={10 * 2**20}-"),
  ]
  assert records == [] and hub_logger.level == logging.INFO
  monkeypatch.setenv("HF_HUB_OFFLINE", "1")
  assert fetch_uncha() == path and len(served.requests) == 4
  monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty"))
  with pytest.raises(pretrained.PretrainedError) as error:
    fetch_uncha()
  assert assert_one_line(error).startswith(
    "cannot download uncha_vit_s: it is not in the hub's cache and HF_HUB_OFFLINE is set; on a "
    "machine without network, download it elsewhere and run python -m hyperbolic_vl.convert "
    "--pretrained=uncha_vit_s --checkpoint=FILE"
  )


def test_a_hub_download_without_huggingface_hub_is_one_line(monkeypatch):
  monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # what `import` finds uninstalled
  with pytest.raises(pretrained.PretrainedError) as error:
    fetch_uncha()
  assert assert_one_line(error) == (
    "downloading uncha_vit_s from the Hugging Face Hub needs huggingface_hub: pip install "
    "'hyperbolic_vl[interop]'; or download it elsewhere and run python -m "
    "hyperbolic_vl.convert --pretrained=uncha_vit_s --checkpoint=FILE"
  )


def test_an_unwritable_hub_cache_is_one_line_before_any_download(tmp_path, monkeypatch):
  blocker = tmp_path / "not_a_folder"
  blocker.write_text("")
  monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{closed_port()}")
  monkeypatch.setenv("HF_HUB_CACHE", str(blocker / "hub"))
  with pytest.raises(pretrained.PretrainedError) as error:
    fetch_uncha()
  assert assert_one_line(error) == (
    f"cannot write the hub's cache {blocker / 'hub'} ({blocker} is a file); set HF_HUB_CACHE "
    "(or HF_HOME) to a folder you can write"
  )
  assert listing(tmp_path) == ["not_a_folder"]


def test_a_wrong_checksum_is_one_line_and_keeps_nothing(server, tmp_path, monkeypatch):
  cache = tmp_path / "cache"
  monkeypatch.setitem(
    releases.RELEASES, "meru_vit_s", meru_entry(server.url("/f.pth"), "0" * 64, None)
  )
  with pytest.raises(pretrained.PretrainedError) as error:
    pretrained.ensure_run("meru_vit_s", cache_dir=cache, progress=io.StringIO())
  text = assert_one_line(error)
  assert f"sha256 {hashlib.sha256(PAYLOAD).hexdigest()}" in text and "0" * 64 in text
  assert listing(cache) == []  # not even the release's folder


def test_a_download_that_is_no_checkpoint_is_one_line_and_is_removed(server, tmp_path, monkeypatch):
  """Bytes that pass the release's checks but are no torch file (what a
  hub's HTML page or a corrupt upload gives): torch's weights-only reader
  says so across several lines of advice; the user reads one, with its
  reason and that the file was removed (the next call fetches it afresh
  instead of failing the same way), and the cache is as it was: not even
  the releases folder $HYPERBOLIC_VL_CACHE/releases is left."""
  home = tmp_path / "home"
  monkeypatch.setenv("HYPERBOLIC_VL_CACHE", str(home))
  sha256 = hashlib.sha256(PAYLOAD).hexdigest()
  monkeypatch.setitem(
    releases.RELEASES, "meru_vit_s", meru_entry(server.url("/f.pth"), sha256, len(PAYLOAD))
  )
  with pytest.raises(pretrained.NotACheckpoint) as error:
    pretrained.ensure_run("meru_vit_s", progress=io.StringIO())
  text = assert_one_line(error)
  assert (
    "300000 bytes) as a torch checkpoint: truncated or corrupt file? (UnpicklingError: " in text
  )
  assert "Check the documentation" not in text, text
  assert text.endswith("is no checkpoint and was removed, run again to fetch it afresh"), text
  assert listing(tmp_path) == []


def test_a_hub_download_that_is_no_checkpoint_is_removed_from_the_hubs_cache(tmp_path, monkeypatch):
  """The same through the hub's client: the blob and its snapshot link
  are removed, so that the next call fetches the file afresh."""
  served = hub_server(PAYLOAD, hashlib.sha256(PAYLOAD).hexdigest())
  monkeypatch.setenv("HF_ENDPOINT", served.url(""))
  monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
  try:
    with pytest.raises(pretrained.NotACheckpoint) as error:
      pretrained.ensure_run("uncha_vit_s", cache_dir=tmp_path / "cache", progress=io.StringIO())
  finally:
    served.stop()
  text = assert_one_line(error)
  assert text.endswith("is no checkpoint and was removed, run again to fetch it afresh"), text
  assert blobs(tmp_path / "hub") == [] and listing(tmp_path / "cache") == []
  assert not [p for p in listing(tmp_path / "hub") if p.endswith("uncha_vit_s.pth")]


def test_an_unwritable_cache_is_one_line_before_any_download(server, tmp_path):
  """A cache under a file (as root, the one unwritable place a test can
  make): refused before the server is asked, nothing created."""
  blocker = tmp_path / "not_a_folder"
  blocker.write_text("")
  with pytest.raises(pretrained.PretrainedError) as error:
    pretrained.ensure_run("meru_vit_s", cache_dir=blocker / "cache", progress=io.StringIO())
  text = assert_one_line(error)
  assert text == (
    f"cannot write the releases cache {blocker / 'cache' / 'meru_vit_s'} ({blocker} is a "
    "file); set HYPERBOLIC_VL_CACHE or --cache_dir to a folder you can write"
  )
  assert server.requests == [] and listing(tmp_path) == ["not_a_folder"]


def test_no_network_is_one_line_naming_the_address_and_checkpoint(tmp_path, monkeypatch):
  url = f"http://127.0.0.1:{closed_port()}/meru_vit_s.pth"
  monkeypatch.setitem(releases.RELEASES, "meru_vit_s", meru_entry(url, None))
  with pytest.raises(pretrained.PretrainedError) as error:
    pretrained.ensure_run("meru_vit_s", cache_dir=tmp_path / "cache", progress=io.StringIO())
  text = assert_one_line(error)
  assert url in text and "--pretrained=meru_vit_s --checkpoint=FILE" in text
  assert listing(tmp_path) == []


def test_a_full_disk_is_one_line_and_keeps_nothing(server, tmp_path, monkeypatch):
  real_open = open

  class FullDisk(io.BufferedWriter):
    """The first write succeeds, the second finds the disk full."""

    writes = 0

    def write(self, data):
      FullDisk.writes += 1
      if FullDisk.writes > 1:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
      return super().write(data)

  def open_full(path, mode="r", *args, **kwargs):
    if str(path).endswith(".part"):
      return FullDisk(real_open(path, mode.replace("b", "") + "b", buffering=0))
    return real_open(path, mode, *args, **kwargs)

  monkeypatch.setattr(release_files, "CHUNK", 64 * 1024)
  monkeypatch.setattr(release_files, "open", open_full, raising=False)
  progress = io.StringIO()
  with pytest.raises(pretrained.PretrainedError) as error:
    fetch(server.url("/f.pth"), tmp_path / "cache", progress=progress)
  text = assert_one_line(error)
  assert text.startswith("no space left on the device") and "HYPERBOLIC_VL_CACHE" in text
  # The progress line is ended, so that "error: ..." starts a line of its own.
  assert progress.getvalue().endswith(" MiB/s\n"), progress.getvalue()
  assert listing(tmp_path / "cache") == []


def test_a_given_checkpoint_with_the_wrong_checksum_is_one_line(tmp_path, monkeypatch):
  """--checkpoint=FILE (no network): checked as a download is, before converting."""
  given = tmp_path / "meru_vit_s.pth"
  given.write_bytes(PAYLOAD)
  monkeypatch.setitem(releases.RELEASES, "meru_vit_s", meru_entry("http://x/", "0" * 64))
  with pytest.raises(pretrained.PretrainedError) as error:
    pretrained.ensure_run("meru_vit_s", cache_dir=tmp_path / "cache", checkpoint=str(given))
  text = assert_one_line(error)
  assert f"has sha256 {hashlib.sha256(PAYLOAD).hexdigest()}" in text and "0" * 64 in text
  assert listing(tmp_path) == ["meru_vit_s.pth"]


def test_a_release_without_an_address_names_the_checkpoint_alternative(tmp_path):
  """ATMG's real entry: its README links Google Drive folders, not files."""
  with pytest.raises(pretrained.PretrainedError) as error:
    hyperbolic_vl.load("atmg_vit_s", cache_dir=tmp_path)
  text = assert_one_line(error)
  assert text.startswith("atmg_vit_s: the release gives no download address (the README links")
  assert text.endswith("python -m hyperbolic_vl.convert --pretrained=atmg_vit_s --checkpoint=FILE")
  assert listing(tmp_path) == []


def test_an_unknown_name_lists_the_valid_ones(tmp_path):
  with pytest.raises(pretrained.UnknownRelease) as error:
    hyperbolic_vl.load("meru_vit_xl", cache_dir=tmp_path)
  text = assert_one_line(error)
  assert "meru_vit_xl" in text and ", ".join(sorted(releases.RELEASES)) in text
  assert listing(tmp_path) == []


def test_the_command_line_says_each_error_in_one_line(tmp_path):
  """python -m hyperbolic_vl.convert --pretrained=NAME: an unknown name, and
  a real hub entry (UNCHA's) with no network (HF_ENDPOINT at a closed port):
  `error: <line>` on stderr, exit code 2, at once (the hub's client would
  retry for ~23 s), both caches untouched."""
  env = dict(
    os.environ, HF_ENDPOINT=f"http://127.0.0.1:{closed_port()}", HF_HUB_CACHE=str(tmp_path / "hub")
  )
  cases = {
    "meru_vit_xl": "no released model named 'meru_vit_xl'; valid names: ",
    "uncha_vit_s": "/hayeonkim/uncha/resolve/main/uncha_vit_s.pth is unreachable",
  }
  for name, expected in cases.items():
    completed = subprocess.run(
      [
        sys.executable,
        "-m",
        "hyperbolic_vl.convert",
        f"--pretrained={name}",
        f"--cache_dir={tmp_path / 'cache'}",
      ],
      cwd=REPO,
      env=env,
      capture_output=True,
      text=True,
      timeout=300,
    )
    lines = completed.stderr.strip().splitlines()
    assert completed.returncode == 2 and len(lines) == 1, completed.stderr
    assert lines[0].startswith("error: ") and expected in lines[0], lines[0]
  assert listing(tmp_path) == []


def test_ctrl_c_during_a_hub_download_is_one_line_exit_130_and_keeps_nothing(tmp_path, monkeypatch):
  """SIGINT (what Ctrl-C sends) to `convert --pretrained=uncha_vit_s` while
  the hub's client downloads (UNCHA's real entry through HF_ENDPOINT, a
  server that sends 1.5 of 3 MB and then holds the connection): one line,
  exit code 130, and no partial file in either cache: huggingface_hub
  writes to a file unique to the process and removes it when the call
  ends (its resume is within a call), so the next call downloads the file
  whole. Push tier: the command imports no JAX before its download."""
  import signal
  import time

  payload = np.random.default_rng(1).bytes(3_000_000)
  digest = hashlib.sha256(payload).hexdigest()
  served = hub_server(payload, digest)
  served.cuts["/blobs/uncha"] = [1_500_000, 1]  # the first response stops at 1.5 MB ...
  cache, hub_cache = tmp_path / "cache", tmp_path / "hub"
  stderr_file = tmp_path / "stderr"
  env = dict(os.environ, HF_ENDPOINT=served.url(""), HF_HUB_CACHE=str(hub_cache))
  env.pop("HF_HUB_VERBOSITY", None)
  original_do_get = served.httpd.RequestHandlerClass.do_GET
  sent, released = threading.Event(), threading.Event()

  def slow_get(handler):  # ... and holds the connection open until the test is done with it
    original_do_get(handler)
    if handler.path == "/blobs/uncha" and not handler.headers.get("Range"):
      sent.set()
      released.wait(180)

  served.httpd.RequestHandlerClass.do_GET = slow_get
  command = [
    sys.executable,
    "-m",
    "hyperbolic_vl.convert",
    "--pretrained=uncha_vit_s",
    f"--cache_dir={cache}",
  ]
  try:
    with open(stderr_file, "w") as stderr:
      process = interactive.popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=stderr)
      deadline = time.monotonic() + 120
      while not sent.is_set():  # the 1.5 MB written; the client's next read waits on the server
        assert time.monotonic() < deadline and process.poll() is None, stderr_file.read_text()
        time.sleep(0.1)
      assert [p for p in listing(hub_cache) if p.endswith(".incomplete")], listing(hub_cache)
      # A command started by a shell takes SIGINT; one that inherited it
      # ignored or blocked would download on (the kernel's view, Linux).
      status = pathlib.Path(f"/proc/{process.pid}/status")
      if status.is_file():
        masks = dict(
          line.split(":\t") for line in status.read_text().splitlines() if line.startswith("Sig")
        )
        sigint = 1 << (signal.SIGINT - 1)
        assert not int(masks["SigIgn"], 16) & sigint, f"SIGINT ignored by the command: {masks}"
        assert not int(masks["SigBlk"], 16) & sigint, f"SIGINT blocked in the command: {masks}"
      process.send_signal(signal.SIGINT)
      process.communicate(timeout=120)
    text = stderr_file.read_text()
    # JAX's C++ start-up lines (I..., W...) are no part of the report.
    lines = [line for line in text.splitlines() if line and line[:1] not in "IW"]
    assert process.returncode == 130, text[-3000:]
    assert len(lines) == 1 and lines[0].startswith(
      "interrupted: uncha_vit_s not converted; run the same command again"
    ), text[-3000:]
    assert "Traceback" not in text
    assert listing(cache) == [] and blobs(hub_cache) == []  # .incomplete removed
    served.httpd.RequestHandlerClass.do_GET = original_do_get
    monkeypatch.setenv("HF_ENDPOINT", served.url(""))
    monkeypatch.setenv("HF_HUB_CACHE", str(hub_cache))
    path = fetch_uncha()
  finally:
    released.set()
    served.stop()
  assert path.read_bytes() == payload and blobs(hub_cache) == [
    f"models--hayeonkim--uncha/blobs/{digest}"
  ]
  assert served.requests[-1] == ("/blobs/uncha", None)  # whole: nothing kept to resume


def test_ctrl_c_during_a_plain_download_keeps_the_part_and_the_next_call_resumes(
  server, tmp_path, monkeypatch
):
  """An address outside the hub (our downloader): Ctrl-C arriving while
  the second block is written leaves FILE.part with the first, which the
  next call continues with a Range request."""
  real_open = open

  class CtrlC(io.BufferedWriter):
    writes = 0

    def write(self, data):
      CtrlC.writes += 1
      if CtrlC.writes == 2:
        raise KeyboardInterrupt
      return super().write(data)

  def open_interrupted(path, mode="r", *args, **kwargs):
    if str(path).endswith(".part"):
      return CtrlC(real_open(path, mode.replace("b", "") + "b", buffering=0))
    return real_open(path, mode, *args, **kwargs)

  block = 64 * 1024
  monkeypatch.setattr(release_files, "CHUNK", block)
  with monkeypatch.context() as interrupted, pytest.raises(KeyboardInterrupt):
    interrupted.setattr(release_files, "open", open_interrupted, raising=False)
    fetch(server.url("/f.pth"), tmp_path)
  assert listing(tmp_path) == ["f.pth.part"]
  assert (tmp_path / "f.pth.part").read_bytes() == PAYLOAD[:block]
  path = fetch(server.url("/f.pth"), tmp_path, sha256=hashlib.sha256(PAYLOAD).hexdigest())
  assert path.read_bytes() == PAYLOAD and server.requests[-1] == ("/f.pth", f"bytes={block}-")


# -- the real table ----------------------------------------------------------
def test_every_entry_names_a_converter_source_and_config_that_exist():
  for name, entry in releases.RELEASES.items():
    assert entry.name == name
    assert entry.source in workdir.SOURCES, name
    assert (REPO / entry.config.partition(":")[0]).is_file(), name
    pretrained.release_config(entry)  # the variant exists (else ConfigError)
    assert entry.weights.url or entry.note, f"{name}: no address and no note saying why"
    for download in (entry.weights, entry.bounds):
      if download and download.hub:
        repository, filename = download.hub
        assert download.url.startswith(f"https://huggingface.co/{repository}/resolve/main/")
        assert filename == download.filename
    if entry.weights.sha256:
      assert re.fullmatch(r"[0-9a-f]{64}", entry.weights.sha256), name


def test_every_release_the_converters_read_has_an_entry():
  """The converters' sources, and each (source, config file) a documented
  convert command pairs (docs/interop.md, convert.py), have an entry; so do
  the layouts meru.py's docstring says it reads (PHyCLIP's among them)."""
  documented = set()
  for path in (REPO / "docs" / "interop.md", REPO / "hyperbolic_vl" / "convert.py"):
    text = path.read_text().replace("\\\n", " ")
    for command in re.findall(r"hyperbolic_vl\.convert (--source=.*)", text):
      source = re.search(r"--source=(\w+)", command)[1]
      config = re.search(r"--config=(configs/\w+\.py)", command)[1]
      documented.add((source, config))
  documented |= {("meru", f"configs/{layout}.py") for layout in ("phyclip", "atmg", "hycoclip")}
  table = {(e.source, e.config.partition(":")[0]) for e in releases.RELEASES.values()}
  assert len(documented) >= 8 and documented <= table, documented - table
  assert set(workdir.SOURCES) == {e.source for e in releases.RELEASES.values()}


def test_the_docs_table_lists_every_entry_and_its_address():
  text = (REPO / "docs" / "interop.md").read_text()
  for name, entry in releases.RELEASES.items():
    assert f"`{name}`" in text, name
    if entry.weights.url:
      assert entry.weights.url in text, name


def test_the_release_table_prints_our_figures_beside_the_papers():
  """benchmarks/release_table.py --pretrained: the paper's figure (MERU's
  Table 2 ImageNet, Table 1 COCO recall@5), ours from the run's latest row
  in percent, and the difference; a figure not evaluated is left blank."""
  import importlib.util

  spec = importlib.util.spec_from_file_location(
    "release_table", REPO / "benchmarks" / "release_table.py"
  )
  script = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(script)
  rows = [
    {"run": "meru_vit_s", "figures": {"zero_shot/imagenet/top1_mean_per_class": 0.1}},
    {"run": "meru_vit_s", "figures": {"zero_shot/imagenet/top1_mean_per_class": 0.35}},
  ]
  lines = script.paper_comparison(rows, ["meru_vit_s", "hysac_vit_l"]).splitlines()
  assert (
    "| meru_vit_s | zero_shot/imagenet/top1_mean_per_class | 34.4 (Table 2) | 35.0 | +0.6 |"
    in lines
  )
  assert "| meru_vit_s | retrieval/coco/t2i_recall@5 | 30.5 (Table 1) |  |  |" in lines
  assert lines[-1].startswith("| hysac_vit_l | (no paper figures recorded: ")


@pytest.mark.slow  # builds a model to write the release file; the fast tests cover the download
def test_hysac_by_name_downloads_its_bounds_and_converts_with_them(tmp_path, monkeypatch):
  """HySAC's entry holds two files: the weights and hysac_bounds.json, both
  downloaded and converted together (convert --bounds), the bounds file
  written into the run as released."""
  import documented_data

  real = releases.RELEASES["hysac_vit_l"]
  shrunk = ("model.image_variant=mu/14", "model.text_variant=mu", "input.image_size=42")
  config = pretrained.release_config(dataclasses.replace(real, overrides=shrunk))
  weights, bounds = tmp_path / "hysac_model.pth", tmp_path / "hysac_bounds.json"
  documented_data.release_checkpoint("hysac", config, weights, bounds=bounds)
  served = ReleaseServer({"/w": weights.read_bytes(), "/b": bounds.read_bytes()})
  entry = dataclasses.replace(
    real,
    weights=dataclasses.replace(real.weights, url=served.url("/w"), hub=None),
    bounds=dataclasses.replace(real.bounds, url=served.url("/b"), hub=None),
    overrides=shrunk,
  )
  monkeypatch.setitem(releases.RELEASES, "hysac_vit_l", entry)
  try:
    run = pretrained.ensure_run("hysac_vit_l", cache_dir=tmp_path / "cache", progress=io.StringIO())
  finally:
    served.stop()
  assert sorted(os.listdir(run)) == ["checkpoints", "config.json", "hysac_bounds.json"]
  assert (run / "hysac_bounds.json").read_text() == bounds.read_text()
  assert sorted(os.listdir(run.parent)) == ["hysac_bounds.json", "hysac_model.pth", "run"]
