"""benchmarks/profile_split.py: kernel classes from an HLO module and a
trace, on hand-written ones (every class, nested events, a GPU trace's
stream and op lines) and on a CPU trace of the tiny MERU step written by
`step_throughput --profile_dir`."""

import gzip
import importlib.util
import json
import os
import subprocess
import sys

import pytest
from paths import REPO

spec = importlib.util.spec_from_file_location(
  "profile_split", REPO / "benchmarks" / "profile_split.py"
)
profile_split = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = profile_split  # dataclasses look their module up
spec.loader.exec_module(profile_split)

HLO = """HloModule jit_train_step, entry_computation_layout={(f32[4,4]{1,0})->f32[4,4]{1,0}}

%add_region (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %add.9 = f32[] add(%a, %b)
}

%fused_dot (p0: f32[4,4], p1: f32[4,4]) -> f32[4,4] {
  %p0 = f32[4,4]{1,0} parameter(0)
  %p1 = f32[4,4]{1,0} parameter(1)
  ROOT %dot.1 = f32[4,4]{1,0} dot(%p0, %p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}, metadata={op_name="jit(train_step)/jvp()/dot_general" source_file="x.py"}
}

%fused_softmax (p0: f32[4,4]) -> f32[4,4] {
  %p0 = f32[4,4]{1,0} parameter(0)
  ROOT %exponential.2 = f32[4,4]{1,0} exponential(%p0), metadata={op_name="jit(train_step)/transpose(jvp())/attention/exp"}
}

%fused_update (p0: f32[4,4], p1: pred[]) -> f32[4,4] {
  %p0 = f32[4,4]{1,0} parameter(0)
  %p1 = pred[] parameter(1)
  %multiply.3 = f32[4,4]{1,0} multiply(%p0, %p0), metadata={op_name="jit(train_step)/optimizer/mul"}
  %broadcast.4 = pred[4,4]{1,0} broadcast(%p1), dimensions={}
  ROOT %select.5 = f32[4,4]{1,0} select(%broadcast.4, %multiply.3, %p0), metadata={op_name="jit(train_step)/select_n"}
}

%fused_reduce (p0: f32[4,4]) -> f32[4] {
  %p0 = f32[4,4]{1,0} parameter(0)
  %constant.6 = f32[] constant(0)
  ROOT %reduce.7 = f32[4]{0} reduce(%p0, %constant.6), dimensions={1}, to_apply=%add_region, metadata={op_name="jit(train_step)/jvp()/reduce_sum"}
}

%fused_gelu (p0: f32[4,4]) -> f32[4,4] {
  %p0 = f32[4,4]{1,0} parameter(0)
  ROOT %tanh.8 = f32[4,4]{1,0} tanh(%p0), metadata={op_name="jit(train_step)/jvp()/tanh"}
}

%loop_body (p: f32[4,4]) -> f32[4,4] {
  %p = f32[4,4]{1,0} parameter(0)
  ROOT %add.10 = f32[4,4]{1,0} add(%p, %p)
}

%loop_condition (p: f32[4,4]) -> pred[] {
  %p = f32[4,4]{1,0} parameter(0)
  ROOT %constant.11 = pred[] constant(false)
}

ENTRY %main.12 (a: f32[4,4]) -> f32[4,4] {
  %a = f32[4,4]{1,0} parameter(0)
  %flag = pred[] constant(true)
  %fusion.dot = f32[4,4]{1,0} fusion(%a, %a), kind=kOutput, calls=%fused_dot, metadata={op_name="jit(train_step)/jvp()/dot_general"}
  %fusion.softmax = f32[4,4]{1,0} fusion(%fusion.dot), kind=kLoop, calls=%fused_softmax
  %fusion.update = f32[4,4]{1,0} fusion(%fusion.softmax, %flag), kind=kLoop, calls=%fused_update
  %fusion.reduce = f32[4]{0} fusion(%fusion.update), kind=kInput, calls=%fused_reduce
  %fusion.gelu = f32[4,4]{1,0} fusion(%fusion.update), kind=kLoop, calls=%fused_gelu
  %all-reduce-start = (f32[4,4]{1,0}, f32[4]{0}) all-reduce-start(%fusion.gelu, %fusion.reduce), replica_groups={{0,1}}, to_apply=%add_region
  %all-reduce-done = (f32[4,4]{1,0}, f32[4]{0}) all-reduce-done(%all-reduce-start)
  %custom-call.fmha = (f32[4,4]{1,0}, u8[0]{0}) custom-call(%a, %a, %a), custom_call_target="__cudnn$fmhaSoftmax"
  %custom-call.gemm = (f32[4,4]{1,0}, s8[4]{0}) custom-call(%a, %a), custom_call_target="__cublas$gemm"
  %copy.13 = f32[4,4]{0,1} copy(%a)
  ROOT %while.14 = f32[4,4]{1,0} while(%copy.13), condition=%loop_condition, body=%loop_body
}
"""

EXPECTED_CLASSES = {
  "fusion.dot": "matmul/conv",
  "fusion.softmax": "attention",
  "fusion.update": "optimizer",  # the NaN guard's select fused in
  "fusion.reduce": "reductions",
  "fusion.gelu": "fusions",
  "all-reduce-start": "collectives",
  "all-reduce-done": "collectives",
  "custom-call.fmha": "attention",
  "custom-call.gemm": "matmul/conv",
  "copy.13": "other",
  "while.14": "other",
}


def test_every_instruction_gets_its_class():
  module = profile_split.parse_hlo(HLO)
  assert module.name == "jit_train_step"
  got = {name: profile_split.classify_instruction(module, name) for name in EXPECTED_CLASSES}
  assert got == EXPECTED_CLASSES
  assert profile_split.classify_instruction(module, "absent.1") is None


def write_trace(path, events, processes, threads):
  meta = [
    {"ph": "M", "pid": pid, "name": "process_name", "args": {"name": name}}
    for pid, name in processes.items()
  ]
  meta += [
    {"ph": "M", "pid": pid, "tid": tid, "name": "thread_name", "args": {"name": name}}
    for (pid, tid), name in threads.items()
  ]
  with gzip.open(path, "wt") as f:
    json.dump({"displayTimeUnit": "ns", "traceEvents": meta + events}, f)


def op(name, ts, dur, module="jit_train_step", tid=10, pid=1):
  args = {"hlo_op": name, "hlo_module": module}
  return {"ph": "X", "pid": pid, "tid": tid, "ts": ts, "dur": dur, "name": name, "args": args}


def test_cpu_trace_split_with_self_times(tmp_path):
  """Host threads' op events (microseconds): the while loop's 100 holds the
  dot's 30 on the same thread, so it keeps 70; another thread runs the
  reduction meanwhile (both count); events of another module or without an
  HLO op are left out."""
  events = [
    op("while.14", 0, 100),
    op("fusion.dot", 10, 30),
    op("fusion.reduce", 20, 40, tid=11),
    op("fusion.softmax", 200, 5),
    op("fusion.update", 210, 6),
    op("fusion.gelu", 220, 7),
    op("all-reduce-start", 230, 8),
    op("copy.13", 240, 9),
    op("fusion.dot", 300, 30),
    op("fusion.other", 400, 50, module="jit_other"),
    {"ph": "X", "pid": 1, "tid": 10, "ts": 0, "dur": 1000, "name": "PjitFunction(train_step)"},
  ]
  path = tmp_path / "host.trace.json.gz"
  write_trace(path, events, {1: "/host:CPU"}, {(1, 10): "python", (1, 11): "tf_XLAEigen"})
  result = profile_split.split(str(path), HLO)
  expected = {
    "matmul/conv": 60e-6,
    "attention": 5e-6,
    "fusions": 7e-6,
    "reductions": 40e-6,
    "collectives": 8e-6,
    "optimizer": 6e-6,
    "other": 70e-6 + 9e-6,
  }
  assert result.seconds == pytest.approx(expected, abs=1e-12)
  assert result.counts["matmul/conv"] == 2 and result.skipped == 1
  assert result.total == pytest.approx(205e-6, abs=1e-12)
  table = profile_split.format_table(result, steps=1)
  assert "matmul/conv" in table and "29.3%" in table  # 60 of 205


def test_gpu_trace_counts_stream_kernels_once_by_name(tmp_path):
  """A GPU trace: the device's stream line holds the kernels; its "XLA Ops"
  line repeats them as HLO ops and host events are not device time. Without
  the HLO the kernel names decide."""
  kernels = [
    ("sm90_xmma_gemm_bf16bf16_bf16f32", 50),
    ("cutlass_80_tensorop_s1688gemm", 20),
    ("nvjet_sm90_tst_128x160_64x5_2x1_v_bz_NNT", 6),  # cuBLASLt on an H100, CUDA 13
    ("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 15),
    ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7", 12),
    ("input_reduce_fusion_3", 8),
    ("loop_multiply_fusion_7", 4),
    ("memcpy_or_transpose", 3),
  ]
  events, ts = [], 0
  for name, dur in kernels:
    events.append({"ph": "X", "pid": 2, "tid": 7, "ts": ts, "dur": dur, "name": name})
    events.append({"ph": "X", "pid": 2, "tid": 8, "ts": ts, "dur": dur, "name": "fusion.1"})
    ts += 100
  events.append({"ph": "X", "pid": 1, "tid": 1, "ts": 0, "dur": 900, "name": "ExecuteHelper"})
  path = tmp_path / "perfetto_trace.json.gz"
  processes = {1: "/host:CPU", 2: "/device:GPU:0"}
  threads = {(2, 7): "Stream #7(Compute)", (2, 8): "XLA Ops", (1, 1): "python"}
  write_trace(path, events, processes, threads)
  result = profile_split.split(str(path))
  expected = {
    "matmul/conv": 76e-6,
    "attention": 12e-6,
    "fusions": 4e-6,
    "reductions": 8e-6,
    "collectives": 15e-6,
    "optimizer": 0.0,
    "other": 3e-6,
  }
  assert result.seconds == pytest.approx(expected, abs=1e-12)
  assert profile_split.find_trace(str(tmp_path)) == str(path)


def test_kernels_that_overlap_their_neighbour_by_a_rounding_are_not_nested():
  """An H100 stream's consecutive kernels overlapped by ~0.1 us (70% of them
  in a ViT-B/16 step's trace): each is the next kernel, its own time whole,
  while an event wholly inside another still counts as nested."""
  events = [
    op("fusion.gelu", 0.0, 10.0, tid=7),
    op("fusion.dot", 9.9, 20.0, tid=7),  # starts 0.1 us before gelu ends
    op("fusion.reduce", 29.8, 5.0, tid=7),  # and 0.1 us before the dot ends
    op("while.14", 100.0, 50.0, tid=7),
    op("fusion.dot", 110.0, 30.0, tid=7),  # inside the loop
  ]
  assert profile_split.self_times(events) == pytest.approx([10.0, 20.0, 5.0, 20.0, 30.0])


@pytest.mark.slow
def test_cpu_trace_of_the_tiny_meru_step(tmp_path):
  """`step_throughput --profile_dir` on the CPU (8 devices, tiny MERU):
  every op event of the traced step names an instruction of the HLO written
  beside it, each of the 3 traced steps runs the same kernels, and the step
  has matrix products, attention, optimizer updates and collectives."""
  profile_dir = tmp_path / "profile"
  command = [
    sys.executable,
    "-m",
    "hyperbolic_vl.tools.step_throughput",
    "--config=configs/meru.py",
    "--config.input.batch_size=16",
    "--config.input.image_size=16",
    "--steps=1",
    "--warmup=0",
    f"--profile_dir={profile_dir}",
  ]
  done = subprocess.run(
    command, cwd=REPO, capture_output=True, text=True, timeout=600, env=dict(os.environ)
  )
  assert done.returncode == 0, done.stderr[-3000:]
  assert f"benchmarks/profile_split.py --profile={profile_dir}" in done.stdout
  trace = profile_split.find_trace(str(profile_dir))
  hlo = (profile_dir / "step.hlo.txt").read_text()
  module = profile_split.parse_hlo(hlo)
  events = [
    e
    for e in profile_split.device_op_events(profile_split.load_events(trace))
    if e["args"].get("hlo_module") == module.name
  ]
  assert events
  assert all(e["args"]["hlo_op"] in module.instructions for e in events)
  result = profile_split.split(trace, hlo)
  for kind in profile_split.CLASSES:
    assert result.counts[kind] % 3 == 0, (kind, result.counts)
  for kind in ("matmul/conv", "attention", "optimizer", "collectives", "fusions"):
    assert result.seconds[kind] > 0, (kind, result.seconds)
  assert sum(result.counts.values()) == len(events)
  printed = subprocess.run(
    [sys.executable, "benchmarks/profile_split.py", f"--profile={profile_dir}", "--top=2"],
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert printed.returncode == 0, printed.stderr
  rows = [line.split()[0] for line in printed.stdout.splitlines() if not line.startswith(" ")]
  assert [r for r in rows if r in profile_split.CLASSES] == list(profile_split.CLASSES)
  print(printed.stdout)
