"""Command-line entry point: flags -> config -> loop.train_and_evaluate.

  python -m hyperbolic_vl.main --config=configs/meru.py:tiny --workdir=/tmp/meru
  python -m hyperbolic_vl.main --config=configs/meru.py:vit_l --workdir=... \
      --config.total_steps=20            # any config key can be overridden

Multi-host (TPU pods, multi-node GPU): pass --multihost so every
process joins JAX's own runtime (jax.distributed.initialize reads the
cluster environment: TPU metadata, SLURM, or the JAX_COORDINATOR_* vars).
Elsewhere, e.g. several CPU processes on one machine, give the values:

  python -m hyperbolic_vl.main --multihost --coordinator_address=127.0.0.1:PORT \
      --num_processes=2 --process_id=I --config=... --workdir=...
"""

import os
import signal
import sys

from absl import app, flags, logging
from ml_collections import config_flags

from hyperbolic_vl import command_line, errors

# INFO chatter of absl, Orbax and the C++ libraries (XLA, TensorFlow under
# TFDS) stays off unless --log_info asks for it (errors.quiet_native_logs).
errors.define_log_info_flag()

flags.DEFINE_string("workdir", None, "Checkpoints, metrics.jsonl and TensorBoard logs.")
flags.DEFINE_bool("multihost", False, "Call jax.distributed.initialize() first.")
flags.DEFINE_string(
  "coordinator_address", None, "host:port of process 0 (default: discovered from the cluster)."
)
flags.DEFINE_integer("num_processes", None, "Number of processes (default: discovered).")
flags.DEFINE_integer("process_id", None, "This process's index (default: discovered).")
flags.DEFINE_bool("verbose", False, "Show the traceback of a configuration, data or workdir error.")
config_flags.DEFINE_config_file(
  "config", None, "Config file, e.g. configs/meru.py:vit_l.", lock_config=True
)
flags.mark_flags_as_required(["config", "workdir"])
FLAGS = flags.FLAGS


@errors.report_user_errors
def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  errors.quiet_library_info()
  if not FLAGS.workdir.strip():
    # An unset shell variable (--workdir=$WORKDIR): the run would fill the
    # current directory with checkpoints and metrics.
    raise errors.ConfigError("--workdir is empty; give the folder the run writes to")
  from hyperbolic_vl.training import host_memory

  # Before JAX starts its CPU backend's threads (see host_memory).
  allocator_note = host_memory.keep_freed_host_memory()
  import jax  # after flag parsing so --jax_* flags apply

  explicit = (FLAGS.coordinator_address, FLAGS.num_processes, FLAGS.process_id)
  if any(v is not None for v in explicit) and not FLAGS.multihost:
    raise app.UsageError("--coordinator_address/--num_processes/--process_id need --multihost")
  if FLAGS.multihost:
    # Collectives of the CPU backend (CPU-only runs, e.g. several processes
    # on one machine) cross processes through gloo; accelerators are unaffected.
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
      coordinator_address=FLAGS.coordinator_address,
      num_processes=FLAGS.num_processes,
      process_id=FLAGS.process_id,
    )
    if jax.process_index() != 0:
      # One report per run: progress and results come from process 0 (which
      # also alone writes metrics); warnings and errors still reach stderr.
      sys.stdout = open(os.devnull, "w")  # noqa: SIM115 (lives as long as the process)
  from hyperbolic_vl.training import loop, preemption

  logging.info(
    "JAX %s, %d processes, %d devices", jax.__version__, jax.process_count(), jax.device_count()
  )
  logging.info("%s", allocator_note)
  try:
    results = loop.train_and_evaluate(FLAGS.config, FLAGS.workdir, exit_at_once=True)
  except preemption.RunInterrupted:
    sys.exit(preemption.EXIT_INTERRUPTED)  # its step saved and its line printed
  except loop.NonFiniteLossError as error:
    if FLAGS.verbose:
      raise
    # The run diverged: not the user's typo (exit 2) nor a bug (a traceback).
    print(f"error: {error}", file=sys.stderr, flush=True)
    sys.exit(1)
  finally:
    # The outcome is decided and on disk, its line printed. Python's teardown
    # (JAX's backends, Orbax's and grain's threads) takes a second or more,
    # and late in it Python puts the default back for a handler it installed:
    # a Ctrl-C there killed a finished run with no line and exit status -2
    # (130 in a shell). An ignored signal is left ignored through teardown.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
  if FLAGS.multihost:
    # Every process has its outcome (trained, or pre-empted and saved): all
    # meet at JAX's shutdown barrier now, while everything is alive. Left to
    # interpreter exit, the barrier comes after each process's own teardown
    # (JAX's exit hook runs last), and one process could take its end of the
    # coordination service or of gloo down while the other was still in its
    # teardown; the one left ended with SIGABRT. A process that failed
    # (an exception above) skips it, so the others' errors still surface.
    jax.distributed.shutdown()
  if results is None:
    # Pre-empted with a checkpoint: a distinct code tells a scheduler to
    # requeue the same command (launch/slurm_gpu.sbatch does).
    sys.exit(errors.EXIT_PREEMPTED)


def parse_flags(argv):
  return command_line.parse_flags(
    argv,
    FLAGS,
    example="python -m hyperbolic_vl.main --config=configs/meru.py --workdir=workdirs/meru_tiny",
  )


if __name__ == "__main__":
  # Until the run installs its own handling (which saves a step), nothing
  # is being written: Python and JAX importing, the flags being read.
  errors.exit_at_once_on_interrupt("stopped; nothing was being written")
  app.run(main, flags_parser=parse_flags)
