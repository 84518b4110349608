"""The sugarcrepe, vl_checklist, multilabel and entailment evaluators through
the command line's own path (`evaluators.command_entries.one_evaluator` + `evaluate.evaluate`)
on a tiny trained MERU and CLIP run, on small files in each benchmark's
published layout built here from the HierarCaps mini images. Each figure
equals the same metric computed here from the run's own embeddings; one
end-to-end `python -m hyperbolic_vl.evaluate` run checks the flags."""

import json
import os
import shutil
import subprocess
import sys

import cheap_codegen
import numpy as np
import pytest
import shared_runs
from paths import HIERARCAPS_MINI, REPO

import hyperbolic_vl
from hyperbolic_vl import evaluate as evaluate_cli
from hyperbolic_vl.evaluators import command_entries, entailment, multilabel
from hyperbolic_vl.evaluators.datasets import images as eval_images
from hyperbolic_vl.evaluators.metrics import ranked_labels

pytestmark = shared_runs.ON_ONE_WORKER

MINI_CSV = HIERARCAPS_MINI / "hierarcaps_mini.csv"
MINI_IMAGES = sorted(os.listdir(HIERARCAPS_MINI / "images"))
CAPTIONS = [
  ("A blue bird sitting on a branch.", "A red bird sitting on a branch."),
  ("A table with three plates of food.", "A table with three cups of food."),
  ("A brown dog running across the grass.", "A grass running across the brown dog."),
  ("A red car parked on a quiet street.", "A red car parked on a busy street."),
  ("A slice of chocolate cake on a plate.", "A slice of cake on a chocolate plate."),
  ("A small white boat on a calm lake.", "A small black boat on a calm lake."),
]


@pytest.fixture(scope="module")
def benchmarks(tmp_path_factory):
  root = tmp_path_factory.mktemp("benchmarks")
  # SugarCrepe: data/*.json over a val2017 folder.
  shutil.copytree(HIERARCAPS_MINI / "images", root / "val2017")
  os.makedirs(root / "sugarcrepe")
  for category in (
    "add_obj",
    "add_att",
    "replace_obj",
    "replace_att",
    "replace_rel",
    "swap_obj",
    "swap_att",
  ):
    items = {
      str(i): {"filename": name, "caption": pos, "negative_caption": neg}
      for i, (name, (pos, neg)) in enumerate(zip(MINI_IMAGES, CAPTIONS))
    }
    (root / "sugarcrepe" / f"{category}.json").write_text(json.dumps(items))
  # VL-Checklist: a checkout with Object/Size/large of vg_obj, images under vg/.
  shutil.copytree(HIERARCAPS_MINI / "images", root / "vl" / "vg" / "VG_100K")
  corpus = root / "vl" / "corpus" / "v1" / "Object" / "Size" / "large"
  os.makedirs(corpus)
  (corpus / "vg_obj.yaml").write_text('ANNO_PATH: "data/large.json"\nIMG_ROOT: "vg/"\n')
  os.makedirs(root / "vl" / "data")
  rows = [[f"VG_100K/{n}", {"POS": [p], "NEG": [q]}] for n, (p, q) in zip(MINI_IMAGES, CAPTIONS)]
  (root / "vl" / "data" / "large.json").write_text(json.dumps(rows))
  # VOC 2007: the six images, "bird" positive on image 0, "dog" on 2, "car" on 3, "boat" on 5.
  voc = root / "VOC2007"
  os.makedirs(voc / "ImageSets" / "Main")
  os.makedirs(voc / "JPEGImages")
  for index, name in enumerate(MINI_IMAGES):
    shutil.copy(HIERARCAPS_MINI / "images" / name, voc / "JPEGImages" / f"{index:06d}.jpg")
  positive = {"bird": {0}, "dog": {2}, "car": {3}, "boat": {5}, "diningtable": {1, 4}}
  for name in multilabel.VOC_CLASSES:
    marks = [1 if i in positive.get(name, ()) else -1 for i in range(len(MINI_IMAGES))]
    (voc / "ImageSets" / "Main" / f"{name}_test.txt").write_text(
      "".join(f"{i:06d} {m:2d}\n" for i, m in enumerate(marks))
    )
  return root


def settings_of(type_name, root):
  return {
    "sugarcrepe": dict(path=str(root / "sugarcrepe"), image_root=str(root / "val2017")),
    "vl_checklist": dict(path=str(root / "vl"), types=("Object/Size/large",)),
    "multilabel": dict(dataset="voc2007", path=str(root / "VOC2007")),
    "entailment": dict(source="hierarcaps", path=str(MINI_CSV)),
  }[type_name]


@pytest.fixture(scope="module")
def runs():
  """{name: (workdir, loaded model)} of the session's shared tiny MERU, CLIP
  and PHyCLIP (a product of Lorentz spaces) runs."""
  trained = {}
  for name in ("meru", "clip", "phyclip"):
    workdir = shared_runs.trained_run(name)
    trained[name] = (workdir, hyperbolic_vl.load(workdir))
  return trained


@pytest.fixture(params=["meru", "clip", "phyclip"])
def run(request, runs):
  return (request.param, *runs[request.param])


def expected_figures(type_name, model, root):
  """The evaluator's metric computed here from the run's embeddings."""
  size = model.image_size
  if type_name in ("sugarcrepe", "vl_checklist"):
    paths = [str(HIERARCAPS_MINI / "images" / n) for n in MINI_IMAGES]
    pixels = eval_images.load_image_files(paths, size, "squeeze")
    if type_name == "sugarcrepe":
      image_emb = model.encode_images(pixels)
    else:  # the release's double normalisation
      image_emb = model.encode_pixel_values(pixels / 127.5 - 1.0)
    positive = np.diagonal(
      model.similarity(image_emb, model.encode_texts([p for p, _ in CAPTIONS]))
    )
    negative = np.diagonal(
      model.similarity(image_emb, model.encode_texts([q for _, q in CAPTIONS]))
    )
    accuracy = float(np.mean(positive > negative))
    if type_name == "sugarcrepe":
      return {"sugarcrepe/add_obj": accuracy, "sugarcrepe/overall": accuracy}
    return {"vl_checklist/Object/Size/large/vg_obj": accuracy, "vl_checklist/Object/Size": accuracy}
  if type_name == "multilabel":
    voc = root / "VOC2007" / "JPEGImages"
    paths = [str(voc / f"{i:06d}.jpg") for i in range(len(MINI_IMAGES))]
    names = [multilabel.VOC_PROMPT_NAMES.get(c, c) for c in multilabel.VOC_CLASSES]
    scores = model.similarity(
      model.encode_images(eval_images.load_image_files(paths, size, "crop")),
      model.class_embeddings(names, ("a photo of a {}.",)),
    )
    positive = {"bird": {0}, "dog": {2}, "car": {3}, "boat": {5}, "diningtable": {1, 4}}
    aps = [
      ranked_labels.average_precision(
        scores[:, c], [i in positive[name] for i in range(len(MINI_IMAGES))]
      )
      for c, name in enumerate(multilabel.VOC_CLASSES)
      if name in positive
    ]
    return {"multilabel/voc2007/map": float(np.mean(aps))}
  chains = [row.split(",")[1].split(" => ") for row in MINI_CSV.read_text().splitlines()[1:]]
  general, specific, labels = entailment.entailment_pairs(chains)
  if model.geometry == "lorentz":
    scores = -entailment.cone_ratio(
      model.encode_texts(general), model.encode_texts(specific), model.curv, 0.1
    )
  else:
    scores = entailment.cosine(model.encode_texts(general), model.encode_texts(specific))
  label = "entailment_hierarcaps_mini"
  return {
    f"entailment/{label}/auc_roc": ranked_labels.roc_auc(scores, labels),
    f"entailment/{label}/average_precision": ranked_labels.average_precision(scores, labels),
  }


@pytest.mark.parametrize("type_name", ["sugarcrepe", "vl_checklist", "multilabel", "entailment"])
def test_figures_on_tiny_runs_equal_the_metric_of_their_embeddings(run, benchmarks, type_name):
  _, _, model = run
  evals = command_entries.one_evaluator(
    type_name,
    [
      f"{k}={v if isinstance(v, str) else ','.join(v)}"
      for k, v in settings_of(type_name, benchmarks).items()
    ],
  )
  figures = evaluate_cli.evaluate(model.config, evals, model)
  if type_name == "entailment" and model.num_factors:
    # A product model has no single cone: the evaluator refuses it (one line,
    # printed by the registry) and gives no figures.
    assert not any(key.startswith("entailment/") for key in figures), figures
    return
  want = expected_figures(type_name, model, benchmarks)
  # float32 embeddings of the same inputs through the same compiled functions:
  # equal up to summation order in the batched encoders (batch sizes differ);
  # accuracies are counts, and the AP / AUC of rankings without near-ties.
  assert {k: figures[k] for k in want} == pytest.approx(want, abs=1e-6)


@pytest.mark.slow  # an end-to-end run of the command line
def test_command_line_runs_sugarcrepe(run, benchmarks, tmp_path):
  name, workdir, model = run
  output = tmp_path / "eval.json"
  completed = subprocess.run(
    [
      sys.executable,
      "-m",
      "hyperbolic_vl.evaluate",
      f"--workdir={workdir}",
      "--eval=sugarcrepe",
      f"--set=path={benchmarks / 'sugarcrepe'}",
      f"--set=image_root={benchmarks / 'val2017'}",
      f"--output={output}",
    ],
    cwd=REPO,
    env=dict(os.environ, XLA_FLAGS=cheap_codegen.XLA_FLAG, JAX_PLATFORMS="cpu"),
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert completed.returncode == 0, completed.stderr[-3000:]
  figures = json.loads(output.read_text())["figures"]
  want = expected_figures("sugarcrepe", model, benchmarks)
  assert {k: figures[k] for k in want} == pytest.approx(want, abs=1e-6)


def evaluate_command(*flags, timeout=600):
  return subprocess.run(
    [sys.executable, "-m", "hyperbolic_vl.evaluate", *flags],
    cwd=REPO,
    env=dict(os.environ, XLA_FLAGS=cheap_codegen.XLA_FLAG, JAX_PLATFORMS="cpu"),
    capture_output=True,
    text=True,
    timeout=timeout,
  )


@pytest.mark.slow  # two end-to-end runs of the command line over two runs
def test_one_table_across_runs_grows_by_rows(runs, benchmarks, tmp_path):
  pytest.importorskip("matplotlib")
  results, table, plot = tmp_path / "results.jsonl", tmp_path / "table.md", tmp_path / "table.png"
  workdirs = [f"--workdir={runs[name][0]}" for name in ("meru", "clip")]
  render = [f"--results={results}", f"--table={table}", f"--plot={plot}"]
  entail = ["--eval=entailment", "--set=source=hierarcaps", f"--set=path={MINI_CSV}"]
  first = evaluate_command(*workdirs, "--run_name=MERU", "--run_name=CLIP", *entail, *render)
  assert first.returncode == 0, first.stderr[-3000:]
  rows = [json.loads(line) for line in results.read_text().splitlines()]
  assert [r["run"] for r in rows] == ["MERU", "CLIP"]
  # The rows hold the evaluator's figures for each run.
  for row, name in zip(rows, ("meru", "clip")):
    want = expected_figures("entailment", runs[name][1], benchmarks)
    assert {k: row["figures"][k] for k in want} == pytest.approx(want, abs=1e-6)
  # A second evaluation of one run adds a row; the table keeps one row per
  # run and gains the new figures as columns (blank for the other run).
  sugar = ["--eval=sugarcrepe", f"--set=path={benchmarks / 'sugarcrepe'}"]
  sugar.append(f"--set=image_root={benchmarks / 'val2017'}")
  second = evaluate_command(workdirs[0], "--run_name=MERU", *sugar, *render)
  assert second.returncode == 0, second.stderr[-3000:]
  rows = [json.loads(line) for line in results.read_text().splitlines()]
  assert [r["run"] for r in rows] == ["MERU", "CLIP", "MERU"]
  lines = table.read_text().splitlines()
  header = [c.strip() for c in lines[0].strip("|").split("|")]
  cells = {line.split("|")[1].strip(): line.strip("|").split("|")[1:] for line in lines[2:]}
  assert list(cells) == ["MERU", "CLIP"]
  auc = header.index("entailment/entailment_hierarcaps_mini/auc_roc") - 1
  overall = header.index("sugarcrepe/overall") - 1
  assert float(cells["MERU"][auc]) == pytest.approx(rows[0]["figures"][header[auc + 1]], abs=5e-4)
  assert float(cells["CLIP"][auc]) == pytest.approx(rows[1]["figures"][header[auc + 1]], abs=5e-4)
  assert float(cells["MERU"][overall]) == pytest.approx(
    rows[2]["figures"]["sugarcrepe/overall"], abs=5e-4
  )
  assert cells["CLIP"][overall].strip() == ""
  assert "skipped" not in lines[0]  # bookkeeping figures are no columns
  assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  # Rendering alone, from the results file, gives the same table.
  again = evaluate_command(f"--results={results}", f"--table={tmp_path / 'again.md'}")
  assert again.returncode == 0, again.stderr[-3000:]
  assert (tmp_path / "again.md").read_text() == table.read_text()
