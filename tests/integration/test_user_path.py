"""What a new user types in the first hour (issue 29): each mistake ends in one
line and exit code 2 with the workdir as it was (a fresh one not created),
a diverged run in one line and exit code 1, and the console of a run is
readable (no INFO chatter, the compile and the time to first step said).

The in-process tests check the one-line messages at their source; the
command-line table (slow: every command is mostly JAX's import, all of them
started together) checks exit codes and that nothing else is printed."""

import hashlib
import os
import subprocess
import sys

import pytest
from paths import REPO
from PIL import Image
from tiny_runs import small_config

from hyperbolic_vl import errors
from hyperbolic_vl.data import image_text
from hyperbolic_vl.data.readers import image_text_records
from hyperbolic_vl.training import input_health, loop


def digest(folder) -> dict:
  if not os.path.isdir(folder):
    return {}
  out = {}
  for root, _, names in os.walk(folder):
    for name in names:
      with open(os.path.join(root, name), "rb") as f:
        out[os.path.relpath(os.path.join(root, name), folder)] = hashlib.sha256(
          f.read()
        ).hexdigest()
  return out


@pytest.fixture(scope="module")
def data(tmp_path_factory):
  """CSVs of every shape a user's first CSV takes, over 24 px images."""
  root = tmp_path_factory.mktemp("user_data")
  images = root / "images"
  images.mkdir()
  for i in range(8):
    Image.new("RGB", (24, 24), (30 * i, 0, 0)).save(images / f"{i}.png")
  (images / "garbage.jpg").write_bytes(b"\xff\xd8\xff not a jpeg")
  (root / "vocab.model").write_text("a\nb\n")  # a word list given for a SentencePiece model

  def csv(name, text):
    (root / name).write_text(text)
    return str(root / name)

  rows = lambda names, captions: "".join(f"{n},{c}\n" for n, c in zip(names, captions))
  return {
    "images": str(images),
    "vocab model": str(root / "vocab.model"),
    "no caption column": csv("no_caption.csv", "image,text\n0.png,a red square\n"),
    "empty": csv("empty.csv", ""),
    "header only": csv("header.csv", "image,caption\n"),
    "all missing": csv(
      "missing.csv", "image,caption\n" + rows([f"m{i}.png" for i in range(8)], ["a"] * 8)
    ),
    "all corrupt": csv("corrupt.csv", "image,caption\n" + rows(["garbage.jpg"] * 8, ["a"] * 8)),
    "empty captions": csv(
      "empty_captions.csv",
      "image,caption\n" + rows([f"{i}.png" for i in range(8)], ["", "a", "", "b"] * 2),
    ),
  }


def csv_config(path, images, **overrides):
  from configs import meru

  return small_config(
    lambda: meru.get_config("data=image_text_csv"),
    **{"input.data.path": path, "input.data.image_root": images, **overrides},
  )


# --- in process: the messages at their source ---------------------------------


@pytest.mark.parametrize(
  ("case", "named"),
  [
    ("no caption column", "has no column(s) ['caption']; columns: ['image', 'text']"),
    ("empty", "is empty: no header line, no rows"),
  ],
)
def test_a_csv_without_its_columns_is_a_data_error(data, case, named):
  with pytest.raises(errors.DataError) as error:
    image_text_records.ImageTextCsvSource(data[case], data["images"])
  assert named in str(error.value) and "\n" not in str(error.value)


def test_missing_corrupt_and_empty_captions_are_judged_by_one_rule(data, tmp_path):
  # Every image missing: refused at the first batch, before anything is written.
  workdir = tmp_path / "all_missing"
  with pytest.raises(errors.DataError, match="bad training examples in a row"):
    loop.train(csv_config(data["all missing"], data["images"]), str(workdir))
  assert not workdir.exists()
  # Empty captions count with missing and undecodable images: past the 1%
  # limit (judged over at least 1,000 examples), one line naming every kind.
  health = input_health.InputHealth(max_bad_fraction=0.01)
  batch = {
    "input/bad_samples": [0] * 989 + [1] * 11,
    "input/bad_names": ["example 0: empty caption"],
  }
  with pytest.raises(input_health.BadInputError) as error:
    health.update(batch)
  # 11 bad of 1000 + 11 read: 1.09% > 1%: one line that names the kinds of bad example.
  assert "11 of 1011 training examples" in str(error.value)
  assert "empty captions" in str(error.value) and "\n" not in str(error.value)
  assert issubclass(input_health.BadInputError, errors.UserError)


def test_an_empty_caption_is_skipped_and_counted(data):
  source = image_text_records.ImageTextCsvSource(data["empty captions"], data["images"])
  example = image_text.RealTrainExample(
    source=source,
    augment_seed=0,
    image_size=8,
    cumulative_tier_weights=image_text.transforms.cumulative_tier_weights((1.0, 0.0, 0.0, 0.0)),
  )
  # Row 0's caption is empty: row 1 stands in for it, and row 0 is reported.
  out = example(epoch=0, index=0)
  assert out["index"] == 1 and out["caption"] == "a"
  assert out["bad_names"] == ["example 0: empty caption"]


# --- the command line (slow) -----------------------------------------------------

TINY = ["--config=configs/meru.py"]
TINY_RUN = [
  *TINY,
  "--config.input.image_size=16",
  "--config.input.batch_size=16",
  "--config.total_steps=4",
  "--config.evals.world.num_examples=64",
  "--config.evals.world.batch_size=64",
]


@pytest.fixture(scope="module")
def outcomes(data, tmp_path_factory):
  """name -> (exit code, stdout, stderr, workdir before, after), all started together."""
  root = tmp_path_factory.mktemp("user_path")
  csv = [
    "--config=configs/meru.py:data=image_text_csv",
    f"--config.input.data.image_root={data['images']}",
    "--config.input.batch_size=8",  # the 8 rows: no batch-larger-than-the-data warning
  ]
  cases = {
    "geometry typo": ([*TINY, "--config.model.geometry=lorentzz"], root / "w1"),
    "dtype typo": ([*TINY, "--config.model.dtype=float33"], root / "w2"),
    "total_steps=abc": ([*TINY, "--config.total_steps=abc"], root / "w3"),
    "total_steps=1.5": ([*TINY, "--config.total_steps=1.5"], root / "w4"),
    "optim.lr=abc": ([*TINY, "--config.optim.lr=abc"], root / "w5"),
    "CSV without a caption column": (
      [*csv, f"--config.input.data.path={data['no caption column']}"],
      root / "w6",
    ),
    "empty CSV": ([*csv, f"--config.input.data.path={data['empty']}"], root / "w7"),
    "header-only CSV": ([*csv, f"--config.input.data.path={data['header only']}"], root / "w8"),
    "all images missing": ([*csv, f"--config.input.data.path={data['all missing']}"], root / "w9"),
    "all images corrupt": ([*csv, f"--config.input.data.path={data['all corrupt']}"], root / "w10"),
    "tokenizer file not a SentencePiece model": (
      [
        *TINY,
        "--config.input.tokenizer.name=sentencepiece",
        f"--config.input.tokenizer.model_path={data['vocab model']}",
      ],
      root / "w14",
    ),
    # A paper variant's CSV source without --config.input.data.path (a
    # documented command once left it out and got a traceback).
    "CSV source without its path": (csv, root / "w15"),
    "missing --config": ([], root / "w11"),
    "empty --workdir": (TINY, ""),
    "NaN-producing learning rate": ([*TINY_RUN, "--config.optim.lr=1e30"], root / "w12"),
    "evaluate: misspelt --eval": (
      ["-m", "hyperbolic_vl.evaluate", "--eval=zero_shott"],
      root / "w13",
    ),
  }
  before = {name: digest(workdir) if workdir else None for name, (_, workdir) in cases.items()}
  running = {
    name: subprocess.Popen(
      # A case's flags start with "-m MODULE" when it is another program.
      [
        sys.executable,
        *([] if flags[:1] == ["-m"] else ["-m", "hyperbolic_vl.main"]),
        *flags,
        f"--workdir={workdir}",
      ],
      cwd=REPO,
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
      text=True,
    )
    for name, (flags, workdir) in cases.items()
  }
  results = {}
  for name, process in running.items():
    out, err = process.communicate(timeout=900)
    workdir = cases[name][1]
    after = digest(workdir) if workdir else None
    results[name] = (process.returncode, out, err, before[name], after)
  return results


EXPECTED = {
  "geometry typo": (2, "error: objective 'meru' needs model.geometry='lorentz', got 'lorentzz'"),
  "dtype typo": (2, "error: model.dtype='float33'; valid: ["),
  "total_steps=abc": (2, "error: --config.total_steps=abc: invalid literal for int()"),
  "total_steps=1.5": (2, "error: --config.total_steps=1.5: invalid literal for int()"),
  "optim.lr=abc": (2, "error: --config.optim.lr=abc: could not convert string to float"),
  "CSV without a caption column": (2, "has no column(s) ['caption']; columns: ['image', 'text']"),
  "empty CSV": (2, "empty.csv is empty: no header line, no rows"),
  "header-only CSV": (2, "holds no examples"),
  "all images missing": (2, "bad training examples in a row"),
  "all images corrupt": (2, "bad training examples in a row"),
  "tokenizer file not a SentencePiece model": (2, "vocab.model is not a SentencePiece model ("),
  "CSV source without its path": (
    2,
    "error: input.data.path is required (source 'image_text_csv')",
  ),
  "missing --config": (2, "error: --config is required"),
  "empty --workdir": (2, "error: --workdir is empty"),
  "NaN-producing learning rate": (1, "error: non-finite loss or gradient at step"),
  "evaluate: misspelt --eval": (2, "error: unknown evaluator type 'zero_shott'; valid: ["),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(EXPECTED))
def test_a_users_mistake_is_one_line_and_leaves_the_workdir(name, outcomes):
  code, out, err, before, after = outcomes[name]
  expected_code, named = EXPECTED[name]
  assert code == expected_code, err[-3000:]
  assert "Traceback" not in err + out
  lines = [line for line in err.splitlines() if line.strip()]
  assert len(lines) == 1 and named in lines[0], lines
  if expected_code == 2:
    assert after == before  # a fresh workdir is not created
  else:
    assert "step None" not in lines[0] and "no checkpoint was saved before it" in lines[0]
  if name == "empty --workdir":
    assert not os.path.exists(REPO / "checkpoints") and not os.path.exists(REPO / "config.json")


# --- a damaged newest step: evaluate and export fall back, saying so (slow) ------


@pytest.mark.slow
def test_loading_a_run_whose_newest_step_is_garbled_uses_the_newest_readable(tmp_path, capsys):
  import numpy as np
  from etils import epath

  from hyperbolic_vl.runs import loading

  workdir = tmp_path / "run"
  loop.train(small_config(log_training_steps=2), str(workdir))  # checkpoints 3 and 6
  _, _, step_3_params, _ = loading.restore_run_params(str(workdir), step=3)
  for folder, _, names in os.walk(workdir / "checkpoints" / "6" / "state"):
    for name in names:
      if os.path.basename(folder) == "d":  # the arrays' data files
        (epath.Path(folder) / name).write_bytes(b"not a tensorstore chunk")
  capsys.readouterr()
  _, _, params, _ = loading.restore_run_params(str(workdir))
  warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning")]
  assert len(warnings) == 1 and "step(s) [6]" in warnings[0] and "using step 3" in warnings[0]
  for mine, theirs in zip(jax_leaves(params), jax_leaves(step_3_params), strict=True):
    np.testing.assert_array_equal(mine, theirs)


def jax_leaves(tree):
  import jax
  import numpy as np

  return [np.asarray(leaf) for leaf in jax.tree.leaves(tree)]


def test_an_unreadable_run_directory_says_permission_denied(tmp_path, monkeypatch):
  from hyperbolic_vl.runs import checkpointing

  (tmp_path / "config.json").write_text("{}")
  # Root reads every folder: the check is what os.access answers for a user.
  monkeypatch.setattr(checkpointing.os, "access", lambda path, mode: False)
  with pytest.raises(PermissionError) as error:
    checkpointing.load_run_config(str(tmp_path))
  assert errors.one_line(error.value).startswith("Permission denied")


def test_exporting_an_adapted_clip_names_a_format_that_holds_it():
  from configs import adapt_clip
  from hyperbolic_vl import export

  run_config = adapt_clip.get_config("vit_b32")
  meru, open_clip = (
    export._unsupported("meru", run_config),
    export._unsupported("open_clip", run_config),
  )
  # Neither torch format holds a Lorentz run in OpenAI's layout: each refusal
  # points at the format that does, never at the other refusing one.
  assert "image_ln_pre=True" in meru and "--format=safetensors holds every run" in meru
  assert "'lorentz'" in open_clip and "--format=safetensors holds every run" in open_clip
  assert "try --format=meru" not in open_clip
  assert export._unsupported("safetensors", run_config) is None


def test_relative_data_paths_are_saved_absolute(monkeypatch, tmp_path):
  from configs import meru

  monkeypatch.chdir(tmp_path)
  config = meru.get_config("data=image_text_csv")
  with config.unlocked():
    config.input.data.path = "data/train.csv"
    config.input.data.image_root = "https://example.com/images"  # a URL stays as given
  resolved = loop._absolute_data_paths(config)
  assert resolved.input.data.path == str(tmp_path / "data" / "train.csv")
  assert resolved.input.data.image_root == "https://example.com/images"
  assert config.input.data.path == "data/train.csv"  # the caller's config is not changed


# --- damaged checkpoints on the command line: one line each (slow) -------------


def _truncate_arrays(step_folder) -> None:
  """Cuts the step's array data files to half (the index of the arrays, in
  state/d, stays whole), as a copy or save that was stopped leaves them."""
  for folder, _, names in os.walk(os.path.join(step_folder, "state")):
    if folder.endswith(os.path.join("ocdbt.process_0", "d")):
      for name in names:
        path = os.path.join(folder, name)
        os.truncate(path, os.path.getsize(path) // 2)


def _bytes_on_tmpfs(folder) -> int:
  """What `folder`'s files take on a tmpfs (whole 4 KiB pages per file)."""
  page = 4096
  return sum(
    -(-os.path.getsize(os.path.join(root, name)) // page) * page
    for root, _, names in os.walk(folder)
    for name in names
  )


def _small_disk(path, size_bytes: int) -> bool:
  """Mounts a tmpfs of `size_bytes` at `path`; False where this user cannot
  mount."""
  os.makedirs(path)
  mounted = subprocess.run(
    ["mount", "-t", "tmpfs", "-o", f"size={size_bytes // 1024 + 1}k", "tmpfs", str(path)],
    capture_output=True,
  )
  return mounted.returncode == 0


@pytest.mark.slow
def test_a_truncated_step_or_a_full_disk_is_one_line_from_the_command_line(tmp_path):
  run = [*TINY_RUN, "--config.ckpt_steps=2"]  # checkpoints 2 and 4
  first = subprocess.run(
    [sys.executable, "-m", "hyperbolic_vl.main", *run, f"--workdir={tmp_path / 'run'}"],
    cwd=REPO,
    capture_output=True,
    text=True,
  )
  assert first.returncode == 0, first.stderr[-3000:]
  damaged = {}
  for name in ("train", "evaluate", "export"):
    damaged[name] = tmp_path / name
    subprocess.run(["cp", "-r", str(tmp_path / "run"), str(damaged[name])], check=True)
    _truncate_arrays(damaged[name] / "checkpoints" / "4")
  module = lambda name: [sys.executable, "-m", f"hyperbolic_vl.{name}"]
  commands = {
    "train": [*module("main"), *run, f"--workdir={damaged['train']}"],
    "evaluate": [*module("evaluate"), f"--workdir={damaged['evaluate']}", "--suite=config"],
    "export": [
      *module("export"),
      f"--workdir={damaged['export']}",
      "--format=safetensors",
      f"--output={tmp_path / 'exported.safetensors'}",
    ],
  }
  # Room for everything the healthy run wrote but half of its last
  # checkpoint: step 2's save fits, step 4's runs out of space.
  room = (
    _bytes_on_tmpfs(tmp_path / "run") - _bytes_on_tmpfs(tmp_path / "run" / "checkpoints" / "4") // 2
  )
  disk = tmp_path / "small_disk"
  if _small_disk(disk, room):
    commands["full disk"] = [*module("main"), *run, f"--workdir={disk / 'run'}"]
  try:
    running = {
      name: subprocess.Popen(
        command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
      )
      for name, command in commands.items()
    }
    results = {name: (p.wait(timeout=900), *p.communicate()) for name, p in running.items()}
  finally:
    if "full disk" in commands:
      subprocess.run(["umount", str(disk)], check=False)
  for name, (code, out, err) in results.items():
    assert "Traceback" not in out + err and "Event loop is closed" not in out + err, name
    assert code == (2 if name == "full disk" else 0), (name, err[-3000:])
  # stderr holds the one warning (or error) line, and for a run its
  # progress lines; evaluate's own report is on stdout.
  warning = lambda name: [line for line in results[name][2].splitlines() if "unreadable" in line]
  checkpoints = lambda name: damaged[name] / "checkpoints"
  assert len(warning("train")) == 1
  assert (
    f"checkpoint step 4 in {checkpoints('train')} is unreadable (ValueError: OUT_OF_RANGE"
    in (warning("train")[0])
  )
  assert "resuming from step 2" in warning("train")[0]
  for name in ("evaluate", "export"):
    assert results[name][2].splitlines()[0] == warning(name)[0], name  # the first line
    assert f"step(s) [4] in {checkpoints(name)} are unreadable" in warning(name)[0]
    assert "using step 2, the newest readable one (--step chooses another)" in warning(name)[0]
  export_lines = (results["export"][1] + results["export"][2]).splitlines()
  assert len(export_lines) == 3  # the warning and the two files written
  assert len([line for line in results["evaluate"][2].splitlines() if line.strip()]) <= 3
  if "full disk" in results:
    lines = [line for line in results["full disk"][2].splitlines() if line.startswith("error")]
    assert len(lines) == 1 and "saving the checkpoint of step 4 failed" in lines[0]
    # The disk fills in TensorStore's write (its RESOURCE_EXHAUSTED) or in one
    # of Orbax's own files (errno 28), whichever writes the last free block.
    assert "RESOURCE_EXHAUSTED" in lines[0] or "No space left on device" in lines[0], lines[0]
    assert "the last good checkpoint is step 2" in lines[0]
    # Nor Orbax's own ERROR lines of that failure (absl's "E1126 05:30:34 ...").
    absl_errors = [line for line in results["full disk"][2].splitlines() if line[:1] in ("E", "W")]
    assert absl_errors == [] and "warning" not in results["full disk"][2]
