"""What a user can get wrong, as one exception family.

Every error a user causes (a configuration key or value, a missing file or
dataset, a workdir in use or holding another run) derives from `UserError`;
the command-line entry points print its message as one or two lines and
exit with `EXIT_USER_ERROR`, where any other exception is a bug and keeps
its traceback. Subclasses also derive from the builtin they refine
(ValueError, FileNotFoundError), so callers that caught those still do.
"""

from __future__ import annotations

import errno
import os
import sys

# Exit codes of `python -m hyperbolic_vl.main` (docs/training.md lists them
# for schedulers): 0 finished, 1 a bug (traceback), 2 a user error,
# 3 pre-empted with a checkpoint (run the same command again to resume).
EXIT_USER_ERROR = 2
EXIT_PREEMPTED = 3


class UserError(Exception):
  """An error the user can fix from its message alone (no traceback)."""


class ConfigError(UserError, ValueError):
  """A configuration key or value that cannot run."""


class DataError(UserError, ValueError):
  """Input data that is missing or unreadable as a whole (a bad example is
  skipped and counted instead)."""


class WorkdirError(UserError, ValueError):
  """A workdir that cannot be used: in use by another run, read-only, or
  holding a run with another configuration."""


# Errors of the environment a user fixes (a path that is not there, a folder
# they cannot write, a full or read-only disk): reported like UserError when
# the OS names the file.
_ENVIRONMENT_ERRNOS = frozenset(
  {
    errno.ENOENT,
    errno.EEXIST,
    errno.EACCES,
    errno.EPERM,
    errno.EROFS,
    errno.ENOSPC,
    errno.EDQUOT,
    errno.ENOTDIR,
    errno.EISDIR,
  }
)


def one_line(error: BaseException) -> str:
  """`error` as the line a user reads: OS errors as "reason: path"."""
  if isinstance(error, OSError) and error.filename and error.strerror:
    return f"{error.strerror}: {error.filename}"
  return str(error) or type(error).__name__


def innermost_user_error(error: BaseException | None) -> BaseException | None:
  """The first UserError raised along `error`'s chain of causes, if any
  (libraries re-raise an error inside their own, e.g. config_flags)."""
  found = None
  seen = set()
  while error is not None and id(error) not in seen:
    seen.add(id(error))
    if isinstance(error, UserError):
      found = error
    error = error.__cause__ or error.__context__
  return found


def is_user_error(error: BaseException) -> bool:
  if isinstance(error, UserError):
    return True
  # Our own code raises FileNotFoundError("... not found: PATH") without an
  # errno; the OS's errors carry one.
  path_errors = (FileNotFoundError, FileExistsError, PermissionError)
  path_errors += (NotADirectoryError, IsADirectoryError)
  return isinstance(error, path_errors) or (
    isinstance(error, OSError) and error.errno in _ENVIRONMENT_ERRNOS
  )


def report_user_errors(main):
  """Wraps an absl `main(argv)`: a user error prints `error: <message>` on
  stderr and exits EXIT_USER_ERROR; `--verbose` (where the entry point
  defines it) keeps the traceback. Every other exception is a bug and
  propagates with its traceback."""
  import functools  # pylint: disable=g-import-not-at-top

  from absl import flags  # pylint: disable=g-import-not-at-top

  @functools.wraps(main)
  def wrapped(argv):
    try:
      return main(argv)
    except Exception as error:  # noqa: BLE001 (re-raised unless a user error)
      verbose = "verbose" in flags.FLAGS and flags.FLAGS.verbose
      if verbose or not is_user_error(error):
        raise
      print(f"error: {one_line(error)}", file=sys.stderr, flush=True)
      sys.exit(EXIT_USER_ERROR)

  return wrapped


LOG_INFO_FLAG = "--log_info"


def define_log_info_flag(flag_values=None) -> None:
  """Defines `--log_info` for a command (main, evaluate, export, convert,
  plot): the one switch that brings back the INFO logging of absl, Orbax,
  JAX and XLA. Call it while the command's module loads, before those
  libraries do: when that module runs as the command, the C++ side is set
  here too (`quiet_native_logs`)."""
  from absl import flags  # pylint: disable=g-import-not-at-top

  # Only for a command that runs (its module is __main__, the caller's
  # globals say so): a module imported by a notebook or a test leaves the
  # environment as it found it.
  if sys._getframe(1).f_globals.get("__name__") == "__main__":
    quiet_native_logs()
  flags.DEFINE_bool(
    "log_info",
    False,
    "Show the INFO logging of absl, Orbax, JAX and XLA (off: warnings only).",
    flag_values=flags.FLAGS if flag_values is None else flag_values,
  )


def quiet_library_info(flag_values=None) -> None:
  """Sets absl's verbosity to WARNING unless the command line gave
  `--log_info` (or absl's own `--verbosity`): the INFO lines of Orbax and
  JAX (each checkpoint restore's timings and handlers, dozens per run) are
  no part of a command's report. Call it in an absl `main`, after flag
  parsing."""
  from absl import flags, logging  # pylint: disable=g-import-not-at-top

  given = flags.FLAGS if flag_values is None else flag_values
  asked = "log_info" in given and given.log_info
  if not asked and not ("verbosity" in given and given["verbosity"].present):
    logging.set_verbosity(logging.WARNING)


def quiet_native_logs() -> None:
  """Keeps the C++ libraries' INFO lines (XLA, TensorFlow under TFDS) off
  unless the command line gives `--log_info`: TF_CPP_MIN_LOG_LEVEL, read
  when those libraries load. For a command as it starts, never at import
  (`define_log_info_flag` calls it for the command that runs)."""
  if LOG_INFO_FLAG not in sys.argv:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")


def exit_at_once_on_interrupt(line: str, remove_on_exit: list[str] | None = None) -> None:
  """Ctrl-C (SIGINT) or SIGTERM ends the command at once: `line` (with the
  signal's name) on stderr, the paths in `remove_on_exit` removed (what
  the command wrote that an interrupted run must not leave), exit status
  128 + the signal. For a command's stretches where nothing must be
  finished or saved (start-up, a check that only reports). The line goes to
  a copy of stderr taken here: importing TensorFlow points file descriptor
  2 at /dev/null (data/readers/tfds_import), and a command may capture it."""
  import signal  # pylint: disable=g-import-not-at-top

  stderr_fd = os.dup(2)
  pending = remove_on_exit if remove_on_exit is not None else []

  def stop(signum, frame):
    del frame
    for path in pending:
      try:
        os.remove(path)
      except OSError:
        pass
    name = "Ctrl-C" if signum == signal.SIGINT else "SIGTERM"
    os.write(stderr_fd, f"{name}: {line}\n".encode())
    os._exit(128 + signum)

  signal.signal(signal.SIGINT, stop)
  signal.signal(signal.SIGTERM, stop)
