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

import importlib.util
import os
import re
import signal
import sys

from absl import app, flags, logging
from ml_collections import config_flags

from hyperbolic_vl import errors

# INFO chatter of absl, Orbax and the C++ libraries (XLA, TensorFlow under
# TFDS) stays off unless --log_info asks for it: set before they are imported.
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


def _load_config(spec: str):
  path, _, arg = spec.partition(":")
  module_spec = importlib.util.spec_from_file_location("_user_config", path)
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  return module.get_config(arg) if arg else module.get_config()


def _config_spec(argv) -> str | None:
  """The value of --config= ("configs/meru.py:vit_l"), if given."""
  return next((a.split("=", 1)[1] for a in argv if a.startswith("--config=")), None)


def _unknown_override_message(argv, error: Exception) -> str | None:
  """Names the valid keys when a --config.a.b=... override does not exist."""
  spec = _config_spec(argv)
  if spec is None:
    return None
  config = _load_config(spec)
  for arg in argv:
    match = re.match(r"--config\.([\w.]+)", arg)
    if not match:
      continue
    node, walked = config, []
    for part in match.group(1).split("."):
      if not hasattr(node, "keys") or part not in node:
        where = ".".join(["config"] + walked)
        valid = ", ".join(sorted(node.keys())) if hasattr(node, "keys") else "(a leaf value)"
        source = ""
        if walked[:2] == ["input", "data"]:
          # Another source's key: its section comes with the source's name.
          source = (
            f" (the keys of source {config.input.data.get('name')!r}; another source's come "
            "with --config.input.data.name=NAME, e.g. image_text_csv)"
          )
        return (
          f"error: unknown config key {match.group(1)!r}: {where} has no {part!r}.\n"
          f"Valid keys of {where}: {valid}{source}"
        )
      node, walked = node[part], walked + [part]
  return None


def _config_file_message(argv) -> str | None:
  """Names a --config file that does not exist (config_flags' own report is
  a 40-line traceback)."""
  spec = _config_spec(argv)
  if spec is None:
    return None
  path = spec.partition(":")[0]
  if os.path.isfile(path):
    return None
  return f"error: config file not found: {path} (--config={spec}; run from the repository root)"


def _flag_value_message(error: Exception) -> str:
  text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
  if "--config=None" in text or "--workdir=None" in text:
    missing = "--config" if "--config=None" in text else "--workdir"
    return (
      f"{missing} is required, e.g. python -m hyperbolic_vl.main "
      "--config=configs/meru.py --workdir=workdirs/meru_tiny"
    )
  return text.removeprefix("flag ")


DATA_NAME_FLAG = "--config.input.data.name="


def _source_named_on_the_command_line(argv) -> list[str]:
  """`argv` with `--config.input.data.name=NAME` made the config argument
  `data=NAME` (--config=configs/meru.py:data=NAME): the config file then
  builds `input.data` as that source's section, each of its keys
  overridable, where overriding the name alone would keep the file's own
  source's keys under the new name."""
  names = [arg[len(DATA_NAME_FLAG) :] for arg in argv if arg.startswith(DATA_NAME_FLAG)]
  spec = _config_spec(argv)
  if not names or spec is None:
    return argv
  path, _, arg = spec.partition(":")
  items = [item for item in arg.split(",") if item.strip()]
  given = [value for key, _, value in (i.partition("=") for i in items) if key.strip() == "data"]
  if given and given[-1].strip() != names[-1]:
    raise errors.ConfigError(
      f"{DATA_NAME_FLAG}{names[-1]} and the config argument data={given[-1]} name two "
      "sources; give one"
    )
  if not given:
    items.append(f"data={names[-1]}")
  return [
    f"--config={path}:{','.join(items)}" if a.startswith("--config=") else a
    for a in argv
    if not a.startswith(DATA_NAME_FLAG)
  ]


def parse_flags(argv):
  message = _config_file_message(argv)
  if message is not None:
    print(message, file=sys.stderr)
    sys.exit(errors.EXIT_USER_ERROR)
  try:
    argv = _source_named_on_the_command_line(argv)
  except errors.ConfigError as error:
    print(f"error: {error}", file=sys.stderr)
    sys.exit(errors.EXIT_USER_ERROR)
  try:
    return FLAGS(argv)
  except flags.IllegalFlagValueError as error:
    # A value of the wrong type (--config.total_steps=abc or 1.5) or a
    # required flag left out: absl's own first line says which.
    if "--verbose" in argv:
      raise
    # The config file's own error (a bad variant or argument) comes wrapped
    # in this one: its message is the line to show.
    cause = errors.innermost_user_error(error)
    message = errors.one_line(cause) if cause is not None else _flag_value_message(error)
    print(f"error: {message}", file=sys.stderr)
    sys.exit(errors.EXIT_USER_ERROR)
  except (AttributeError, KeyError) as error:
    message = _unknown_override_message(argv, error)
    if message is None:
      raise
    print(message, file=sys.stderr)
    sys.exit(errors.EXIT_USER_ERROR)
  except Exception as error:
    # The config file's own error (a bad variant or argument), which
    # config_flags and absl re-raise wrapped in their tracebacks.
    cause = errors.innermost_user_error(error)
    if cause is None or "--verbose" in argv:
      raise
    print(f"error: {errors.one_line(cause)}", file=sys.stderr)
    sys.exit(errors.EXIT_USER_ERROR)


def _stop_before_the_run(stderr_fd: int):
  """The handler of Ctrl-C outside the run (Python and JAX importing, the
  flags being read): nothing is being written then (the run installs its
  own handling). Its line goes to `stderr_fd`, a copy of stderr taken at
  start-up: importing TensorFlow points file descriptor 2 at /dev/null
  (`data/readers/tfds_import.native_logs_quiet`), which swallowed the line."""

  def stop(signum, frame):
    del frame
    name = "Ctrl-C" if signum == signal.SIGINT else "SIGTERM"
    os.write(stderr_fd, f"{name}: stopped; nothing was being written\n".encode())
    os._exit(128 + signum)

  return stop


if __name__ == "__main__":
  _stop = _stop_before_the_run(os.dup(2))
  signal.signal(signal.SIGINT, _stop)
  signal.signal(signal.SIGTERM, _stop)
  app.run(main, flags_parser=parse_flags)
