"""Where the test suite's time goes, per test file: seconds compiling against
running, and how many executables each file compiles.

Runs pytest with `HVL_COMPILE_METER_DIR` set (tests/fixtures/compile_meter.py
meters every test and the command-line runs it starts), then prints one row
per file, most expensive first:

  python benchmarks/suite_compile_time.py                      # the push tier, -n auto
  python benchmarks/suite_compile_time.py -- -m slow -n auto   # any pytest arguments
  python benchmarks/suite_compile_time.py --report=DIR         # the table of an earlier run

Columns: `wall` is the tests' own seconds (setup + call + teardown, summed
over the file's tests; with -n N workers the suite's wall time is about the
total over N); `compile` is JAX's trace + lowering + backend compile seconds
in the test process, `cmd compile` the same in the command-line runs the
tests started (their wall time is inside `wall`); `built` counts the
executables XLA compiled, `loaded` those the session's persistent cache
served instead. A file whose compile share is high and whose `built` is
large is the place to share a compiled step (a module- or session-scoped
fixture) or to shrink the shapes. docs/architecture.md ("The test suite")
says how to read it.
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PUSH_TIER = ["-q", "-n", "auto", "-m", "not slow"]


def read_rows(folder: str) -> list[dict]:
  rows = []
  for path in sorted(glob.glob(os.path.join(folder, "*.jsonl"))):
    if os.path.basename(path).startswith("children_"):
      continue  # a test's command-line runs, already folded into its row
    with open(path) as f:
      rows.extend(json.loads(line) for line in f if line.strip())
  return rows


def per_file(rows: list[dict]) -> dict[str, dict]:
  files: dict[str, dict] = collections.defaultdict(lambda: collections.defaultdict(float))
  for row in rows:
    totals = files[row["test"].split("::")[0]]
    totals["tests"] += 1
    totals["wall"] += row.get("wall_s", 0.0)
    totals["compile"] += sum(row.get(f"{s}_s", 0.0) for s in ("trace", "lower", "compile"))
    totals["cmd_compile"] += sum(
      row.get(f"child_{s}_s", 0.0) for s in ("trace", "lower", "compile")
    )
    for prefix in ("", "child_"):
      totals["loaded"] += row.get(f"{prefix}cache_load_n", 0)
      totals["built"] += row.get(f"{prefix}compile_n", 0) - row.get(f"{prefix}cache_load_n", 0)
  return files


def table(files: dict[str, dict]) -> str:
  header = (
    f"{'test file':58s} {'tests':>5s} {'wall s':>8s} {'compile s':>9s} "
    f"{'cmd compile s':>13s} {'share':>5s} {'built':>6s} {'loaded':>6s}"
  )
  lines = [header, "-" * len(header)]
  grand = collections.defaultdict(float)
  for name, t in sorted(files.items(), key=lambda kv: -kv[1]["wall"]):
    share = (t["compile"] + t["cmd_compile"]) / t["wall"] if t["wall"] else 0.0
    lines.append(
      f"{name:58s} {int(t['tests']):5d} {t['wall']:8.1f} {t['compile']:9.1f} "
      f"{t['cmd_compile']:13.1f} {share:5.0%} {int(t['built']):6d} {int(t['loaded']):6d}"
    )
    for key, value in t.items():
      grand[key] += value
  share = (grand["compile"] + grand["cmd_compile"]) / grand["wall"] if grand["wall"] else 0.0
  lines.append("-" * len(header))
  lines.append(
    f"{'all files':58s} {int(grand['tests']):5d} {grand['wall']:8.1f} {grand['compile']:9.1f} "
    f"{grand['cmd_compile']:13.1f} {share:5.0%} {int(grand['built']):6d} {int(grand['loaded']):6d}"
  )
  return "\n".join(lines)


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--report", help="print the table of an earlier run's folder and stop")
  parser.add_argument("--keep", help="folder for the per-test rows (default: a temporary one)")
  parser.add_argument("pytest_args", nargs="*", help="pytest arguments after --")
  args = parser.parse_args()
  if args.report:
    print(table(per_file(read_rows(args.report))))
    return 0
  folder = args.keep or tempfile.mkdtemp(prefix="hvl_compile_meter_")
  command = [sys.executable, "-m", "pytest", *(args.pytest_args or PUSH_TIER)]
  print("+", " ".join(command), flush=True)
  start = time.perf_counter()
  code = subprocess.call(command, cwd=REPO, env=dict(os.environ, HVL_COMPILE_METER_DIR=folder))
  print(f"pytest exit {code}, {time.perf_counter() - start:.0f} s of wall time; rows in {folder}")
  print(table(per_file(read_rows(folder))))
  return code


if __name__ == "__main__":
  sys.exit(main())
