"""The launchers run as a user types them, in the pod in a box
(tests/fixtures/pod_box: sbatch, srun, scontrol and gcloud reproduced on
this machine; 2 nodes or TPU workers of 4 CPU devices each; JAX's own SLURM
and TPU detection find the peers over the loopback). Each run is the tiny
float64 MERU config file `pod_box.CONFIG` with nothing after the workdir
unless a test says, and must equal the same run from one process of 8
devices (`launch/local.sh`): every logged loss and every final parameter,
read back from both checkpoints (so each restores).

The login-node forms that compile the step for the cluster's chips first
(`GPU=h100 NODES=2 bash launch/slurm_gpu.sbatch ...`, `tpu_vm.sh` naming
the slice's topology from `gcloud describe`) need the `aot` extra: those
tests carry the `aot_extra` mark and run in .ci/run's last stage, which
installs it (they skip without it). The others check the box's own chips
(TOPOLOGY=cpu:8) or submit directly (`sbatch ... launch/slurm_gpu.sbatch`).
"""

import json
import os
import signal
import subprocess
import time

import pod_box
import pytest
import run_identity
from paths import REPO

from hyperbolic_vl.tools import aot_targets

needs_the_aot_extra = pytest.mark.skipif(
  not (aot_targets.installed("libtpu") and aot_targets.installed("jax_plugins.xla_cuda12")),
  reason="the aot extra (.ci/run's last stage installs it)",
)
# A worker killed mid-run: srun's --kill-on-bad-exit sends the others
# SIGTERM and, after the cluster's KillWait (SLURM's default 30 s; this
# box's 10 s), SIGKILL; the job has ended well within this.
KILL_WAIT_S = 10
# Long enough that SLURM's signal, sent once step 3 is logged, lands well
# before the run's end on a fast machine (a tiny step takes ~0.1 s).
PREEMPTED_RUN_STEPS = 100
KILLED_JOB_ENDS_WITHIN_S = KILL_WAIT_S + 20


def config(steps: int = 3, dtype: str = "float64") -> str:
  """The config argument of `pod_box.CONFIG`: nothing for its defaults."""
  arg = ",".join(
    item
    for item, default in ((f"steps={steps}", steps == 3), (f"dtype={dtype}", dtype == "float64"))
    if not default
  )
  return f"{pod_box.CONFIG}:{arg}" if arg else pod_box.CONFIG


@pytest.fixture(scope="module")
def box(tmp_path_factory):
  return tmp_path_factory.mktemp("pod_box")


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
  """(steps, dtype) -> the workdir of `bash launch/local.sh CONFIG WORKDIR`
  (one process, this session's 8 CPU devices), trained on first use."""
  workdirs = {}

  def workdir(steps: int = 3, dtype: str = "float64"):
    if (steps, dtype) not in workdirs:
      path = tmp_path_factory.mktemp("local") / "run"
      done = subprocess.run(
        ["bash", "launch/local.sh", config(steps, dtype), str(path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
      )
      assert done.returncode == 0, done.stderr[-3000:]
      workdirs[steps, dtype] = path
    return workdirs[steps, dtype]

  return workdir


def submit_directly(box, args, **extra) -> str:
  """`sbatch --nodes=2 launch/slurm_gpu.sbatch ARGS...` from the repository
  root of a login node (the documented direct form, no check): the job's id."""
  submitted = subprocess.run(
    ["sbatch", "--nodes=2", "launch/slurm_gpu.sbatch", *args],
    cwd=REPO,
    env=pod_box.environment(box, **extra),
    capture_output=True,
    text=True,
    timeout=60,
  )
  return pod_box.job_id(submitted.stdout)


def wait_for_logged_step(workdir, step: int, job: str) -> None:
  deadline = time.monotonic() + 600
  while max(logged_steps(workdir), default=0) < step:
    assert time.monotonic() < deadline, pod_box.job_output(job)[-3000:]
    time.sleep(0.2)


def last_line(text: str) -> str:
  return text.strip().splitlines()[-1]


def logged_steps(workdir) -> list[int]:
  path = os.path.join(workdir, "metrics.jsonl")
  if not os.path.exists(path):
    return []
  with open(path) as f:
    return [json.loads(line)["step"] for line in f if line.strip()]


@pytest.mark.aot_extra
@needs_the_aot_extra
def test_slurm_from_the_login_node_checks_submits_and_trains_as_one_process(
  box, one_process, tmp_path
):
  """The login-node form: the step compiled for 2 nodes of 8 H100s, then
  the script submits itself; its job runs `srun` over 2 nodes."""
  workdir = tmp_path / "run"
  done = pod_box.run_launcher(
    box, "slurm_gpu.sbatch", [config(), str(workdir)], GPU="h100", NODES="2"
  )
  assert done.returncode == 0, done.stderr[-3000:]
  assert "Target h100:2x8" in done.stdout and ": fits" in done.stdout
  job = pod_box.job_id(done.stdout)
  code, restarts, output = pod_box.wait_for_job(box, job)
  assert (code, restarts) == (0, 0), output[-3000:]
  assert last_line(output) == (
    f"slurm_gpu.sbatch (job {job}): the run finished; its results are in {workdir}"
  )
  run_identity.compare_runs("slurm_gpu.sbatch 2 nodes x 4 vs 1 x 8", one_process(), workdir)


@pytest.mark.aot_extra
@needs_the_aot_extra
def test_tpu_vm_as_typed_checks_the_slice_and_trains_as_one_process(box, one_process, tmp_path):
  """Nothing after the workdir (the form that could never start a worker):
  the topology from `gcloud describe` (V5P 2x2x2), the step compiled for it
  (in float32: XLA:TPU compiles no float64 collectives), then the same
  command on both workers; float32, so the run is held to the optimizer's
  bound (run_identity.compare_float32_runs)."""
  workdir = tmp_path / "run"
  done = pod_box.run_launcher(
    box, "tpu_vm.sh", ["my-tpu", "zone-b", config(dtype="float32"), str(workdir)]
  )
  assert done.returncode == 0, done.stderr[-3000:]
  assert "Target v5p:2x2x2" in done.stdout and ": fits" in done.stdout
  assert (
    last_line(done.stdout) == f"launch/tpu_vm.sh: the run finished; its results are in {workdir}"
  )
  run_identity.compare_float32_runs(
    "tpu_vm.sh 2 workers x 4 vs 1 x 8 (float32)", one_process(dtype="float32"), workdir
  )


@pytest.mark.slow
def test_tpu_vm_with_trailing_overrides_trains_as_one_process(box, one_process, tmp_path):
  """Overrides after the workdir reach every worker (quoted for its
  shell): 8 evaluation examples make the chance of recall@5 5/8."""
  workdir = tmp_path / "run"
  done = pod_box.run_launcher(
    box,
    "tpu_vm.sh",
    ["my-tpu", "zone-b", config(), str(workdir), "--config.evals.world.num_examples=8"],
    TOPOLOGY="cpu:8",
  )
  assert done.returncode == 0, done.stderr[-3000:]
  assert "Target cpu:8" in done.stdout and ": fits" in done.stdout
  assert "eval/i2t_chance@5            0.6250" in done.stdout
  run_identity.compare_runs("tpu_vm.sh with overrides vs 1 x 8", one_process(), workdir)


@pytest.mark.slow
def test_sigterm_before_the_time_limit_saves_requeues_and_resumes_exactly(
  box, one_process, tmp_path
):
  """`--signal=TERM@300`: the job's limit shortened mid-run (as an
  administrator's `scontrol update` does) so that SLURM's SIGTERM comes
  now; both processes stop after the same step, save it and exit 3; the
  script requeues the job, which resumes and ends equal to an
  uninterrupted run of PREEMPTED_RUN_STEPS steps."""
  workdir = tmp_path / "run"
  job = submit_directly(box, [config(PREEMPTED_RUN_STEPS), str(workdir)])
  wait_for_logged_step(workdir, 3, job)
  # The signal 300 s before a limit of 301 s: at once; the kill would come
  # at 301 s of the job's run.
  subprocess.run(
    ["scontrol", "update", f"JobId={job}", "TimeLimit=5:01"],
    env=pod_box.environment(box),
    check=True,
    timeout=30,
  )
  code, restarts, output = pod_box.wait_for_job(box, job)
  assert (code, restarts) == (0, 1), output[-3000:]
  saved = int(output.split("Pre-empted (SIGTERM) after step ")[1].split()[0].rstrip(";:,."))
  print(f"pre-empted after step {saved} of {PREEMPTED_RUN_STEPS}")
  assert 3 <= saved < PREEMPTED_RUN_STEPS
  assert f"(job {job}): pre-empted with its step saved; requeued" in output
  assert f"Resumed from checkpoint at step {saved}" in output
  assert last_line(output).endswith(f"the run finished; its results are in {workdir}")
  assert {step for step, _ in run_identity.logged_losses(workdir)} == set(
    range(1, PREEMPTED_RUN_STEPS + 1)
  )
  run_identity.compare_runs(
    "pre-empted, requeued, resumed vs uninterrupted", one_process(PREEMPTED_RUN_STEPS), workdir
  )


@pytest.mark.slow
def test_a_configuration_error_is_not_requeued(box, tmp_path):
  job = submit_directly(box, [config(), str(tmp_path / "run"), "--config.input.batch_size=12"])
  code, restarts, output = pod_box.wait_for_job(box, job)
  assert (code, restarts) == (2, 0), output[-3000:]
  assert "error: input.batch_size=12 must be divisible" in output
  assert last_line(output) == (
    f"slurm_gpu.sbatch (job {job}): a configuration, data or workdir error (the line "
    "above); not requeued"
  )


@pytest.mark.slow
def test_a_killed_worker_ends_the_job_without_a_hang(box, tmp_path):
  workdir = tmp_path / "run"
  job = submit_directly(box, [config(1000), str(workdir)], POD_BOX_KILL_WAIT=str(KILL_WAIT_S))
  wait_for_logged_step(workdir, 2, job)
  tasks = dict(
    line.split() for line in (pod_box.job_dir(box, job) / "tasks").read_text().splitlines()
  )
  os.kill(int(tasks["1"]), signal.SIGKILL)
  killed_at = time.monotonic()
  code, restarts, output = pod_box.wait_for_job(box, job, timeout_s=KILLED_JOB_ENDS_WITHIN_S)
  ended_after = time.monotonic() - killed_at
  print(f"the job ended {ended_after:.1f} s after its worker 1 was killed")
  assert (code, restarts) == (137, 0), output[-3000:]
  assert "srun: error: 127.0.0.2: task 1: Killed" in output
  assert last_line(output) == (
    f"slurm_gpu.sbatch (job {job}): a worker failed (exit 137; srun's lines above name it); "
    "not requeued"
  )


@pytest.mark.slow
def test_a_step_that_does_not_fit_starts_nothing(tmp_path):
  """The check on the box's chips (TOPOLOGY=cpu:1, this host's memory) at a
  batch no host holds: the levers that would fit, exit 4, no worker."""
  box = tmp_path / "box"
  done = pod_box.run_launcher(
    box,
    "tpu_vm.sh",
    ["my-tpu", "zone-b", config(), str(tmp_path / "run"), "--config.input.batch_size=4194304"],
    TOPOLOGY="cpu:1",
  )
  lines = [line for line in done.stderr.splitlines() if line.strip()]
  assert done.returncode == 4, done.stderr[-3000:]
  assert lines[-2].startswith("error: the step needs ") and "to fit, set one of: " in lines[-2]
  assert lines[-1] == (
    "launch/tpu_vm.sh: nothing was started: the step does not fit a chip of cpu:1 (the levers "
    "above); SKIP_AOT=1 skips the check"
  )
  assert "does NOT fit" in done.stdout and not (box / "tpu").exists()


@pytest.mark.slow
def test_ctrl_c_in_the_check_starts_nothing(tmp_path):
  """Ctrl-C from the terminal (SIGINT to the foreground process group: the
  launcher and the check) while the step compiles: exit 130, one line from
  the check and one from the launcher, no worker reached (a box of its own,
  where no worker has ever run)."""
  box = tmp_path / "box"
  process = pod_box.start_launcher(
    box,
    "tpu_vm.sh",
    ["my-tpu", "zone-b", config(), str(tmp_path / "run")],
    TOPOLOGY="cpu:8",
    start_new_session=True,
  )
  assert process.stdout.readline().startswith("Compiling the step for cpu:8")
  time.sleep(0.3)
  os.killpg(process.pid, signal.SIGINT)
  out, err = process.communicate(timeout=120)
  lines = [line for line in err.splitlines() if line.strip()]
  assert process.returncode == 130, err[-3000:]
  assert lines == [
    "Ctrl-C: the check stopped; no report, nothing written",
    "launch/tpu_vm.sh: nothing was started: the check was interrupted; SKIP_AOT=1 skips the check",
  ]
  assert "Memory per chip" not in out and not (box / "tpu").exists()


def test_jobs_of_boxes_side_by_side_never_share_an_id(tmp_path):
  """Two boxes submitting at once (tests on two workers do): every job gets
  its own id, hence its own slurm-N.out and coordinator port (a shared id
  once had two jobs' processes meet at one coordinator)."""
  script = tmp_path / "job.sh"
  script.write_text("#!/usr/bin/env bash\ntrue\n")
  submitters = [
    subprocess.Popen(
      ["sbatch", str(script)],
      cwd=tmp_path,
      env=pod_box.environment(tmp_path / f"box{i % 2}"),
      stdout=subprocess.PIPE,
      text=True,
    )
    for i in range(8)
  ]
  jobs = [pod_box.job_id(s.communicate(timeout=60)[0]) for s in submitters]
  assert len(set(jobs)) == 8, jobs
  for i, job in enumerate(jobs):
    folder = tmp_path / f"box{i % 2}" / "jobs" / job
    deadline = time.monotonic() + 60
    while not (folder / "exit_code").exists():
      assert time.monotonic() < deadline, f"job {job} did not end"
      time.sleep(0.1)
    assert (folder / "exit_code").read_text() == "0"
