"""Files that other processes read while one writes them."""

from __future__ import annotations

import errno
import os
import tempfile


def write_file_atomically(path: str, text: str | bytes) -> None:
  """Writes `path` aside and renames it into place. Every process of a run
  may read a workdir file (config.json, metrics.jsonl, a shard index) while
  one process writes it; the rename means they see the old file or the new
  one, never the empty or half-written one that writing in place shows for
  a moment. `text` may be bytes (a PNG). Creates the folder if needed."""
  directory, name = os.path.split(os.path.abspath(path))
  if os.path.isdir(path):  # else the rename's error names the hidden temporary file
    raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), path)
  os.makedirs(directory, exist_ok=True)
  descriptor, temporary = tempfile.mkstemp(prefix=f".{name}.", dir=directory)
  try:
    if isinstance(text, bytes):
      with os.fdopen(descriptor, "wb") as f:
        f.write(text)
    else:
      with os.fdopen(descriptor, "w", encoding="utf-8") as f:
        f.write(text)
    os.chmod(temporary, 0o644)  # mkstemp's 0600 would hide a shared workdir's files
    os.replace(temporary, path)
  except BaseException:
    os.unlink(temporary)
    raise
