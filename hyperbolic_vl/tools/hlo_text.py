"""What a compiled program's HLO text says, read without running it: the
package's one HLO parser (`parse_hlo`: computations, instructions, what
each calls), the collectives with the bytes each chip sends, an estimate of
HBM traffic and a summary of the entry computation (copies, transposes,
cuDNN attention calls). Pure text parsing, used by `tools/aot.py` on the
program XLA compiled for the target and by `benchmarks/profile_split.py` on
a profiled step's, and testable on hand-written HLO.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import re

import numpy as np

from hyperbolic_vl.tools import aot_targets

# Every collective opcode XLA writes (each also as `<kind>-start` and
# `<kind>-done` when asynchronous).
COLLECTIVES = (
  "all-gather",
  "all-reduce",
  "reduce-scatter",
  "collective-permute",
  "all-to-all",
  "collective-broadcast",
  "ragged-all-to-all",
  "send",
  "recv",
)
_DTYPE_BYTES = {
  "pred": 1,
  "s8": 1,
  "u8": 1,
  "s16": 2,
  "u16": 2,
  "f16": 2,
  "bf16": 2,
  "s32": 4,
  "u32": 4,
  "f32": 4,
  "s64": 8,
  "u64": 8,
  "f64": 8,
  "c64": 8,
  "c128": 16,
}


# ---------------------------------------------------------------------------
# The parser.
# ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Instruction:
  name: str
  opcode: str  # "fusion", "all-reduce-start", ...
  op_name: str  # metadata op_name: the jax name stack
  calls: tuple[str, ...]  # computations it calls (fusions, loops, branches)
  target: str  # custom_call_target
  line: str  # as written


@dataclasses.dataclass(frozen=True)
class HloModule:
  name: str
  computations: dict[str, list[Instruction]]  # in the text's order
  instructions: dict[str, Instruction]  # by name, over every computation
  entry: str | None  # the entry computation's name

  def lines(self, computation: str) -> list[str]:
    return [instruction.line for instruction in self.computations.get(computation, [])]


_HEADER = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$")
_INSTRUCTION = re.compile(r"^\s+(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*)$")
_OPCODE = re.compile(r"(?:^|\s)([a-z][a-z0-9_\-]*)\(")
_CALLS = re.compile(r"(?:calls|body|condition|branch_computations)=(\{[^}]*\}|%?[\w.\-]+)")
_OP_NAME = re.compile(r'op_name="([^"]*)"')
_TARGET = re.compile(r'custom_call_target="([^"]*)"')


def parse_hlo(text: str) -> HloModule:
  """The instructions of an HLO module's text, by computation and by name."""
  first = text.lstrip().splitlines()[0] if text.strip() else ""
  named = re.match(r"HloModule\s+([\w.\-]+)", first)
  computations: dict[str, list[Instruction]] = {}
  current = entry = None
  for line in text.splitlines():
    if not line.startswith((" ", "\t")):
      header = _HEADER.match(line) if not line.startswith("HloModule") else None
      current = header.group(2) if header else None
      if current is not None:
        computations[current] = []
        entry = current if header.group(1) else entry
      continue
    instruction = _INSTRUCTION.match(line) if current is not None else None
    if instruction is None:
      continue
    name, rest = instruction.groups()
    opcode = _OPCODE.search(rest)
    calls = []
    for group in _CALLS.findall(rest):
      calls += [c.strip().lstrip("%") for c in group.strip("{}").split(",") if c.strip()]
    op_name = _OP_NAME.search(rest)
    target = _TARGET.search(rest)
    computations[current].append(
      Instruction(
        name=name,
        opcode=opcode.group(1) if opcode else "",
        op_name=op_name.group(1) if op_name else "",
        calls=tuple(calls),
        target=target.group(1) if target else "",
        line=line,
      )
    )
  instructions = {i.name: i for body in computations.values() for i in body}
  return HloModule(named.group(1) if named else "unknown", computations, instructions, entry)


# ---------------------------------------------------------------------------
# What it says.
# ---------------------------------------------------------------------------


def _shape_bytes(text: str) -> int:
  """Bytes of every array shape written in `text` ("f32[8,128]{1,0} ...")."""
  total = 0
  for dtype, dims in re.findall(r"\b([a-z]+\d*)\[([\d,]*)\]", text):
    if dtype in _DTYPE_BYTES:
      total += math.prod(int(d) for d in dims.split(",") if d) * _DTYPE_BYTES[dtype]
  return total


def _replica_groups(line: str, num_chips: int) -> list[list[int]]:
  """The device groups of a collective: explicit {{0,1},{2,3}} lists or the
  iota form [G,N]<=[dims]T(perm); all chips when none are given."""
  iota = re.search(r"replica_groups=\[([\d,]+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?", line)
  if iota:
    shape = [int(d) for d in iota.group(1).split(",")]
    dims = [int(d) for d in iota.group(2).split(",")]
    ids = np.arange(math.prod(dims)).reshape(dims)
    if iota.group(3):
      ids = ids.transpose([int(p) for p in iota.group(3).split(",")])
    return ids.reshape(-1, shape[-1]).tolist()
  explicit = re.search(r"replica_groups=\{(\{[\d,]*\}(?:,\{[\d,]*\})*)\}", line)
  if explicit:
    groups = re.findall(r"\{([\d,]*)\}", explicit.group(1))
    groups = [[int(i) for i in g.split(",") if i] for g in groups]
    if groups and groups[0]:
      return groups
  pairs = re.findall(r"\{(\d+),(\d+)\}", line.partition("source_target_pairs=")[2][:2000])
  if pairs:
    return [[int(a), int(b)] for a, b in pairs]
  return [list(range(num_chips))]


def _top_level_parts(text: str) -> list[str]:
  """The comma-separated parts of a tuple type "(A, (B, C))" at its top level."""
  inner = text.strip()[1:-1]
  parts, depth, begin = [], 0, 0
  for i, ch in enumerate(inner):
    depth += ch in "({["
    depth -= ch in ")}]"
    if ch == "," and depth == 0:
      parts.append(inner[begin:i])
      begin = i + 1
  parts.append(inner[begin:])
  return parts


def _buffer_bytes(kind: str, result_type: str, started: bool, n: int) -> int:
  """Bytes of the whole buffer a collective reduces or gathers: an
  all-gather's output, a reduce-scatter's input, an all-reduce's,
  all-to-all's or permute's operand. A `-start` op's type is (inputs,
  outputs) for gathers and scatters (GPU); a plain op's is its output."""
  if started and kind in ("all-gather", "reduce-scatter") and result_type.startswith("(("):
    inputs, outputs = _top_level_parts(result_type)[:2]
    return _shape_bytes(outputs if kind == "all-gather" else inputs)
  if started and kind == "collective-permute" and result_type.startswith("("):
    return _shape_bytes(_top_level_parts(result_type)[0])
  if kind in ("send", "recv") and result_type.startswith("("):
    # (the data, a context, a token): the data.
    return _shape_bytes(_top_level_parts(result_type)[0])
  if kind == "reduce-scatter":
    return _shape_bytes(result_type) * n
  return _shape_bytes(result_type)


def _stack_files(hlo: str) -> dict[int, list[str]]:
  """The source files of each stack frame id XLA's metadata names, the
  innermost first (the FileNames / FileLocations / StackFrames tables at the
  end of the program's text)."""
  tables, table = collections.defaultdict(dict), None
  for line in hlo.splitlines():
    if line in ("FileNames", "FunctionNames", "FileLocations", "StackFrames"):
      table = line
      continue
    if table is None or not line or not line[0].isdigit():
      continue
    key, _, value = line.partition(" ")
    tables[table][int(key)] = value
  files = {k: v.strip('"') for k, v in tables["FileNames"].items()}
  location_file = {}
  for key, value in tables["FileLocations"].items():
    found = re.search(r"file_name_id=(\d+)", value)
    location_file[key] = files.get(int(found.group(1)), "") if found else ""
  frames = {}
  for key, value in tables["StackFrames"].items():
    location = re.search(r"file_location_id=(\d+)", value)
    parent = re.search(r"parent_frame_id=(\d+)", value)
    frames[key] = (
      location_file.get(int(location.group(1)), "") if location else "",
      int(parent.group(1)) if parent else 0,
    )
  chains = {}
  for key in frames:
    chain, frame, seen = [], key, set()
    while frame in frames and frame not in seen:
      seen.add(frame)
      chain.append(frames[frame][0])
      frame = frames[frame][1]
    chains[key] = chain
  return chains


def _part_of_step(kind: str, line: str, stack_files: dict[int, list[str]]) -> str:
  """Which part of the step a collective belongs to: the innermost file of
  this package on its stack (XLA's metadata), forward or backward by its op
  name. A collective XLA combined from several keeps no metadata."""
  op_name = re.search(r'op_name="([^"]*)"', line)
  combined = re.match(r"^\s*(?:ROOT\s+)?%?[\w.\-]+\s*=\s*\(", line) and "-start" not in line
  if op_name is None or (combined and kind == "all-reduce"):
    return "combined by XLA"
  backward = "transpose(" in op_name.group(1)
  frame = re.search(r"stack_frame_id=(\d+)", line)
  chain = stack_files.get(int(frame.group(1)), []) if frame else []
  source = next((f for f in chain if "/hyperbolic_vl/" in f), "")
  if source.endswith("training/sharding.py"):
    if kind == "all-gather" and not backward:
      return "fsdp gathers"
    return "fsdp gradient scatter" if backward else "replicated state"
  if "/objectives/" in source or "/geometry/" in source:
    return "loss columns (backward)" if backward else "loss columns"
  if backward:
    return "gradients"
  if source.endswith("training/step.py"):
    return "loss and metrics"
  if "/models/" in source:
    return "model (batch statistics)"
  return "other"


def _computation_lines(module: HloModule) -> dict[str, list[str]]:
  """Computation name -> its instructions' lines, in the text's order."""
  return {name: module.lines(name) for name in module.computations}


def _definitions(lines: list[str]) -> dict[str, str]:
  """Instruction name -> its line, within one computation."""
  found = {}
  for line in lines:
    target = re.match(r"\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=", line)
    if target:
      found[target.group(1)] = line
  return found


def _constant(name: str, definitions: dict[str, str]) -> int | None:
  """The integer constant `name` is, through copies; None if it is not one."""
  for _ in range(8):
    line = definitions.get(name, "")
    value = re.search(r"\sconstant\((-?\d+)\)", line)
    if value:
      return int(value.group(1))
    copied = re.search(r"\scopy\(%?([\w.\-]+)\)", line)
    if not copied:
      return None
    name = copied.group(1)
  return None


def _trip_count_from_condition(computations, caller_lines: list[str], line: str) -> int | None:
  """A while loop's trip count where XLA does not write `known_trip_count`
  (XLA:TPU): a condition `counter < N` on a tuple element that starts at a
  constant, as jax's `scan` and `fori_loop` compile (the counter steps by 1).
  None for any other condition."""
  condition = re.search(r"condition=%?([\w.\-]+)", line)
  operand = re.search(r"\swhile\(%?([\w.\-]+)\)", line)
  if not condition or not operand or condition.group(1) not in computations:
    return None
  condition_lines = computations[condition.group(1)]
  root = next((x for x in condition_lines if x.strip().startswith("ROOT")), "")
  compare = re.search(r"compare\(%?([\w.\-]+), %?([\w.\-]+)\), direction=LT", root)
  if not compare:
    return None
  inside = _definitions(condition_lines)
  element = re.search(r"get-tuple-element\(.*?\), index=(\d+)", inside.get(compare.group(1), ""))
  bound = _constant(compare.group(2), inside)
  outside = _definitions(caller_lines)
  tuple_line = re.search(r"\stuple\((.*)\)", outside.get(operand.group(1), ""))
  if element is None or bound is None or tuple_line is None:
    return None
  operands = re.sub(r"/\*.*?\*/", "", tuple_line.group(1)).split(",")
  index = int(element.group(1))
  if index >= len(operands):
    return None
  start = _constant(operands[index].strip().lstrip("%"), outside)
  return max(bound - start, 0) if start is not None else None


def _multipliers(computations: dict[str, list[str]], entry: str | None) -> dict[str, int]:
  """How many times per step each computation that holds a collective runs:
  while bodies by their known trip count (XLA:GPU writes it; on a TPU it is
  read from the loop's condition, `_trip_count_from_condition`; 1 when
  neither says) within their callers. A TPU's asynchronous collective
  appears in its start, its overlapping fusion and its done computation:
  only the start's counts (the others get 0)."""
  callers = collections.defaultdict(list)  # callee -> [(caller, times)]
  for name, lines in computations.items():
    for line in lines:
      body = re.search(r"body=%?([\w.\-]+)", line)
      if body:
        trips = re.search(r'"known_trip_count":\{"n":"(\d+)"', line)
        if trips:
          times = int(trips.group(1))
        else:
          times = _trip_count_from_condition(computations, lines, line)
        callers[body.group(1)].append((name, 1 if times is None else times))
      target = re.match(r"\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=", line)
      copies = target is not None and "collective-done" in target.group(1)
      for called in re.findall(r"(?:calls|to_apply)=%?([\w.\-]+)", line):
        callers[called].append((name, 0 if copies else 1))
  times = {}

  def multiplier(name, seen=()):
    if name == entry:
      return 1
    if name.startswith("async_collective_fusion"):
      return 0
    if name in times:
      return times[name]
    if name in seen or not callers.get(name):
      return 1
    value = max(multiplier(caller, (*seen, name)) * n for caller, n in callers[name])
    times[name] = value
    return value

  return {name: multiplier(name) for name in computations}


def collectives(hlo: str, target: aot_targets.Target, devices) -> dict:
  """Per kind of collective in the compiled program: how many run per step,
  the bytes of their buffers and the bytes each chip sends (ring
  algorithms: an all-reduce sends 2 (n-1)/n of its buffer, an all-gather,
  reduce-scatter or all-to-all (n-1)/n, a permute all of it), what of that
  crosses hosts (GPUs), and which part of the step each belongs to. A
  broadcast and a send count their buffer as sent, a receive nothing."""
  module = parse_hlo(hlo)
  computations = _computation_lines(module)
  multipliers = _multipliers(computations, module.entry)
  stack_files = _stack_files(hlo)
  pattern = re.compile(
    r"^\s*(?:ROOT\s+)?%?[\w.\-]+\s*=\s*(.*?)\s(" + "|".join(COLLECTIVES) + r")(-start)?\("
  )
  kinds = {
    kind: {
      "count": 0,
      "buffer_bytes": 0,
      "sent_bytes": 0,
      "sent_bytes_across_hosts": 0,
      "parts": collections.Counter(),
    }
    for kind in COLLECTIVES
  }
  for name, lines in computations.items():
    times = multipliers.get(name, 1)
    if not times:
      continue
    for line in lines:
      match = pattern.match(line)
      if not match:
        continue
      result_type, kind, started = match.group(1), match.group(2), bool(match.group(3))
      groups = _replica_groups(line, target.num_chips)
      n = max(len(groups[0]), 1)
      buffer = _buffer_bytes(kind, result_type, started, n)
      factor = {
        "all-reduce": 2 * (n - 1) / n,
        "collective-permute": 1.0,
        "collective-broadcast": 1.0,
        "send": 1.0,
        "recv": 0.0,
      }.get(kind, (n - 1) / n)
      sent = buffer * factor * times
      crosses = False
      if target.gpus_per_host is not None:
        hosts = {devices[i].process_index for i in groups[0] if i < len(devices)}
        crosses = len(hosts) > 1
      entry = kinds[kind]
      entry["count"] += times
      entry["buffer_bytes"] += buffer * times
      entry["sent_bytes"] += sent
      if crosses:
        entry["sent_bytes_across_hosts"] += sent
      entry["parts"][_part_of_step(kind, line, stack_files)] += times
  for entry in kinds.values():
    entry["parts"] = dict(entry["parts"])
  return kinds


# Instructions that move no data of their own.
_NO_TRAFFIC = {
  "parameter",
  "constant",
  "tuple",
  "get-tuple-element",
  "bitcast",
  "after-all",
  "partition-id",
  "replica-id",
  # Loops and calls: their bodies' instructions are counted.
  "while",
  "call",
  "conditional",
}


def hbm_traffic_bytes(hlo: str, *, per_trip: bool = True) -> int:
  """Bytes the program's top-level instructions (the entry computation and
  loop bodies, times their trip counts) read and write: each fusion, kernel
  call and copy's operands and output. Every such instruction reads its
  operands from and writes its output to device memory unless a cache
  holds them, so this estimates the step's memory traffic where XLA's cost
  model gives none (GPUs); layouts' padding is not counted. `per_trip=False`
  counts each loop body once, as XLA:TPU's cost analysis does: the ratio of
  the two is how much a looped step's count falls short."""
  module = parse_hlo(hlo)
  computations = _computation_lines(module)
  multipliers = _multipliers(computations, module.entry) if per_trip else {}
  bodies = {
    body
    for lines in computations.values()
    for line in lines
    for body in re.findall(r"body=%?([\w.\-]+)", line)
  }
  instruction = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*?)\s([a-z][\w\-]*)\((.*)$")
  total = 0
  for name, lines in computations.items():
    if name != module.entry and name not in bodies:
      continue
    times = multipliers.get(name, 1)
    sizes = {}
    for line in lines:
      match = instruction.match(line)
      if not match:
        continue
      target, result_type, op, rest = match.groups()
      sizes[target] = _shape_bytes(result_type)
      if op in _NO_TRAFFIC or op.endswith("-done"):
        continue
      operands = rest.split(")")[0].split(",")
      read = sum(sizes.get(o.strip().lstrip("%"), 0) for o in operands)
      total += (sizes[target] + read) * times
  return total


def program_summary(hlo: str) -> dict:
  """What to read first in a compiled program: its fusions, the copies and
  transposes left outside them, and the fused attention calls (cuDNN's
  `__cudnn$fmha` forward and backward kernels on GPUs)."""
  module = parse_hlo(hlo)
  computations = _computation_lines(module)
  entry = computations.get(module.entry, [])
  count = lambda op, lines: sum(1 for line in lines if re.search(rf"\s{op}\(", line))
  everywhere = [line for lines in computations.values() for line in lines]
  return {
    "entry_fusions": count("fusion", entry),
    "entry_copies": count("copy", entry) + count("copy-start", entry),
    "entry_transposes": count("transpose", entry),
    "cudnn_attention_calls": sum('custom_call_target="__cudnn$fmha' in line for line in everywhere),
  }
