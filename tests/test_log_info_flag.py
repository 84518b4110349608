"""One switch for library INFO logging on every command: `--log_info`.

main, evaluate, export, convert and plot each define it through
`errors.define_log_info_flag` and call `errors.quiet_library_info` after
parsing; absl's own `--verbosity` is honoured too."""

import pytest
from absl import flags, logging

from hyperbolic_vl import errors


@pytest.fixture
def restored_verbosity():
  before = logging.get_verbosity()
  yield
  logging.set_verbosity(before)


@pytest.mark.parametrize(
  "argv, verbosity",
  [
    ([], logging.WARNING),
    (["--log_info"], logging.INFO),
    (["--verbosity=0"], logging.INFO),  # absl's own flag, given: left as asked
  ],
)
def test_library_info_is_off_unless_asked(argv, verbosity, restored_verbosity):
  flag_values = flags.FlagValues()
  errors.define_log_info_flag(flag_values)
  flags.DEFINE_integer("verbosity", -1, "absl's own flag.", flag_values=flag_values)
  flag_values(["command", *argv])
  logging.set_verbosity(logging.INFO)  # what absl starts a command with
  errors.quiet_library_info(flag_values)
  assert logging.get_verbosity() == verbosity
