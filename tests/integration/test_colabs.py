"""The colabs run headless top to bottom (a Jupyter kernel, as
colabs/run_notebooks.py runs them), each installing this checkout first as
its install cell does in CI, on tiny runs shared between them; every image
they output is a whole PNG, and the traversal colab checks its own walks."""

import base64
import importlib.util
import json
import tomllib

import pytest
from paths import REPO

pytest.importorskip("nbclient")
pytest.importorskip("matplotlib")

COLABS = REPO / "colabs"
spec = importlib.util.spec_from_file_location("run_notebooks", COLABS / "run_notebooks.py")
run_notebooks = importlib.util.module_from_spec(spec)
spec.loader.exec_module(run_notebooks)

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def colab_env(tmp_path_factory):
  """The kernel's environment: install this checkout into a fresh folder
  (once; later colabs find it there) and train 20-step runs (once)."""
  import os

  root = tmp_path_factory.mktemp("colabs")
  return dict(
    os.environ,
    HVL_INSTALL_SOURCE=str(REPO),
    HVL_INSTALL_TARGET=str(root / "site"),
    HVL_COLAB_ROOT=str(root / "runs"),
    HVL_COLAB_STEPS="20",
  )


def outputs(notebook, kind):
  for cell in notebook.cells:
    for output in cell.get("outputs", []):
      if kind == "png" and "image/png" in output.get("data", {}):
        yield base64.b64decode(output["data"]["image/png"])
      if kind == "stdout" and output.get("name") == "stdout":
        yield output["text"]


# One worker runs the colabs in this order, so the later ones reuse the
# install and the runs the first one made (xdist's loadgroup).
@pytest.mark.slow  # each trains and draws what the push tier's plot and evaluator tests cover
@pytest.mark.xdist_group("colabs")
@pytest.mark.parametrize("name", run_notebooks.NOTEBOOKS)
def test_colab_runs_headless_and_draws(name, colab_env):
  notebook = run_notebooks.execute(str(COLABS / name), env=colab_env, timeout=600)
  images = list(outputs(notebook, "png"))
  expected = {"quickstart.ipynb": 5, "traversals.ipynb": 2, "embedding_space.ipynb": 4}[name]
  assert len(images) == expected
  for image in images:
    assert image.startswith(PNG) and len(image) > 5000
  printed = "".join(outputs(notebook, "stdout"))
  assert "hyperbolic_vl 0.1.0 ready" in printed  # the install cell's check held
  if name == "traversals.ipynb":
    # The notebook asserts every walk ends at [ROOT] without repeats (MERU's
    # released rule) for both pools, then says so.
    assert printed.count("checked: every walk ends at [ROOT] with no repeated text") == 2


def test_every_colab_opens_with_its_badge_and_installs_this_repository():
  repository = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["urls"]["Repository"]
  path = repository.removeprefix("https://github.com/")
  for name in run_notebooks.NOTEBOOKS:
    cells = json.loads((COLABS / name).read_text())["cells"]
    first = "".join(cells[0]["source"])
    assert f"colab.research.google.com/github/{path}/blob/main/colabs/{name}" in first, name
    install = "".join(cells[1]["source"])
    assert f'REPOSITORY = "{repository}"' in install and "HVL_INSTALL_SOURCE" in install, name
    assert any("Use a real run instead" in "".join(c["source"]) for c in cells), name
