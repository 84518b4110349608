"""benchmarks/release_table.py end to end on a random-weight checkpoint in
MERU's released layout (the reference module of test_interop.py, shrunk):
converted into a run directory, evaluated through the command line, one row
appended to the results table; a second call converts nothing and adds a row."""

import importlib.util
import json

import pytest
from paths import REPO

torch = pytest.importorskip("torch")
pytest.importorskip("timm")

import test_interop as refs  # noqa: E402

import hyperbolic_vl  # noqa: E402
from hyperbolic_vl.evaluators import registry  # noqa: E402

OVERRIDES = [
  "input.image_size=32",
  "input.tokenizer.context_length=16",
  "model.text_variant=mu",
  "model.image_variant=mu/8",
  "model.image_num_heads=4",
  "model.embed_dim=32",
]


def release_table_module():
  spec = importlib.util.spec_from_file_location(
    "release_table", REPO / "benchmarks" / "release_table.py"
  )
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


@pytest.mark.slow  # a conversion and two evaluation commands
def test_release_table_converts_evaluates_and_appends(tmp_path):
  torch.manual_seed(0)
  reference = refs.MeruReference(
    width=64, depth=2, heads=4, mlp_ratio=2, patch=8, embed_dim=32, vocab=49408, hyperbolic=True
  ).eval()
  checkpoint = tmp_path / "meru.pth"
  torch.save({"model": reference.state_dict(), "optimizer": {}}, checkpoint)
  out = tmp_path / "releases"
  argv = [
    f"--out_dir={out}",
    f"--release=meru_random,meru,{checkpoint},configs/meru.py:vit_s",
    *[f"--override=meru_random:{o}" for o in OVERRIDES],
    "--evaluate_flag=--eval=entailment",
    "--evaluate_flag=--set=source=world",
    "--evaluate_flag=--set=num_examples=8",
  ]
  script = release_table_module()
  script.main(argv)
  rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
  assert [r["run"] for r in rows] == ["meru_random"]
  # The row's figures are the evaluator's on the converted run, recomputed here.
  model = hyperbolic_vl.load(out / "meru_random")
  assert model.geometry == "lorentz" and model.curv == pytest.approx(0.7, rel=1e-6)
  evaluator = registry.get("entailment").build(
    "x", registry.entry("entailment", source="world", num_examples=8), model.config.input
  )
  want = evaluator(model)
  assert {k: rows[0]["figures"][k] for k in want} == pytest.approx(want, abs=1e-6)
  table = (out / "table.md").read_text()
  assert "| meru_random |" in table and "entailment/world/auc_roc" in table
  # Again: the run directory exists, nothing is converted, a row is added.
  script.main(argv)
  rows = (out / "results.jsonl").read_text().splitlines()
  assert len(rows) == 2
  assert (out / "table.md").read_text().count("| meru_random |") == 1
