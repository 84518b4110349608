"""tools/aot: the trainer's own step compiled on this CPU for a TPU slice and
for GPUs (the `aot` extra: libtpu, the CUDA plugin). One compile per
backend in the push tier (module-scoped); the command-line refusals that
need another compile are in the slow tier."""

import dataclasses
import math
import os
import subprocess
import sys
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

pytest.importorskip("libtpu")
pytest.importorskip("jax_plugins.xla_cuda12")

from configs import meru as meru_config  # noqa: E402
from hyperbolic_vl.tools import aot, aot_report, aot_targets, flops, hlo_text  # noqa: E402
from hyperbolic_vl.training import compilation, sharding  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def meru_tiny(**overrides):
  config = meru_config.get_config()
  config.unlock()
  for dotted, value in overrides.items():
    *parents, key = dotted.split(".")
    node = config
    for parent in parents:
      node = node[parent]
    node[key] = value
  return config


@pytest.fixture(scope="module")
def tpu_step():
  """MERU tiny for 4 TPU v5e chips (data axis only): the push tier's TPU compile."""
  target = aot_targets.resolve("v5e:2x2")
  result = aot.compile_for(meru_tiny(), target)
  return result, aot.analyse(result)


@pytest.fixture(scope="module")
def gpu_step():
  """MERU tiny for 2 H100s with mesh.fsdp=2: the push tier's GPU compile."""
  target = aot_targets.resolve("h100:2")
  result = aot.compile_for(meru_tiny(**{"mesh.fsdp": 2, "mesh.fsdp_min_elements": 0}), target)
  return result, aot.analyse(result)


def expected_shard_bytes(tree, mesh) -> int:
  """Each leaf's bytes divided by the mesh axes its PartitionSpec names."""
  total = 0
  for leaf in jax.tree.leaves(tree):
    spec = leaf.sharding.spec
    named = [axis for part in spec for axis in (part if isinstance(part, tuple) else (part,))]
    ways = math.prod(dict(mesh.shape)[axis] for axis in named if axis is not None)
    total += leaf.size * leaf.dtype.itemsize // ways
  return total


def test_tiny_step_compiles_for_a_tpu_slice(tpu_step):
  result, figures = tpu_step
  config = result.config
  assert figures["chips"] == 4 and figures["chip"] == "TPU v5 lite"
  assert result.mesh.devices.flat[0].platform == "tpu"
  # State per chip: every leaf whole on each chip (no fsdp axis).
  assert figures["state_bytes_per_chip"] == expected_shard_bytes(result.state, result.mesh)
  whole = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(result.state))
  assert figures["state_bytes_per_chip"] == whole
  assert figures["fits"] and 0 < figures["total_bytes_per_chip"] < 16 * 2**30
  assert figures["model_flops_per_chip"] == flops.model_flops_per_step(config) / 4
  assert figures["xla_flops_per_chip"] > 0 and figures["xla_bytes_accessed_per_chip"] > 0
  # The loss gathers both towers' embeddings, the global batch's columns in
  # float32 (MERU's loss runs in float32), and reduce-scatters their
  # gradients back; nothing else moves but the gradients' all-reduce.
  columns = int(config.input.batch_size) * int(config.model.embed_dim) * 4
  gathers = figures["collectives"]["all-gather"]
  assert gathers["count"] == 2 and gathers["parts"] == {"loss columns": 2}
  assert gathers["buffer_bytes"] == 2 * columns
  assert gathers["sent_bytes"] == 2 * columns * 3 / 4  # a ring over 4 chips
  scatters = figures["collectives"]["reduce-scatter"]
  assert scatters["parts"] == {"loss columns (backward)": 2}
  assert scatters["buffer_bytes"] == 2 * columns
  assert figures["collectives"]["all-reduce"]["count"] >= 1
  # The bound is its largest term; its MFU the model FLOPs over it.
  assert figures["bound_s"] == max(figures["bound_terms_s"].values())
  peak = aot_targets.CHIPS["v5e"].peak_bf16_flops
  assert figures["mfu_at_bound"] == pytest.approx(
    figures["model_flops_per_chip"] / figures["bound_s"] / peak
  )
  # The NaN guard is the target's (a select), not this CPU host's lax.cond.
  hlo = result.compiled.executable.as_text()
  assert " conditional(" not in hlo
  # No loop in this step, so XLA's bytes need no scaling for loop trips.
  assert " while(" not in hlo and figures["loop_traffic_scale"] == 1.0
  bandwidth = aot_targets.CHIPS["v5e"].memory_bandwidth
  assert figures["bound_terms_s"]["memory"] == figures["xla_bytes_accessed_per_chip"] / bandwidth


def test_tiny_step_compiles_for_gpus_with_fsdp(gpu_step):
  result, figures = gpu_step
  assert figures["chips"] == 2 and figures["mesh"] == {"data": 1, "fsdp": 2}
  assert result.mesh.devices.flat[0].device_kind == "NVIDIA H100 80GB HBM3"
  state_bytes = expected_shard_bytes(result.state, result.mesh)
  assert figures["state_bytes_per_chip"] == state_bytes
  assert figures["params_bytes_per_chip"] == expected_shard_bytes(
    result.state["params"], result.mesh
  )
  # XLA:GPU pads nothing: its argument bytes are the state's and the batch
  # rows' on one chip, exactly, less the example indices, which MERU's loss
  # never reads (jit drops unused arguments).
  batch = aot_batch_of(result)
  rows = sum(x.size * x.dtype.itemsize // 2 for k, x in batch.items() if k != "index")
  assert figures["argument_bytes_per_chip"] == state_bytes + rows
  parts = figures["collectives"]["all-gather"]["parts"]
  assert parts.get("fsdp gathers", 0) >= 1 and parts.get("loss columns", 0) >= 1
  assert figures["collectives"]["reduce-scatter"]["parts"].get("fsdp gradient scatter", 0) >= 1
  assert figures["xla_flops_per_chip"] is None  # XLA:GPU gives no cost analysis
  assert figures["bound_terms_s"]["compute"] == pytest.approx(
    figures["model_flops_per_chip"] / aot_targets.CHIPS["h100"].peak_bf16_flops
  )


def aot_batch_of(result):
  return aot.abstract_batch(
    result.config,
    aot.run_tokenizer(result.config),
    aot.objectives_lib.get(result.config.objective),
    sharding.batch_sharding(result.mesh),
  )


def test_fsdp_divides_the_state_per_chip():
  """mesh.fsdp=4 over 4 chips: the params and optimizer state per chip are
  about a quarter (arrays with no dimension 4 divides, the scalars and the
  step counters stay whole). Traced only: nothing compiles."""
  target = aot_targets.resolve("v5e:2x2")
  whole = aot.step_for(meru_tiny(**{"mesh.fsdp_min_elements": 0}), target)
  split = aot.step_for(meru_tiny(**{"mesh.fsdp": 4, "mesh.fsdp_min_elements": 0}), target)
  assert aot.shard_bytes(whole.state) == expected_shard_bytes(whole.state, whole.mesh)
  assert aot.shard_bytes(split.state) == expected_shard_bytes(split.state, split.mesh)
  specs = {leaf.sharding.spec for leaf in jax.tree.leaves(split.state["params"])}
  assert any(sharding.FSDP_AXIS in spec for spec in specs) and P() in specs
  ratio = aot.shard_bytes(whole.state) / aot.shard_bytes(split.state)
  assert 3.5 < ratio <= 4


def test_a_step_that_cannot_fit_is_refused_with_the_preflights_levers(tpu_step):
  """The same compiled step against a chip of 1 MiB: not fitting, and the
  preflight's one line names the levers."""
  result, _ = tpu_step
  chip = dataclasses.replace(result.target.chip, memory_bytes=2**20)
  small = dataclasses.replace(result, target=dataclasses.replace(result.target, chip=chip))
  figures = aot.analyse(small)
  assert figures["fits"] is False
  line = aot_report.refusal(small, figures)
  assert "\n" not in line
  assert "to fit, set one of" in line or "split them over more devices" in line, line


def run_tool(*args):
  env = dict(os.environ, PYTHONPATH=ROOT)
  return subprocess.run(
    [sys.executable, "-m", "hyperbolic_vl.tools.aot", *args],
    cwd=ROOT,
    env=env,
    capture_output=True,
    text=True,
    timeout=900,
  )


def error_lines(done):
  """stderr less the C++ libraries' own log lines (libtpu's start-up)."""
  return [
    line
    for line in done.stderr.splitlines()
    if line.strip() and not line.startswith(("W0000", "I0000", "E0000", "WARNING: All log"))
  ]


def test_an_unknown_topology_is_one_line():
  done = run_tool("--config=configs/meru.py", "--topology=v9:2x2")
  assert done.returncode == 2, done.stderr
  lines = error_lines(done)
  assert len(lines) == 1 and lines[0].startswith("error: unknown topology 'v9:2x2'"), lines
  assert "v5p:4x4x8" in lines[0] and "h100:4x8" in lines[0]


@pytest.mark.slow
def test_a_config_that_cannot_fit_exits_4_with_one_line(tmp_path):
  """MERU tiny at 65,536 rows per v5e chip: the command compiles it, prints
  its figures, writes them, and refuses in one line with exit 4."""
  out = tmp_path / "figures.json"
  done = run_tool(
    "--config=configs/meru.py",
    "--topology=v5e:2x2",
    "--config.input.batch_size=262144",
    f"--json={out}",
  )
  assert done.returncode == aot.EXIT_DOES_NOT_FIT, done.stdout[-2000:] + done.stderr[-2000:]
  lines = [line for line in error_lines(done) if line.startswith("error:")]
  assert len(lines) == 1 and "per device and a TPU v5 lite has 16.0 GiB" in lines[0], lines
  assert "Memory per chip:" in done.stdout and "does NOT fit" in done.stdout
  assert out.exists()


def test_collective_bytes_of_hand_written_programs():
  """The parser on instructions as XLA:TPU and XLA:GPU print them: buffer
  bytes, ring bytes sent, groups from iota replica groups, and the
  start/overlap/done copies of one asynchronous TPU collective counted once."""
  target = aot_targets.Target("x", aot_targets.CHIPS["h100"], tuple(range(8)), 4)
  devices = [type("D", (), {"process_index": i // 4})() for i in range(8)]
  hlo = "\n".join(
    [
      "ENTRY %main (p: f32[8]) -> f32[8] {",
      "  %ag = f32[64,32]{1,0} all-gather(%p), replica_groups=[2,4]<=[8], dimensions={0}",
      "  %ar-start = f32[1000]{0} all-reduce-start(%q), replica_groups=[1,8]<=[8], to_apply=%add",
      "  %rs = ((f32[16,8]{1,0}, f32[16,8]{1,0}), (f32[8,8]{1,0}, f32[8,8]{1,0})) "
      "reduce-scatter-start(%a, %b), replica_groups={{0,1},{2,3},{4,5},{6,7}}, dimensions={0}",
      "  %start = (f32[2]) fusion(%x), calls=%fused_start",
      "  %async-collective-done = f32[2] fusion(%y), calls=%fused_done",
      "}",
      "%fused_start (a: f32[2]) -> f32[2] {",
      "  %ag2 = bf16[4,2]{1,0} all-gather(%a), replica_groups={{0,1}}, dimensions={0}",
      "}",
      "%fused_done (a: f32[2]) -> f32[2] {",
      "  %ag3 = bf16[4,2]{1,0} all-gather(%a), replica_groups={{0,1}}, dimensions={0}",
      "}",
      "%async_collective_fusion.1 (a: f32[2]) -> f32[2] {",
      "  %ag4 = bf16[4,2]{1,0} all-gather(%a), replica_groups={{0,1}}, dimensions={0}",
      "}",
    ]
  )
  kinds = hlo_text.collectives(hlo, target, devices)
  gather = kinds["all-gather"]
  assert gather["count"] == 2
  assert gather["buffer_bytes"] == 64 * 32 * 4 + 4 * 2 * 2
  assert gather["sent_bytes"] == 64 * 32 * 4 * 3 / 4 + 4 * 2 * 2 / 2
  reduce = kinds["all-reduce"]
  assert reduce["buffer_bytes"] == 4000 and reduce["sent_bytes"] == 4000 * 2 * 7 / 8
  assert reduce["sent_bytes_across_hosts"] == reduce["sent_bytes"]  # 8 GPUs over 2 hosts
  assert gather["sent_bytes_across_hosts"] == 0  # groups of 4 within a host
  scatter = kinds["reduce-scatter"]
  assert scatter["buffer_bytes"] == 2 * 16 * 8 * 4 and scatter["sent_bytes"] == 2 * 16 * 8 * 4 / 2
  np.testing.assert_equal(kinds["all-to-all"]["count"], 0)


def test_loop_trip_counts_as_each_backend_prints_them():
  """A collective inside a loop counts once per trip: XLA:GPU writes the
  trip count (`known_trip_count`); XLA:TPU writes none, and it is read from
  the loop's condition, `counter < N` with the counter starting at a
  constant (through copies), as the TPU prints jax's `scan` (the sigmoid
  ring's hops). A condition of another form counts the body once."""
  target = aot_targets.Target("x", aot_targets.CHIPS["v5p"], tuple(range(8)), None)
  devices = [type("D", (), {"process_index": 0})() for _ in range(8)]
  state = "(s32[], f32[8,64])"

  def permutes(start, bound, root="compare(%counter, %bound), direction=LT", known=None):
    """Collective-permutes of a program whose one loop permutes an f32[8,64]
    block (2,048 bytes) per trip."""
    config = f', backend_config={{"known_trip_count":{{"n":"{known}"}}}}' if known else ""
    hlo = "\n".join(
      [
        f"%body (p: {state}) -> {state} {{",
        "  %block = f32[8,64]{1,0} get-tuple-element(%p), index=1",
        "  %sent = f32[8,64]{1,0} collective-permute(%block), "
        "source_target_pairs={{0,1},{1,2},{2,3},{3,4},{4,5},{5,6},{6,7},{7,0}}",
        "}",
        f"%cond (p: {state}) -> pred[] {{",
        f"  %bound = s32[] constant({bound})",
        "  %counter = s32[] get-tuple-element(%p), index=0",
        f"  ROOT %done = pred[] {root}",
        "}",
        f"ENTRY %main (x: f32[8,64]) -> {state} {{",
        f"  %first = s32[] constant({start})",
        "  %counter0 = s32[] copy(%first)",
        f"  %init = {state} tuple(%counter0, /*index=1*/%x)",
        f"  ROOT %loop = {state} while(%init), condition=%cond, body=%body{config}",
        "}",
      ]
    )
    return hlo_text.collectives(hlo, target, devices)["collective-permute"]

  tpu = permutes(0, 7)
  assert tpu["count"] == 7 and tpu["sent_bytes"] == 7 * 8 * 64 * 4
  assert permutes(2, 7)["count"] == 5
  assert permutes(0, 7, known=3)["count"] == 3  # XLA:GPU's own count wins
  # A condition that is not `counter < constant`: the body counted once.
  assert permutes(0, 7, root="compare(%bound, %counter), direction=GT")["count"] == 1


def test_xla_tpu_counts_a_loop_body_once():
  """The fact the TPU bound's memory term corrects for: XLA:TPU's cost
  analysis counts a loop's body once, whatever its trip count (a scan of 1
  and of 4 matrix products counts the same FLOPs), while the traffic
  estimate counts it per trip (`per_trip=False`: once)."""
  from jax.experimental import topologies
  from jax.sharding import Mesh, NamedSharding

  device = topologies.get_topology_desc(topology_name="v5e:2x2", platform="tpu").devices[0]
  replicated = NamedSharding(Mesh(np.array([device]), ("x",)), P())

  def products(weights, rows):
    body = lambda total, row: (total + jnp.tanh(row @ weights).sum(), None)
    return jax.lax.scan(body, 0.0, rows)[0]

  counted, traffic = [], []
  for trips in (1, 4):
    weights = jax.ShapeDtypeStruct((256, 256), jnp.float32, sharding=replicated)
    rows = jax.ShapeDtypeStruct((trips, 128, 256), jnp.float32, sharding=replicated)
    with compilation.without_persistent_cache():  # as tools/aot compiles for a target
      compiled = jax.jit(products).lower(weights, rows).compile()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    counted.append(cost["flops"])
    hlo = compiled.as_text()
    assert (" while(" in hlo) == (trips > 1)  # XLA removes a loop of one trip
    traffic.append(
      (hlo_text.hbm_traffic_bytes(hlo), hlo_text.hbm_traffic_bytes(hlo, per_trip=False))
    )
  one_product = 2 * 128 * 256 * 256
  # Four products counted as one (plus the loop's own few ops), not 4x.
  assert counted[0] >= one_product and counted[1] < 1.05 * counted[0]
  assert traffic[0][0] == traffic[0][1]  # no loop: nothing to scale
  assert traffic[1][0] > 1.5 * traffic[1][1]  # four trips: the body's bytes 4x


def fake_commands(tmp_path, *names):
  """A PATH folder whose `names` (sbatch, gcloud) record their arguments."""
  folder = tmp_path / "bin"
  folder.mkdir(exist_ok=True)
  for name in names:
    script = folder / name
    script.write_text(f'#!/usr/bin/env bash\necho "$@" >> {tmp_path}/{name}.calls\n')
    script.chmod(0o755)
  return folder


def run_launcher(tmp_path, script, args, **env):
  # The launchers call `python`: the interpreter running these tests (its
  # venv need not be activated), after the fake sbatch and gcloud.
  python_dir = os.path.dirname(sys.executable)
  path = os.pathsep.join(
    (str(fake_commands(tmp_path, "sbatch", "gcloud")), python_dir, os.environ["PATH"])
  )
  environ = {k: v for k, v in os.environ.items() if k != "SLURM_JOB_ID"}
  return subprocess.run(
    ["bash", f"launch/{script}", *args],
    cwd=ROOT,
    env=dict(environ, PATH=path, PYTHONPATH=ROOT, **env),
    capture_output=True,
    text=True,
    timeout=900,
  )


def test_the_slurm_script_on_a_login_node_submits_itself(tmp_path):
  done = run_launcher(
    tmp_path,
    "slurm_gpu.sbatch",
    ["configs/meru.py:vit_l", "/shared/runs/x", "--config.total_steps=5"],
    SKIP_AOT="1",
    NODES="2",
  )
  assert done.returncode == 0, done.stderr
  calls = (tmp_path / "sbatch.calls").read_text().split()
  assert calls == [
    "--nodes=2",
    "launch/slurm_gpu.sbatch",
    "configs/meru.py:vit_l",
    "/shared/runs/x",
    "--config.total_steps=5",
  ]


@pytest.mark.slow
def test_the_launchers_refuse_before_anything_starts(tmp_path):
  """A topology the check refuses (exit 2): nothing is submitted, no TPU
  worker is reached."""
  done = run_launcher(
    tmp_path, "slurm_gpu.sbatch", ["configs/meru.py", "/tmp/x"], GPU="x100", NODES="1"
  )
  assert done.returncode == 2 and not (tmp_path / "sbatch.calls").exists()
  assert done.stderr.splitlines()[-1] == (
    "launch/slurm_gpu.sbatch: nothing was started: a bad argument or config (the line above); "
    "SKIP_AOT=1 skips the check"
  )
  done = run_launcher(
    tmp_path, "tpu_vm.sh", ["my-tpu", "zone", "configs/meru.py", "/tmp/x"], TOPOLOGY="v9:1"
  )
  assert done.returncode == 2 and not (tmp_path / "gcloud.calls").exists()
  assert "unknown topology 'v9:1'" in done.stderr


def test_memory_traffic_of_a_hand_written_program():
  """Each top-level instruction's operands and output, a loop body's times
  its known trip count: 2 x 1 KiB for the entry's fusion, 3 x 2 KiB for the
  body's (parameters, tuples and the loop itself move nothing)."""
  hlo = "\n".join(
    [
      "ENTRY %main (p: f32[256]) -> f32[256] {",
      "  %p = f32[256]{0} parameter(0)",
      "  %f = f32[256]{0} fusion(%p), kind=kLoop, calls=%fused",
      "  %t = (s32[], f32[256]{0}) tuple(%i, %f)",
      "  %w = (s32[], f32[256]{0}) while(%t), condition=%cond, body=%body, "
      'backend_config={"known_trip_count":{"n":"3"}}',
      "}",
      "%body (b: (s32[], f32[256])) -> (s32[], f32[256]) {",
      "  %b = (s32[], f32[256]{0}) parameter(0)",
      "  %x = f32[256]{0} get-tuple-element(%b), index=1",
      "  %g = f32[256]{0} fusion(%x), kind=kLoop, calls=%fused2",
      "}",
    ]
  )
  assert hlo_text.hbm_traffic_bytes(hlo) == 2 * 1024 + 3 * 2 * 1024
  # Each body once, as XLA:TPU's cost analysis counts: the bound's memory
  # term scales XLA's bytes by the ratio, (2 + 6) / (2 + 2) KiB = 2.
  assert hlo_text.hbm_traffic_bytes(hlo, per_trip=False) == 2 * 1024 + 2 * 1024


def test_compiles_for_a_target_skip_the_persistent_cache(tmp_path):
  """JAX writes an executable compiled for a target into its persistent
  cache but cannot read it back without a client: the second compile of a
  program warns and compiles again. `tools/aot` compiles without the cache
  (`compilation.without_persistent_cache`), which stays as it was after."""
  from jax.experimental import topologies
  from jax.sharding import Mesh, NamedSharding

  device = topologies.get_topology_desc(topology_name="v5e:2x2", platform="tpu").devices[0]
  replicated = NamedSharding(Mesh(np.array([device]), ("x",)), P())
  square = jax.ShapeDtypeStruct((128, 128), jnp.float32, sharding=replicated)

  def cache_warnings_of_two_compiles():
    with warnings.catch_warnings(record=True) as caught:
      warnings.simplefilter("always")
      for _ in range(2):  # a new function each time: no in-memory cache between them
        jax.jit(lambda x: jnp.tanh(x @ x)).lower(square).compile()
    return [str(w.message) for w in caught if "persistent compilation cache" in str(w.message)]

  with compilation.persistent_cache({"compilation_cache_dir": str(tmp_path)}):
    unreadable = cache_warnings_of_two_compiles()
    with compilation.without_persistent_cache():
      skipped = cache_warnings_of_two_compiles()
    assert jax.config.jax_enable_compilation_cache
  assert len(unreadable) == 1 and "must be constructed with a Client" in unreadable[0]
  assert skipped == []
