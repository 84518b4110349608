"""Two processes of 4 CPU devices train exactly like one process of 8, from
the command line (`--multihost --coordinator_address --num_processes
--process_id`, JAX's own distributed runtime with gloo collectives).

Every data source yields only its process's rows of each global batch, so
the two processes' batches concatenate to the single-process batch; the
step, its all-gathers and the optimizer are then the same computation laid
out on the same 8 devices, and only the reduction order of cross-device sums
can differ. The runs compute in float64 (JAX_ENABLE_X64, model.dtype
float64), as every identity here: in float32 a gradient that cancels to
round-off noise (~1e-8) is larger than Adam's eps, so its first update is
+-lr whatever its sign and reordered sums move such parameters by 2 lr; in
float64 the noise (~1e-17) is far below eps. Tolerance 1e-5 relative, the
issue's bound (observed differences are ~1e-12).

Radial Embeddings and HMID-Net start from another run (`init_from`, the
teacher's workdir) that one process trained: every process of the pair
restores that run's params for itself (loading._leaf_restore_args)."""

import os
import re
import socket
import subprocess
import sys

import cheap_codegen
import process_report
import pytest
import run_identity
from paths import REPO

ROOT = str(REPO)
# The evaluation keeps its retrieval figures (both towers embed from the
# params the processes trained) and drops the zero-shot kinds: each kind
# compiles its own prompt shapes in every process and adds no multi-host path.
MERU = [
  "--config=configs/meru.py",
  "--config.evals.world.num_examples=16",
  "--config.evals.world.zero_shot_kinds=()",
]
# MERU's 2x4 == 1x8 identity is also checked through the launchers, from
# their own command lines to a pre-empted, requeued and resumed job
# (tests/integration/test_pod_box.py).
RADIAL = [
  "--config=configs/radial.py",
  "--config.evals.world.num_examples=16",
  "--config.evals.hierarchy.num_examples=16",
]
RUNS = {
  # The multi-process path itself: the distributed start, each process's
  # share of the global batch, columns gathered across the processes, one
  # evaluation and the checkpoint written by both (observed: losses 1.9e-16,
  # params 2.4e-9 relative).
  "meru": MERU,
  "hcl": [
    "--config=configs/hcl.py",
    "--config.objective.queue_size=64",
    "--config.evals.hcl.num_examples=8",
  ],
  # Radial Embeddings as it is used: fine-tuning a CLIP run (its from-scratch
  # identity is the same step; one process covers it in tests/objectives).
  "radial_from_clip": [*RADIAL, "--config.init_from={clip}"],
  # Four contrastive and four entailment terms over whole images, box crops,
  # captions and phrases: the box rows are each process's too (observed:
  # losses 5e-16, params 1.1e-9 relative).
  "hycoclip": [
    "--config=configs/hycoclip.py",
    "--config.evals.world.num_examples=16",
    "--config.evals.world_boxes.num_examples=16",
  ],
  # Several boxes per image with masks: the box slots, their masks and the
  # per-block box counts cross the process boundary (the blocks of 4 rows
  # of the release's per-device reading span two devices of 2 rows;
  # observed: losses 2.4e-16, params 1.2e-9 relative).
  "uncha": [
    "--config=configs/uncha.py",
    "--config.evals.world.num_examples=16",
    "--config.evals.world_boxes.num_examples=16",
    "--config.objective.box_reduction=per_device",
    "--config.objective.rows_per_device=4",
  ],
  "hmid_from_meru": [
    "--config=configs/hmid.py",
    "--config.evals.world.num_examples=16",
    "--config.objective.teacher_workdir={meru}",
  ],
  # Sharded params (sharding.py) over all 8 devices, so every array with an
  # 8-divisible dimension is split across the two processes: the gathers,
  # the reduce-scatters, the checkpoint's shards, and the params gathered
  # whole for the evaluation.
  "meru_fsdp_8": [*MERU, "--config.mesh.fsdp=8", "--config.mesh.fsdp_min_elements=0"],
}
# The runs the fine-tunes above start from, each trained once by one process
# (as users make them; the 2-process run must read what one process wrote).
SOURCES = {
  "clip": ["--config=configs/clip.py", "--config.evals.world.num_examples=16"],
  "meru": MERU,
}
COMMON = [
  "--config.total_steps=3",
  "--config.log_training_steps=1",
  "--config.ckpt_steps=3",
  "--config.input.batch_size=16",
  "--config.input.image_size=16",
  "--config.optim.warmup_steps=1",
  "--config.model.dtype=float64",
]


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def launch(flags, devices: int) -> subprocess.Popen:
  # The device count replaces the session's XLA_FLAGS, its cheap code
  # generation flag kept (tests/conftest.py): both sides compile alike.
  env = dict(
    os.environ,
    XLA_FLAGS=f"--xla_force_host_platform_device_count={devices} {cheap_codegen.XLA_FLAG}",
    JAX_PLATFORMS="cpu",
    JAX_ENABLE_X64="1",
  )
  return subprocess.Popen(
    [sys.executable, "-m", "hyperbolic_vl.main", *flags],
    cwd=ROOT,
    env=env,
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
  )


def finish(*processes: subprocess.Popen, exit_code: int = 0) -> list[str]:
  """Every process's stdout, once all have ended with `exit_code`. When one
  does not, the report holds each such process's stderr: the process that
  died first (whose error is the cause) is often not the one listed first,
  whose stderr only says that another task died."""
  outputs = [process.communicate(timeout=600) for process in processes]
  failed = [
    f"process {i} (exit {process.returncode}):\n{process_report.why_it_ended(err)}"
    for i, (process, (_, err)) in enumerate(zip(processes, outputs))
    if process.returncode != exit_code
  ]
  assert not failed, "\n\n".join(failed)
  return [out for out, _ in outputs]


@pytest.fixture(scope="module")
def source_runs(tmp_path_factory):
  """name -> workdir of a SOURCES run, trained on first use by one process
  of one device, in float64 like the runs that start from it."""
  workdirs = {}

  def workdir(name: str) -> str:
    if name not in workdirs:
      path = tmp_path_factory.mktemp("sources") / name
      finish(launch([*SOURCES[name], *COMMON, f"--workdir={path}"], devices=1))
      workdirs[name] = str(path)
    return workdirs[name]

  return workdir


def run_flags(name: str, source_runs) -> list[str]:
  """RUNS[name] with each {source} replaced by that source run's workdir."""
  flags = []
  for flag in RUNS[name]:
    sources = re.findall(r"\{(\w+)\}", flag)
    flags.append(flag.format(**{s: source_runs(s) for s in sources}))
  return flags


# The push tier runs one 2-process identity, the cheapest: MERU's. The
# others repeat that path with their own rows (HyCoCLIP's and UNCHA's boxes),
# aux (HCL's queues), sources or sharding, and run in the slow tier.
PUSH_TIER = {"meru"}


@pytest.mark.parametrize(
  "name",
  [name if name in PUSH_TIER else pytest.param(name, marks=pytest.mark.slow) for name in RUNS],
)
def test_two_processes_of_four_devices_equal_one_of_eight(name, source_runs, tmp_path):
  flags = run_flags(name, source_runs) + COMMON
  single = launch([*flags, f"--workdir={tmp_path / 'one'}"], devices=8)
  address = f"127.0.0.1:{free_port()}"
  pair = [
    launch(
      [
        "--multihost",
        f"--coordinator_address={address}",
        "--num_processes=2",
        f"--process_id={i}",
        *flags,
        f"--workdir={tmp_path / 'two'}",
      ],
      devices=4,
    )
    for i in range(2)
  ]
  finish(single)
  lead, other = finish(*pair)
  # Only process 0 reports (gloo itself may still log its connections).
  assert "Trained to step 3" in lead and "step" not in other and "eval/" not in other
  assert "eval/" in lead  # the evaluation ran on the params the processes trained

  assert {step for step, _ in run_identity.logged_losses(tmp_path / "one")} == {1, 2, 3}
  run_identity.compare_runs(name, tmp_path / "one", tmp_path / "two")
