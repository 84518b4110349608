"""The package's import graph has no cycles, counting imports inside
functions too (a function-level import can hide a cycle but not remove it)."""

import ast
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "hyperbolic_vl"


def module_name(path: pathlib.Path) -> str:
  parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
  return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: pathlib.Path, modules: set[str]) -> set[str]:
  """Package modules `path` imports anywhere in its body, and those it names
  in "package.module:Name" strings (registries imported by name later)."""
  found = set()
  package = (
    module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
  )
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
      target = node.value.partition(":")[0]
      if ":" in node.value and target in modules:
        found.add(target)
      continue
    if isinstance(node, ast.Import):
      names = [alias.name for alias in node.names]
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:
        base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + [base])
      names = [base] + [f"{base}.{alias.name}" for alias in node.names]
    else:
      continue
    found.update(name.strip(".") for name in names if name.strip(".") in modules)
  return found


def discovered_packages(path: pathlib.Path, modules: set[str]) -> set[str]:
  """Packages whose every module `path` imports by listing the folder
  (`package_modules("pkg")`, how the registries find their built-ins)."""
  found = set()
  for node in ast.walk(ast.parse(path.read_text())):
    if (
      isinstance(node, ast.Call)
      and getattr(node.func, "id", getattr(node.func, "attr", "")) == "package_modules"
      and node.args
      and isinstance(node.args[0], ast.Constant)
      and node.args[0].value in modules
    ):
      found.add(node.args[0].value)
  return found


def import_graph() -> dict[str, set[str]]:
  paths = sorted(PACKAGE.rglob("*.py"))
  modules = {module_name(p) for p in paths}
  graph = {module_name(p): imported_modules(p, modules) for p in paths}
  # A registry imports every module of its folder on first lookup: edges from
  # the package to each of its modules (as importing the package could).
  for path in paths:
    for package in discovered_packages(path, modules):
      graph[package] |= {m for m in modules if m.rpartition(".")[0] == package}
  # Importing a.b.c runs a/__init__.py and a/b/__init__.py first. A module's
  # own ancestor packages are already being initialised when it runs (Python
  # imports them first), so an edge back to one is no cycle.
  for name in list(graph):
    ancestors = set(_with_parents(name))
    graph[name] = {
      parent
      for target in graph[name]
      for parent in _with_parents(target)
      if parent != name and parent not in ancestors
    }
  return graph


def _with_parents(name: str) -> list[str]:
  parts = name.split(".")
  return [".".join(parts[: i + 1]) for i in range(1, len(parts))]


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
  state, stack = {}, []

  def visit(node):
    state[node] = "open"
    stack.append(node)
    for target in sorted(graph.get(node, ())):
      if state.get(target) == "open":
        return stack[stack.index(target) :] + [target]
      if target not in state:
        cycle = visit(target)
        if cycle:
          return cycle
    stack.pop()
    state[node] = "done"
    return None

  for node in sorted(graph):
    if node not in state:
      cycle = visit(node)
      if cycle:
        return cycle
  return None


def test_the_finder_reports_a_planted_cycle():
  assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
  assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_the_package_has_no_import_cycle():
  graph = import_graph()
  # The registries' lazily imported modules count as edges.
  assert "hyperbolic_vl.objectives.hmid" in graph["hyperbolic_vl.objectives"]
  assert "hyperbolic_vl.data.tiers" in graph["hyperbolic_vl.data"]
  assert "hyperbolic_vl.evaluators.hcl" in graph["hyperbolic_vl.evaluators"]
  cycle = find_cycle(graph)
  assert cycle is None, " -> ".join(cycle)


# The trainer sits above everything it drives: only the entry point that
# trains (main.py), the measuring tools and the trainer's own modules import
# it (benchmarks/ and tests/ are outside the package).
MAY_IMPORT_THE_TRAINER = ("hyperbolic_vl.main", "hyperbolic_vl.tools.", "hyperbolic_vl.training")


def test_only_entry_points_and_tools_import_the_trainer():
  graph = import_graph()
  importers = sorted(
    module
    for module, targets in graph.items()
    if any(t.startswith("hyperbolic_vl.training") for t in targets)
    and not module.startswith(MAY_IMPORT_THE_TRAINER)
    and module != "hyperbolic_vl"
  )
  assert not importers, f"import the trainer from below it: {importers}"
  # The rule is checked against real edges.
  assert "hyperbolic_vl.training.loop" in graph["hyperbolic_vl.main"]


def test_run_records_never_import_the_pictures():
  """plots/ reads runs/ (metrics.jsonl, results files); the pictures are
  drawn by the command that asks for them, never from runs/."""
  graph = import_graph()
  upward = sorted(
    (module, target)
    for module, targets in graph.items()
    if module.startswith("hyperbolic_vl.runs")
    for target in targets
    if target.startswith("hyperbolic_vl.plots")
  )
  assert not upward, f"runs/ imports plots/: {upward}"
  # The rule is checked against real edges: the downward one exists.
  assert "hyperbolic_vl.runs.metrics_io" in graph["hyperbolic_vl.plots.training_curves"]
