"""The house's rule: no function in the package is over 120 lines (counted
from its `def` to its last line, decorators and docstring included)."""

import ast
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "hyperbolic_vl"
MOST_LINES = 120


def function_lengths(source: str) -> dict[str, int]:
  """Lines of each function and method in `source`, by qualified name."""
  lengths = {}

  def visit(node, prefix):
    for child in ast.iter_child_nodes(node):
      name = f"{prefix}{getattr(child, 'name', '')}"
      if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
        first = min([child.lineno, *(d.lineno for d in child.decorator_list)])
        lengths[name] = child.end_lineno - first + 1
      nests = isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
      visit(child, f"{name}." if nests else prefix)

  visit(ast.parse(source), "")
  return lengths


def test_function_lengths_are_counted_from_def_to_last_line():
  source = "class A:\n  @staticmethod\n  def f():\n    def g():\n      pass\n    return 1\n"
  assert function_lengths(source) == {"A.f": 5, "A.f.g": 2}


def test_no_function_in_the_package_is_over_120_lines():
  over = [
    f"{path.relative_to(PACKAGE.parent)}:{name} ({lines} lines)"
    for path in sorted(PACKAGE.rglob("*.py"))
    for name, lines in function_lengths(path.read_text()).items()
    if lines > MOST_LINES
  ]
  assert not over, over
