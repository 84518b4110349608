"""Colab notebooks run headless (code cells executed in order) on a tiny run."""

import json
import os

import pytest
from paths import REPO

ROOT = str(REPO)


def run_notebook(path: str) -> dict:
  with open(path) as f:
    notebook = json.load(f)
  namespace = {}
  for cell in notebook["cells"]:
    if cell["cell_type"] == "code":
      exec(compile("".join(cell["source"]), path, "exec"), namespace)
  return namespace


@pytest.mark.slow  # an end-to-end run of the command line
def test_traversal_colab(tmp_path, monkeypatch):
  monkeypatch.setenv("HVL_COLAB_ROOT", str(tmp_path))
  monkeypatch.setenv("HVL_COLAB_STEPS", "3")
  monkeypatch.delenv("MERU_WORKDIR", raising=False)
  monkeypatch.delenv("CLIP_WORKDIR", raising=False)
  monkeypatch.chdir(ROOT)
  namespace = run_notebook(os.path.join(ROOT, "colabs", "traversals.ipynb"))
  results = namespace["results"]
  assert set(results) == {"MERU", "CLIP"}
  assert namespace["models"]["MERU"].geometry == "lorentz"
  assert namespace["models"]["CLIP"].geometry == "euclidean"
  texts = set(namespace["texts"]) | {"[ROOT]"}
  for paths in results.values():
    assert len(paths) == 6
    for path in paths:
      assert path and set(path) <= texts
      assert len(set(path)) == len(path)  # every repeat removed, as released
      # Both walks end on their [ROOT]: MERU's origin, CLIP's clip_root.
      assert path[-1] == "[ROOT]"
