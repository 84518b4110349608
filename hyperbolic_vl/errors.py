"""What a user can get wrong, as one exception family.

Every error a user causes (a configuration key or value, a missing file or
dataset, a workdir in use or holding another run) derives from `UserError`;
the command-line entry points print its message as one or two lines and
exit with `EXIT_USER_ERROR`, where any other exception is a bug and keeps
its traceback. Subclasses also derive from the builtin they refine
(ValueError, FileNotFoundError), so callers that caught those still do.
"""

from __future__ import annotations

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
