"""Colab notebooks run headless (code cells executed in order) on a tiny run."""

import json
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_notebook(path: str) -> dict:
  with open(path) as f:
    notebook = json.load(f)
  namespace = {}
  for cell in notebook["cells"]:
    if cell["cell_type"] == "code":
      exec(compile("".join(cell["source"]), path, "exec"), namespace)
  return namespace


def test_traversal_colab(tmp_path, monkeypatch, capsys):
  monkeypatch.setenv("HVL_COLAB_WORKDIR", str(tmp_path / "meru"))
  monkeypatch.setenv("HVL_COLAB_STEPS", "3")
  monkeypatch.chdir(ROOT)
  namespace = run_notebook(os.path.join(ROOT, "colabs", "traversals.ipynb"))
  paths = namespace["results"]
  assert len(paths) == 6
  texts = set(namespace["texts"]) | {"[ROOT]"}
  for path in paths:
    assert path and set(path) <= texts
    assert all(a != b for a, b in zip(path, path[1:]))  # consecutive duplicates merged
  # A Lorentz walk ends at the origin, which is [ROOT] itself.
  assert all(path[-1] == "[ROOT]" for path in paths)
