"""Every bad input a user can give `python -m hyperbolic_vl.main` ends in one
line on stderr (no traceback) and exit code 2, and leaves the workdir as it
was: a fresh workdir is not created, an existing one keeps every file byte
for byte. docs/training.md's table of bad inputs lists these same cases.

All commands a test session selected start together (each is mostly JAX's
import). The push tier runs one case of each command (main, convert,
evaluate, plot, export); the other cases of main repeat its path and are in
the slow tier.
"""

import hashlib
import io
import json
import os
import socket
import subprocess
import sys
import tarfile
import time

import pytest
from paths import REPO

from hyperbolic_vl import errors

MAIN = [sys.executable, "-m", "hyperbolic_vl.main"]
TINY = ["--config=configs/meru.py"]


def digest(folder) -> dict:
  if not os.path.isdir(folder):
    return {}
  return {
    os.path.relpath(os.path.join(root, name), folder): hashlib.sha256(
      open(os.path.join(root, name), "rb").read()
    ).hexdigest()
    for root, _, names in os.walk(folder)
    for name in names
  }


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
  """name -> (command-line flags, workdir); every workdir but two is fresh."""
  root = tmp_path_factory.mktemp("bad_inputs")
  images = root / "images"
  images.mkdir()
  from PIL import Image

  Image.new("RGB", (8, 8)).save(images / "0.png")
  latin1 = root / "latin1.csv"
  latin1.write_bytes(b"image,caption\n0.png,a caf\xe9\n")
  csv = ["--config=configs/meru.py:data=image_text_csv", f"--config.input.data.image_root={images}"]

  # A workdir whose config.json holds another model (an earlier run's).
  other_model = root / "other_model"
  other_model.mkdir()
  (other_model / "config.json").write_text(json.dumps({"model": {"embed_dim": 32}}))
  # A workdir a live process holds (this test's own pid on this host).
  in_use = root / "in_use"
  in_use.mkdir()
  (in_use / "run.lock").write_text(
    json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "started": time.time()})
  )
  (root / "a_file").write_text("")
  # GRIT shards whose samples hold a whole image and caption but no box.
  boxless = root / "boxless.tar"
  with tarfile.open(boxless, "w") as tar:
    for key in ("000000000", "000000001"):
      for name in (f"{key}.child.jpg", f"{key}.child.txt", f"{key}.numparents.txt"):
        data = (images / "0.png").read_bytes() if name.endswith(".jpg") else b"0"
        info = tarfile.TarInfo(name)
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
  uncha = ["--config=configs/uncha.py"]
  return {
    "config file not found": (["--config=configs/nope.py"], root / "w1"),
    "unknown variant": (["--config=configs/meru.py:vit_xx"], root / "w2"),
    "unknown config argument": (["--config=configs/meru.py:bogus=1"], root / "w3"),
    "unknown config key": ([*TINY, "--config.optim.learning_rate=1"], root / "w4"),
    "negative batch size": ([*TINY, "--config.input.batch_size=-4"], root / "w5"),
    "batch not divisible by devices": ([*TINY, "--config.input.batch_size=12"], root / "w6"),
    "unknown objective": ([*TINY, "--config.objective.name=meruu"], root / "w7"),
    "CSV not found": ([*csv, f"--config.input.data.path={root}/x.csv"], root / "w8"),
    "CSV not UTF-8": ([*csv, f"--config.input.data.path={latin1}"], root / "w9"),
    "workdir not writable": (TINY, "/sys/hyperbolic_vl_test_run"),
    "workdir under a file": (TINY, root / "a_file" / "run"),
    "workdir holds another model": (TINY, other_model),
    "workdir in use": (TINY, in_use),
    "curvature not positive": ([*TINY, "--config.model.curv_init=0"], root / "w14"),
    "UNCHA without box slots": ([*uncha, "--config.input.data.max_boxes=0"], root / "w15"),
    "UNCHA box slots beyond memory": (
      [*uncha, "--config.input.data.max_boxes=100000"],
      root / "w16",
    ),
    "PHyCLIP in one space": (
      ["--config=configs/phyclip.py", "--config.model.factor_dim=0"],
      root / "w17",
    ),
    "GRIT shards without a box": (
      ["--config=configs/uncha.py:data=grit", f"--config.input.data.path={boxless}"],
      root / "w18",
    ),
    "another source's key": ([*TINY, "--config.input.data.image_root=/x"], root / "w19"),
    "two sources named": (
      [*csv, "--config.input.data.name=tfds"],
      root / "w20",
    ),
    "convert: checkpoint not found": (
      [
        "-m",
        "hyperbolic_vl.convert",
        "--source=open_clip",
        f"--checkpoint={root}/missing.pt",
        "--config=configs/clip.py:openai_vit_b32",
      ],
      root / "w10",
    ),
    "evaluate: workdir not found": (
      ["-m", "hyperbolic_vl.evaluate", "--suite=config"],
      root / "w11",
    ),
    "plot: workdir not found": (["-m", "hyperbolic_vl.plot"], root / "w12"),
    "export: workdir not found": (
      ["-m", "hyperbolic_vl.export", "--format=meru", f"--output={root}/exported.pth"],
      root / "w13",
    ),
  }


@pytest.fixture(scope="module")
def outcomes(cases, request):
  """name -> (exit code, stderr, workdir files before, after, stdout), run in
  parallel for the cases this session (this worker) runs."""
  selected = {
    item.callspec.params["name"]
    for item in request.session.items
    if item.module is request.module and hasattr(item, "callspec")
  }
  cases = {name: case for name, case in cases.items() if name in selected}
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8")
  before = {name: digest(workdir) for name, (_, workdir) in cases.items()}
  running = {
    name: subprocess.Popen(
      # A case's flags start with "-m MODULE" when it is another program.
      [*(MAIN[:1] if flags[0] == "-m" else MAIN), *flags, f"--workdir={workdir}"],
      cwd=REPO,
      env=env,
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
      text=True,
    )
    for name, (flags, workdir) in cases.items()
  }
  results = {}
  for name, process in running.items():
    out, err = process.communicate(timeout=600)
    results[name] = (process.returncode, err, before[name], digest(cases[name][1]), out)
  return results


EXPECTED = {
  "config file not found": "error: config file not found: configs/nope.py",
  "unknown variant": "error: unknown variant 'vit_xx'; valid: ['tiny', 'vit_s', 'vit_b', 'vit_l']",
  "unknown config argument": "error: unknown config argument 'bogus'; valid: ['data', 'loss', 'variant']",
  "unknown config key": "error: unknown config key 'optim.learning_rate'",
  "negative batch size": "error: input.batch_size must be an integer >= 1, got -4",
  "batch not divisible by devices": (
    "error: input.batch_size=12 must be divisible by the number of devices (8)"
  ),
  "unknown objective": "error: objective.name='meruu' is unknown; valid: [",
  "CSV not found": "error: image-text CSV not found: ",
  "CSV not UTF-8": "latin1.csv: line 2 is not UTF-8 (byte 0xe9 at offset 25)",
  "workdir not writable": "error: cannot create /sys/hyperbolic_vl_test_run: Operation not permitted",
  "workdir under a file": "a_file/run: Not a directory",
  "workdir holds another model": "holds a run with a different configuration",
  "convert: checkpoint not found": "missing.pt",
  "evaluate: workdir not found": "w11",
  "plot: workdir not found": "w12: no such run directory",
  "export: workdir not found": "w13: no such run directory",
  "workdir in use": f"is in use by another run (host {socket.gethostname()}, pid {os.getpid()}",
  "curvature not positive": "error: model.curv_init must be a finite number > 0, got 0.0",
  "UNCHA without box slots": (
    "error: objective 'uncha' needs box slots: a grounded source (world_boxes, grit, "
    "coco_grounded) with input.data.max_boxes >= 1 (configs/uncha.py: 4, released: 5); got "
    "input.data.max_boxes=0"
  ),
  # Whatever the machine has free: 100,001 images of 32 px a row, 64 rows,
  # need 149.5 GiB (tests/train/test_preflight.py counts them by hand).
  "UNCHA box slots beyond memory": "error: the batch's inputs alone need 149.5 GiB before any",
  "PHyCLIP in one space": (
    "error: objective 'phyclip' needs a product of Lorentz spaces: set model.factor_dim > 0"
  ),
  "GRIT shards without a box": "boxless.tar' hold 2 samples, none with a box",
  "another source's key": (
    "(the keys of source 'world'; another source's come with --config.input.data.name=NAME"
  ),
  "two sources named": (
    "error: --config.input.data.name=tfds and the config argument data=image_text_csv name "
    "two sources; give one"
  ),
}


# One case of each command in the push tier.
PUSH_TIER = {
  "unknown config key",
  "convert: checkpoint not found",
  "evaluate: workdir not found",
  "plot: workdir not found",
  "export: workdir not found",
}


@pytest.mark.parametrize(
  "name",
  [name if name in PUSH_TIER else pytest.param(name, marks=pytest.mark.slow) for name in EXPECTED],
)
def test_a_bad_input_is_one_line_exit_2_and_nothing_written(name, outcomes):
  code, stderr, before, after, stdout = outcomes[name]
  # JAX and absl log INFO lines to stderr; what the user reads is the rest.
  lines = [line for line in stderr.splitlines() if line and line[:1] not in "IW"]
  assert code == errors.EXIT_USER_ERROR, stderr[-3000:]
  assert "Traceback" not in stderr
  assert any(EXPECTED[name] in line for line in lines), lines
  assert len([line for line in lines if line.startswith("error:")]) == 1, lines
  assert after == before  # a fresh workdir is not created; an existing one is unchanged


@pytest.mark.parametrize("name", ["unknown config key"])
def test_an_unknown_config_key_names_the_valid_keys_of_its_section(name, outcomes):
  """The line after the error lists the section's keys: `lr` for the
  misspelt `optim.learning_rate`."""
  _, stderr, *_ = outcomes[name]
  prefix = "Valid keys of config.optim: "
  valid = next((line for line in stderr.splitlines() if line.startswith(prefix)), None)
  assert valid is not None, stderr[-3000:]
  keys = valid[len(prefix) :].split(", ")
  assert "lr" in keys and "warmup_steps" in keys and "learning_rate" not in keys


# Slow tier (the run reaches its set-up: ~16 s more on a loaded 2-core
# machine); tests/train/test_preflight.py refuses the same config in-process.
@pytest.mark.slow
@pytest.mark.parametrize("name", ["UNCHA box slots beyond memory"])
def test_box_slots_beyond_memory_are_refused_before_compiling(name, outcomes):
  """The run that the kernel's OOM killer ended after "Compiling the step..."
  is refused before its data iterator or step is built, naming the levers."""
  code, stderr, _, _, stdout = outcomes[name]
  assert code == errors.EXIT_USER_ERROR, stderr[-3000:]
  assert "Compiling" not in stdout and "Plan:" not in stdout
  assert "to fit them (the compiled step's own check follows), set one of: " in stderr
  # The slots lever always fits (one slot a row is 0.5 MiB); a batch lever
  # only when the machine holds 8 rows (one a device) of 100,001 images.
  assert "input.data.max_boxes=" in stderr
