"""TensorFlow Datasets imported without TensorFlow's C++ start-up lines.

Importing TensorFlow (which TFDS does) writes INFO lines from C++ ("oneDNN
custom operations are on", twice) straight to file descriptor 2, where
neither absl's Python verbosity nor TF_CPP_MIN_LOG_LEVEL reaches them. Only
the TFDS data sources and evaluators import it; a run on other data never
loads TensorFlow.
"""

from __future__ import annotations

import contextlib
import os
import sys

from absl import logging


@contextlib.contextmanager
def native_logs_quiet():
  """File descriptor 2 points at /dev/null inside the block, unless absl
  logs INFO (`--log_info`). Python's own errors still raise as exceptions."""
  if logging.get_verbosity() >= logging.INFO:
    yield
    return
  sys.stderr.flush()
  saved = os.dup(2)
  devnull = os.open(os.devnull, os.O_WRONLY)
  try:
    os.dup2(devnull, 2)
    yield
  finally:
    os.dup2(saved, 2)
    os.close(saved)
    os.close(devnull)


def tensorflow_datasets():
  """The `tensorflow_datasets` module, imported (with TensorFlow) quietly."""
  with native_logs_quiet():
    import tensorflow  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import
    import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top

  return tfds
