"""Every bad input a user can give `python -m hyperbolic_vl.evaluate` ends in
one line on stderr (no traceback) and exit code 2, and leaves every file as
it was: a results file keeps its rows byte for byte, a table or picture is
not half written. A multi-run evaluation survives a run that an evaluator
refuses (its row says so), and Ctrl-C ends in one line, exit code 130, with
the rows already appended kept. docs/evaluation.md lists these behaviours.

The table runs the command's own `main` in this process (the flags parsed
into a FlagValues of the test's own): the same code as the command line
without a JAX import per case. The Ctrl-C case is a real process, sent
SIGINT (slow tier); the push tier interrupts the command in this process.
Runs are the session's shared tiny MERU and PHyCLIP runs."""

import collections
import hashlib
import json
import os
import signal
import subprocess
import sys

import interactive
import pytest
import shared_runs
from absl import flags, logging
from paths import HIERARCAPS_MINI, REPO
from PIL import Image

from hyperbolic_vl import errors, files
from hyperbolic_vl import evaluate as evaluate_command
from hyperbolic_vl.evaluators import multilabel, sugarcrepe

pytestmark = shared_runs.ON_ONE_WORKER

MINI_CSV = HIERARCAPS_MINI / "hierarcaps_mini.csv"
OLD_ROW = {"run": "earlier", "figures": {"entailment/world/auc_roc": 0.5}}


def digest(folder) -> dict:
  """{relative path: sha256} of every file under `folder`."""
  return {
    os.path.relpath(os.path.join(root, name), folder): hashlib.sha256(
      open(os.path.join(root, name), "rb").read()
    ).hexdigest()
    for root, _, names in os.walk(folder)
    for name in names
  }


def run_main(argv, monkeypatch, capsys) -> tuple[int, str, str]:
  """(exit code, stdout, stderr) of `python -m hyperbolic_vl.evaluate ARGV`,
  run in this process."""
  flag_values = flags.FlagValues()
  evaluate_command.define_flags(flag_values)
  flag_values(["evaluate", *argv])
  monkeypatch.setattr(evaluate_command, "FLAGS", flag_values)
  monkeypatch.setattr(flags, "FLAGS", flag_values)  # errors.report_user_errors reads it
  capsys.readouterr()
  verbosity = logging.get_verbosity()  # main quiets absl's INFO; the other tests keep theirs
  try:
    evaluate_command.main(["evaluate"])
    code = 0
  except SystemExit as exit_:
    code = exit_.code
  finally:
    logging.set_verbosity(verbosity)
  out, err = capsys.readouterr()
  return code, out, err


def voc_folder(root, name, bird_file=None):
  """A VOC2007 folder of two images, every class file well formed except
  bird_test.txt, which holds `bird_file` when given."""
  folder = root / name
  (folder / "JPEGImages").mkdir(parents=True)
  (folder / "ImageSets" / "Main").mkdir(parents=True)
  for index in range(2):
    Image.new("RGB", (8, 8), (100 * index, 0, 0)).save(folder / "JPEGImages" / f"00000{index}.jpg")
  for name_ in multilabel.VOC_CLASSES:
    text = "000000  1\n000001 -1\n" if name_ != "bird" or bird_file is None else bird_file
    (folder / "ImageSets" / "Main" / f"{name_}_test.txt").write_text(text)
  return folder


@pytest.fixture(scope="module")
def data(tmp_path_factory):
  """Benchmark files as a user gets them wrong, each in its own folder."""
  root = tmp_path_factory.mktemp("evaluate_bad_inputs")
  (root / "images").mkdir()
  Image.new("RGB", (8, 8)).save(root / "images" / "a.jpg")
  (root / "wrong_column.csv").write_text("id,caption,image_url\n0,a => b => c => d,x.jpg\n")
  (root / "empty.csv").write_text("")
  (root / "three_tiers.csv").write_text("id,captions,image_url\n0,a => b => c,x.jpg\n")
  # SugarCrepe's seven files with another layout's keys, their images present.
  (root / "sugarcrepe").mkdir()
  for category in sugarcrepe.CATEGORIES:
    items = {"0": {"image": "a.jpg", "pos": "a red bird", "neg": "a blue bird"}}
    (root / "sugarcrepe" / f"{category}.json").write_text(json.dumps(items))
  # A VL-Checklist checkout whose samples are objects, not [image, texts].
  corpus = root / "vl" / "corpus" / "v1" / "Object" / "Size" / "large"
  corpus.mkdir(parents=True)
  (corpus / "vg_obj.yaml").write_text('ANNO_PATH: "data/large.json"\nIMG_ROOT: "vg/"\n')
  (root / "vl" / "data").mkdir()
  (root / "vl" / "vg").mkdir()
  Image.new("RGB", (8, 8)).save(root / "vl" / "vg" / "a.jpg")
  samples = [{"image": "a.jpg", "positive": "a large bird", "negative": "a small bird"}]
  (root / "vl" / "data" / "large.json").write_text(json.dumps(samples))
  # COCO instances with images and categories but no annotation.
  coco = {"images": [{"id": 1, "file_name": "a.jpg"}], "categories": [{"id": 1, "name": "bird"}]}
  (root / "instances_empty.json").write_text(json.dumps({**coco, "annotations": []}))
  return {
    "root": root,
    "voc yes": voc_folder(root, "voc_yes", "000000 yes\n000001 -1\n"),
    "voc extra column": voc_folder(root, "voc_extra", "000000 1 1\n000001 -1\n"),
    "voc empty": voc_folder(root, "voc_empty", ""),
    "voc other images": voc_folder(root, "voc_other", "000000  1\n000002 -1\n"),
  }


@pytest.fixture(scope="module")
def runs():
  return {name: shared_runs.trained_run(name) for name in ("meru", "phyclip")}


def cases(data, runs, out):
  """name -> (flags, expected text of the one stderr line)."""
  root = data["root"]
  meru, phyclip = f"--workdir={runs['meru']}", f"--workdir={runs['phyclip']}"
  results = f"--results={out / 'results.jsonl'}"
  world = ["--eval=entailment", "--set=source=world"]
  hierarcaps = ["--eval=entailment", "--set=source=hierarcaps"]
  voc = ["--eval=multilabel", "--set=dataset=voc2007"]
  return {
    "results is a folder": ([meru, *world, f"--results={out}"], "is a folder; give a file path"),
    "table is a folder": (
      [results, f"--table={out}"],
      f"--table={out} is a folder; give a file path",
    ),
    "plot under a file": (
      [meru, *world, results, f"--plot={out / 'results.jsonl' / 'p.png'}"],
      "results.jsonl is a file, not a folder",
    ),
    "HierarCaps CSV with a wrong column": (
      [meru, *hierarcaps, f"--set=path={root / 'wrong_column.csv'}", results],
      "wrong_column.csv has no column(s) ['captions']; columns: ['id', 'caption', 'image_url']",
    ),
    "HierarCaps CSV empty": (
      [meru, *hierarcaps, f"--set=path={root / 'empty.csv'}", results],
      "empty.csv is empty; expected a header row with ['captions']",
    ),
    "HierarCaps CSV of malformed rows": (
      [meru, *hierarcaps, f"--set=path={root / 'three_tiers.csv'}", results],
      "three_tiers.csv (1 malformed, row 1: expected 4 tiers separated by ' => ', got 3)",
    ),
    "entailment on a product run": (
      [phyclip, *hierarcaps, f"--set=path={MINI_CSV}", results],
      "this model's geometry is 'product'",
    ),
    "VOC row '000000 yes'": (
      [meru, *voc, f"--set=path={data['voc yes']}", results],
      "bird_test.txt line 1 is '000000 yes'; expected '<image id> <1, -1 or 0>'",
    ),
    "VOC row with an extra column": (
      [meru, *voc, f"--set=path={data['voc extra column']}", results],
      "bird_test.txt line 1 is '000000 1 1'; expected",
    ),
    "VOC class file empty": (
      [meru, *voc, f"--set=path={data['voc empty']}", results],
      "bird_test.txt is empty; expected a line '<image id> <1, -1 or 0>' per test image",
    ),
    "VOC class files listing other images": (
      [meru, *voc, f"--set=path={data['voc other images']}", results],
      "bird_test.txt lists other images than",
    ),
    "COCO instances without annotations": (
      [
        meru,
        "--eval=multilabel",
        "--set=dataset=coco",
        f"--set=path={root / 'instances_empty.json'}",
        f"--set=image_root={root / 'images'}",
      ],
      "instances_empty.json holds no annotations (boxes)",
    ),
    "SugarCrepe with other keys": (
      [
        meru,
        "--eval=sugarcrepe",
        f"--set=path={root / 'sugarcrepe'}",
        f"--set=image_root={root / 'images'}",
      ],
      "7 item(s) lack the text fields filename, caption, negative_caption "
      "(add_obj.json item '0' has ['image', 'neg', 'pos'])",
    ),
    # A folder that is not a checkout: the one line names the layout expected.
    "VL-Checklist folder without its corpus": (
      [meru, "--eval=vl_checklist", f"--set=path={root / 'images'}"],
      "corpus/v1/<type>/<corpus>.yaml",
    ),
    "VL-Checklist with other keys": (
      [meru, "--eval=vl_checklist", f"--set=path={root / 'vl'}", "--set=types=Object/Size/large"],
      '1 sample(s) are not [image, {"POS": [text, ...], "NEG": [text, ...]}] (large.json sample 0',
    ),
  }


CASE_NAMES = list(cases(collections.defaultdict(lambda: REPO), collections.defaultdict(str), REPO))


@pytest.mark.parametrize("name", CASE_NAMES)
def test_a_bad_input_is_one_line_exit_2_and_nothing_written(
  name, data, runs, tmp_path, monkeypatch, capsys
):
  out = tmp_path / "out"
  out.mkdir()
  (out / "results.jsonl").write_text(json.dumps(OLD_ROW) + "\n")  # a row of an earlier command
  argv, expected = cases(data, runs, out)[name]
  before = digest(tmp_path), digest(data["root"])
  code, stdout, stderr = run_main(argv, monkeypatch, capsys)
  lines = stderr.splitlines()
  assert code == errors.EXIT_USER_ERROR, (stdout[-2000:], stderr)
  assert len(lines) == 1 and lines[0].startswith("error: "), lines
  assert expected in lines[0], lines
  assert "Traceback" not in stdout + stderr
  assert "/." not in lines[0]  # no hidden temporary file is named
  assert "done in" not in stdout  # a refused evaluator is not reported as done
  assert (digest(tmp_path), digest(data["root"])) == before  # nothing written, nothing lost
  if name in ("results is a folder", "table is a folder", "plot under a file"):
    assert stdout == ""  # refused before any model loaded or evaluator ran


def test_a_file_written_over_a_folder_names_the_folder_not_a_temporary_file(tmp_path):
  """What --table=DIR met after an evaluation: the atomic write's rename
  failed naming its hidden temporary file."""
  folder = tmp_path / "table.md"
  folder.mkdir()
  with pytest.raises(IsADirectoryError) as raised:
    files.write_file_atomically(str(folder), "| run |\n")
  assert errors.is_user_error(raised.value)
  assert errors.one_line(raised.value) == f"Is a directory: {folder}"
  assert sorted(os.listdir(tmp_path)) == ["table.md"] and os.listdir(folder) == []


def table_cells(path) -> dict:
  """{run: [cells]} of a markdown table, with its header under "run"."""
  rows = [line.strip("|").split("|") for line in path.read_text().splitlines()]
  table = {"run": [cell.strip() for cell in rows[0][1:]]}
  table.update({row[0].strip(): [cell.strip() for cell in row[1:]] for row in rows[2:]})
  return table


def test_a_refused_run_is_a_row_of_the_table_and_the_others_go_on(
  runs, tmp_path, monkeypatch, capsys
):
  """Issue 45's command: entailment over a PHyCLIP run (refused: a product
  of spaces has no one cone) and a MERU run, into a results file, a table
  and a picture."""
  pytest.importorskip("matplotlib")
  results, table, plot = tmp_path / "results.jsonl", tmp_path / "table.md", tmp_path / "table.png"
  code, stdout, stderr = run_main(
    [
      f"--workdir={runs['phyclip']}",
      f"--workdir={runs['meru']}",
      "--eval=entailment",
      "--set=source=hierarcaps",
      f"--set=path={MINI_CSV}",
      f"--results={results}",
      f"--table={table}",
      f"--plot={plot}",
    ],
    monkeypatch,
    capsys,
  )
  assert (code, stderr) == (0, ""), stdout[-3000:]
  name = "entailment_hierarcaps_mini"
  refusal = f"Evaluator '{name}' refused: entailment detection is defined for Lorentz models"
  assert refusal in stdout
  assert f"{name} done in" in stdout  # the MERU run, once
  assert stdout.count(f"{name} done in") == 1
  phyclip_row, meru_row = [json.loads(line) for line in results.read_text().splitlines()]
  assert (phyclip_row["run"], meru_row["run"]) == ("phyclip", "meru")
  assert phyclip_row["figures"] == {} and meru_row["refused"] == {}
  reason = phyclip_row["refused"][name]
  assert reason.endswith("this model's geometry is 'product'")
  auc = f"entailment/{name}/auc_roc"
  assert 0.0 <= meru_row["figures"][auc] <= 1.0
  cells = table_cells(table)
  assert cells["run"][-1] == "refused"
  column = cells["run"].index(auc)
  assert cells["phyclip"][column] == "" and cells["phyclip"][-1] == f"refused: {name}: {reason}"
  assert float(cells["meru"][column]) == pytest.approx(meru_row["figures"][auc], abs=5e-4)
  assert cells["meru"][-1] == ""
  assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow  # a process of its own (JAX's import, a model load); the push tier has the
# in-process interrupt below
def test_ctrl_c_is_one_line_exit_130_and_keeps_the_results_file(runs, tmp_path):
  """SIGINT (what Ctrl-C sends) to the command while it evaluates: one line,
  exit code 130, an earlier command's rows kept byte for byte."""
  results = tmp_path / "results.jsonl"
  results.write_text(json.dumps(OLD_ROW) + "\n")
  before = results.read_bytes()
  process = interactive.popen(
    [
      sys.executable,
      "-m",
      "hyperbolic_vl.evaluate",
      f"--workdir={runs['meru']}",
      "--eval=entailment",
      "--set=source=world",
      f"--results={results}",
    ],
    cwd=REPO,
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
  )
  started = process.stdout.readline()  # "entailment ...": the model is loaded, evaluation begins
  process.send_signal(signal.SIGINT)
  stdout, stderr = process.communicate(timeout=120)
  # JAX and TensorFlow's C++ start-up lines (I..., W...) are no part of the report.
  lines = [line for line in stderr.splitlines() if line and line[:1] not in "IW"]
  assert started == "entailment ...\n", (started, stdout[-2000:], stderr[-3000:])
  assert process.returncode == 130, (stdout[-2000:], stderr[-3000:])
  assert lines == ["interrupted: 0 of 1 run(s) evaluated"], lines
  assert "Traceback" not in stderr
  assert results.read_bytes() == before


def test_an_interrupt_keeps_the_rows_of_the_runs_evaluated(runs, tmp_path, monkeypatch, capsys):
  """Ctrl-C while the second of two runs is evaluated (KeyboardInterrupt
  raised there, as Python's SIGINT handler does): the first run's row is
  kept, whole, after an earlier command's."""
  results = tmp_path / "results.jsonl"
  results.write_text(json.dumps(OLD_ROW) + "\n")
  evaluate = evaluate_command.evaluate
  calls = []

  def interrupted_second_time(*args, **kwargs):
    calls.append(1)
    if len(calls) == 2:
      raise KeyboardInterrupt
    return evaluate(*args, **kwargs)

  monkeypatch.setattr(evaluate_command, "evaluate", interrupted_second_time)
  code, stdout, stderr = run_main(
    [
      f"--workdir={runs['meru']}",
      f"--workdir={runs['meru']}",
      "--run_name=first",
      "--run_name=second",
      "--eval=entailment",
      "--set=source=hierarcaps",
      f"--set=path={MINI_CSV}",
      f"--results={results}",
    ],
    monkeypatch,
    capsys,
  )
  assert code == 130, (stdout[-2000:], stderr)
  assert stderr == f"interrupted: 1 of 2 run(s) evaluated; {results} keeps their rows\n"
  rows = [json.loads(line) for line in results.read_text().splitlines()]
  assert [row["run"] for row in rows] == ["earlier", "first"]
  # 6 chains of the mini CSV, 4 tiers each: 6 x 6 tier pairs entail.
  assert rows[1]["figures"]["entailment/entailment_hierarcaps_mini/num_positive"] == 36.0
