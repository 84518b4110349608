"""Runs the colabs top to bottom in a headless Jupyter kernel.

    python colabs/run_notebooks.py                  # every colab, outputs discarded
    python colabs/run_notebooks.py --save           # ... and written into the .ipynb
    python colabs/run_notebooks.py traversals.ipynb

`--save` is how the committed outputs (the pictures a reader sees on the
repository page) are made: a run of the committed code with the colabs'
defaults (the Quick start's 1000-step runs, trained by the first colab that
needs them and shared by the others). Log lines a kernel writes to stderr
(JAX, absl) are left out of the saved notebooks; everything else is kept.
Needs nbclient and ipykernel (both in the `test` extra); the test suite
runs the same function on tiny settings (tests/integration/test_colabs.py).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

COLABS = os.path.dirname(os.path.abspath(__file__))
# In the order that lets the later colabs reuse the first one's runs.
NOTEBOOKS = ("quickstart.ipynb", "traversals.ipynb", "embedding_space.ipynb")


def execute(path: str, env: dict[str, str] | None = None, timeout: int = 1800):
  """Executes the notebook at `path` (cells in order, in a fresh kernel whose
  working directory is the repository root) and returns it with its outputs.
  Raises nbclient's CellExecutionError naming the failing cell."""
  import nbclient
  import nbformat

  notebook = nbformat.read(path, as_version=4)
  client = nbclient.NotebookClient(
    notebook,
    timeout=timeout,
    kernel_name="python3",
    resources={"metadata": {"path": os.path.dirname(COLABS)}},
  )
  client.execute(env=dict(os.environ if env is None else env))
  return notebook


def without_stderr(notebook):
  """The notebook with stderr stream outputs removed (log lines)."""
  for cell in notebook.cells:
    if cell.cell_type == "code":
      cell.outputs = [
        output
        for output in cell.outputs
        if not (output.output_type == "stream" and output.get("name") == "stderr")
      ]
  return notebook


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("notebooks", nargs="*", default=list(NOTEBOOKS))
  parser.add_argument("--save", action="store_true", help="write the outputs into the files")
  args = parser.parse_args(argv)
  import nbformat

  for name in args.notebooks:
    path = os.path.join(COLABS, os.path.basename(name))
    start = time.perf_counter()
    notebook = execute(path)
    print(f"{name}: ran in {time.perf_counter() - start:.0f} s", flush=True)
    if args.save:
      nbformat.write(without_stderr(notebook), path)
      print(f"  saved its outputs to {path}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
