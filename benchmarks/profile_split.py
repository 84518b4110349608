"""Splits a jax.profiler trace's device time by kernel class.

  python -m hyperbolic_vl.tools.step_throughput --config=configs/meru.py:vit_b \
      --config.input.batch_size=256 --steps=10 --profile_dir=/tmp/profile_meru
  python benchmarks/profile_split.py --profile=/tmp/profile_meru --top=3

Reads the newest trace under the folder (`perfetto_trace.json.gz`, else
`<host>.trace.json.gz`: Chrome trace-event JSON, one event per kernel with
its HLO instruction in `args.hlo_op`) and, when present, the compiled
step's HLO (`step.hlo.txt`, written by `step_throughput --profile_dir`).
Each kernel's class comes from its HLO instruction (read by the package's
parser, `hyperbolic_vl.tools.hlo_text.parse_hlo`): what the instruction
and the computations it calls contain, and the jax name scopes in their
metadata (`attention` in models/transformer.py, `optimizer` in
train.make_train_step). Without the HLO the kernel's name decides.

Classes, first match wins: collectives (all-reduce, all-gather,
reduce-scatter, all-to-all, collective-permute, NCCL kernels); attention
(an instruction from the `attention` scope, cuDNN fused attention);
matmul/conv (a dot, convolution or GEMM custom call inside); optimizer (an
instruction from the `optimizer` scope inside: XLA fuses the update with
the ops around it); reductions (a reduce inside); fusions (any other
fusion); other (copies, transposes, control flow).

Device time: on a GPU, the kernels on the device's streams; on a CPU the
trace holds host threads only, and the time is that of the XLA ops the
threads ran (per-op events need XLA_FLAGS=--xla_cpu_enable_xprof_traceme=true,
which step_throughput --profile_dir sets), summed over threads: ops that
ran side by side on several threads each count in full. Time is self time:
an op's events nested in another op (a while loop's body) are taken out of
the outer one.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import glob
import gzip
import json
import os
import re
import sys

from hyperbolic_vl.tools.hlo_text import COLLECTIVES, HloModule, Instruction, parse_hlo

CLASSES = (
  "matmul/conv",
  "attention",
  "fusions",
  "reductions",
  "collectives",
  "optimizer",
  "other",
)
MATMUL_OPCODES = ("dot", "convolution", "ragged-dot")
# Custom-call targets of library matmuls and convolutions (cuBLAS, cuBLASLt,
# cuDNN convolutions, Triton GEMM fusions) and of cuDNN fused attention.
MATMUL_TARGETS = re.compile(r"gemm|matmul|cublas|conv", re.IGNORECASE)
ATTENTION_TARGETS = re.compile(r"fmha|flash|attention", re.IGNORECASE)
# Kernel names when no HLO says what a kernel computes.
NAME_RULES = (
  (
    "collectives",
    re.compile(
      r"nccl|all[-_]?reduce|all[-_]?gather|reduce[-_]?scatter|"
      r"all[-_]?to[-_]?all|collective",
      re.IGNORECASE,
    ),
  ),
  # cuDNN's fused attention kernels are named "..._sdpa_..._flash_fprop_...".
  ("attention", re.compile(r"fmha|flash|attention|sdpa", re.IGNORECASE)),
  # "nvjet_sm90_...": cuBLASLt's Hopper GEMM kernels (CUDA 13, an H100).
  (
    "matmul/conv",
    re.compile(r"gemm|matmul|cublas|cutlass|xmma|nvjet|conv|^dot", re.IGNORECASE),
  ),
  ("reductions", re.compile(r"reduce|reduction", re.IGNORECASE)),
  ("fusions", re.compile(r"fusion", re.IGNORECASE)),
)
SCOPE = r"(?:^|[/(]){}(?:[/)]|$)"
ATTENTION_SCOPE = re.compile(SCOPE.format("attention"))
OPTIMIZER_SCOPE = re.compile(SCOPE.format("optimizer"))


def _inside(module: HloModule, instruction: Instruction) -> list[Instruction]:
  """The instruction and everything in the computations it calls."""
  out, stack, seen = [instruction], list(instruction.calls), set()
  while stack:
    name = stack.pop()
    if name in seen or name not in module.computations:
      continue
    seen.add(name)
    for inner in module.computations[name]:
      out.append(inner)
      stack.extend(inner.calls)
  return out


def _base_opcode(opcode: str) -> str:
  return re.sub(r"-(start|done|update)$", "", opcode)


def classify_instruction(module: HloModule, name: str) -> str | None:
  """The class of HLO instruction `name` of `module`; None if absent."""
  instruction = module.instructions.get(name)
  if instruction is None:
    return None
  if _base_opcode(instruction.opcode) in COLLECTIVES:
    return "collectives"
  inside = _inside(module, instruction)
  if any(_base_opcode(i.opcode) in COLLECTIVES for i in inside):
    return "collectives"
  if any(ATTENTION_TARGETS.search(i.target) for i in inside if i.target):
    return "attention"
  if any(ATTENTION_SCOPE.search(i.op_name) for i in inside if i.op_name):
    return "attention"
  if any(
    i.opcode in MATMUL_OPCODES or (i.target and MATMUL_TARGETS.search(i.target)) for i in inside
  ):
    return "matmul/conv"
  # XLA fuses the update with what surrounds it (the NaN guard's select, a
  # gradient's last reduction): any op of the scope makes it the optimizer's.
  if any(OPTIMIZER_SCOPE.search(i.op_name) for i in inside if i.op_name):
    return "optimizer"
  if any(i.opcode in ("reduce", "reduce-window") for i in inside):
    return "reductions"
  if instruction.opcode == "fusion":
    return "fusions"
  return "other"


def classify_name(name: str) -> str:
  """A kernel's class from its name alone (no HLO)."""
  for kind, pattern in NAME_RULES:
    if pattern.search(name):
      return kind
  return "other"


def find_trace(path: str) -> str:
  """The trace file itself, or the newest one under a profile folder."""
  if os.path.isfile(path):
    return path
  candidates = glob.glob(os.path.join(path, "**", "perfetto_trace.json.gz"), recursive=True)
  if not candidates:
    candidates = glob.glob(os.path.join(path, "**", "*.trace.json.gz"), recursive=True)
  if not candidates:
    raise FileNotFoundError(f"no perfetto_trace.json.gz or *.trace.json.gz under {path}")
  return max(candidates, key=os.path.getmtime)


def find_hlo(path: str) -> str | None:
  folder = path if os.path.isdir(path) else os.path.dirname(path)
  while folder and folder != os.path.dirname(folder):
    candidate = os.path.join(folder, "step.hlo.txt")
    if os.path.exists(candidate):
      return candidate
    folder = os.path.dirname(folder)
  return None


def load_events(trace_path: str) -> list[dict]:
  opener = gzip.open if trace_path.endswith(".gz") else open
  with opener(trace_path, "rt") as f:
    data = json.load(f)
  return data["traceEvents"] if isinstance(data, dict) else data


def device_op_events(events: list[dict]) -> list[dict]:
  """The complete events that are kernels or XLA ops: on a GPU/TPU trace the
  device processes' stream (or op) lines; on a CPU trace the host events
  that name an HLO instruction."""
  processes, threads = {}, {}
  for event in events:
    if event.get("ph") != "M":
      continue
    if event.get("name") == "process_name":
      processes[event["pid"]] = event.get("args", {}).get("name", "")
    elif event.get("name") == "thread_name":
      threads[(event["pid"], event.get("tid"))] = event.get("args", {}).get("name", "")
  complete = [e for e in events if e.get("ph") == "X" and "dur" in e]
  devices = {pid for pid, name in processes.items() if name.startswith("/device:")}
  if devices:
    on_device = [e for e in complete if e["pid"] in devices]
    streams = [
      e for e in on_device if "stream" in threads.get((e["pid"], e.get("tid")), "").lower()
    ]
    if streams:
      return streams
    ops = [e for e in on_device if "XLA Ops" in threads.get((e["pid"], e.get("tid")), "")]
    return ops or on_device
  return [e for e in complete if "hlo_op" in e.get("args", {})]


def self_times(events: list[dict]) -> list[float]:
  """Each event's duration minus that of the events nested directly in it on
  the same thread (microseconds). Nested means inside: an event that starts
  before the previous one ends but ends after it is the next kernel, not a
  child (an H100's stream timestamps overlapped so by about 0.1 us on 70% of
  consecutive kernels; counted as children, they made whole classes'
  self times negative)."""
  result = [float(e["dur"]) for e in events]
  by_thread = collections.defaultdict(list)
  for index, event in enumerate(events):
    by_thread[(event.get("pid"), event.get("tid"))].append(index)
  for indices in by_thread.values():
    indices.sort(key=lambda i: (float(events[i]["ts"]), -float(events[i]["dur"])))
    stack: list[int] = []
    for i in indices:
      start = float(events[i]["ts"])
      end = start + float(events[i]["dur"])
      end_of = lambda j: float(events[j]["ts"]) + float(events[j]["dur"])
      while stack and (start >= end_of(stack[-1]) or end > end_of(stack[-1])):
        stack.pop()
      if stack:
        result[stack[-1]] -= float(events[i]["dur"])
      stack.append(i)
  return result


@dataclasses.dataclass
class Split:
  seconds: dict[str, float]  # class -> seconds
  counts: dict[str, int]  # class -> kernels
  top: dict[str, list[tuple[str, float]]]  # class -> [(op, seconds)], largest first
  module: str | None  # the HLO module the events were matched against
  skipped: int  # events of other modules

  @property
  def total(self) -> float:
    return sum(self.seconds.values())


def split(trace_path: str, hlo_text: str | None = None) -> Split:
  """Device time by class (seconds) of the op events of a trace; with the
  step's HLO, only that module's events, classified by their instruction."""
  events = device_op_events(load_events(trace_path))
  module = parse_hlo(hlo_text) if hlo_text else None
  seconds = dict.fromkeys(CLASSES, 0.0)
  counts = dict.fromkeys(CLASSES, 0)
  per_op = {kind: collections.Counter() for kind in CLASSES}
  skipped = 0
  for event, micros in zip(events, self_times(events)):
    args = event.get("args", {})
    op = args.get("hlo_op") or event.get("name", "")
    kind = None
    if module is not None:
      if args.get("hlo_module") not in (None, module.name):
        skipped += 1
        continue
      kind = classify_instruction(module, op)
    if kind is None:
      kind = classify_name(event.get("name", "") or op)
    seconds[kind] += micros * 1e-6
    counts[kind] += 1
    per_op[kind][op] += micros * 1e-6
  top = {kind: per_op[kind].most_common() for kind in CLASSES}
  return Split(seconds, counts, top, module.name if module else None, skipped)


def format_table(result: Split, steps: int, top: int = 0) -> str:
  total = result.total
  lines = [f"{'class':<13} {'ms/step':>10} {'share':>7} {'kernels/step':>13}"]
  for kind in CLASSES:
    seconds = result.seconds[kind]
    share = seconds / total if total else 0.0
    lines.append(
      f"{kind:<13} {1e3 * seconds / steps:>10.3f} {share:>7.1%} {result.counts[kind] / steps:>13.1f}"
    )
    for op, op_seconds in result.top[kind][:top]:
      lines.append(f"    {op:<40.40} {1e3 * op_seconds / steps:>10.3f}")
  lines.append(
    f"{'total':<13} {1e3 * total / steps:>10.3f} {1.0:>7.1%} "
    f"{sum(result.counts.values()) / steps:>13.1f}"
  )
  return "\n".join(lines)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument(
    "--profile", required=True, help="profile folder (step_throughput --profile_dir) or trace file"
  )
  parser.add_argument("--hlo", default=None, help="the step's HLO text (default: step.hlo.txt)")
  parser.add_argument("--steps", type=int, default=3, help="steps in the trace (per-step figures)")
  parser.add_argument("--top", type=int, default=0, help="list this many largest ops per class")
  args = parser.parse_args(argv)
  trace_path = find_trace(args.profile)
  hlo_path = args.hlo or find_hlo(args.profile)
  hlo_text = None
  if hlo_path:
    with open(hlo_path) as f:
      hlo_text = f.read()
  result = split(trace_path, hlo_text)
  print(f"trace: {trace_path}")
  print(f"hlo:   {hlo_path or 'none (classes from kernel names)'}")
  if result.module:
    print(f"module {result.module}; {result.skipped} events of other modules left out")
  if not result.total:
    print(
      "no op events in the trace (on a CPU, XLA_FLAGS needs --xla_cpu_enable_xprof_traceme=true)",
      file=sys.stderr,
    )
    return 1
  print(format_table(result, args.steps, args.top))
  return 0


if __name__ == "__main__":
  sys.exit(main())
