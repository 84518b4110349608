"""Run directories: the functional model form, Orbax checkpoints, a run's
saved config, and restoring another run's params.

Kept apart from the trainer so that anything needing another run's params
(the HMID-Net teacher, `init_from`, evaluation) can read them without
importing the training loop or the objective registry.
"""

from __future__ import annotations

import contextlib
import errno
import importlib.metadata
import json
import logging
import os
import platform
import shutil
import subprocess
import time
import weakref
from collections.abc import Callable
from typing import Any

import jax
import ml_collections
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

from hyperbolic_vl import errors
from hyperbolic_vl.runs import abandoned_operations


class CheckpointMismatchError(errors.WorkdirError):
  """A checkpoint or workdir that holds another model, objective or shape."""


class CheckpointSaveError(errors.WorkdirError):
  """A checkpoint that could not be written (a full disk, lost storage)."""


class NoReadableCheckpointError(errors.WorkdirError):
  """Every checkpoint of a workdir is unreadable."""


# Orbax writes a step into "<step>.orbax-checkpoint-tmp-<time>" and renames it
# to "<step>" once complete, so a folder with this in its name is incomplete.
TEMPORARY_MARKER = ".orbax-checkpoint-tmp"
# Beside the checkpoints folder, so Orbax never lists what it holds.
CORRUPT_FOLDER = "corrupt_checkpoints"

# Orbax saves a replicated array in parallel from its replicas, each writing
# a slice that it first cuts on its device with a small XLA program compiled
# per device and shape: for the biases, norms and scalars that make up most
# arrays of a model, that is compiling, not writing (104 compiles at the
# tiny MERU's first save on 8 devices, ~20 s on a 2-core CPU). Parallel
# saving is kept where each replica's slice is at least 1 MiB, where it
# spreads real writing over the replicas.
REPLICA_PARALLEL_MIN_SLICE_BYTES = 1 << 20


def _register_array_handler() -> None:
  # Orbax logs a WARNING for every override it is asked for; this one is
  # deliberate, and the line would stand in every command's output.
  absl_logger = logging.getLogger("absl")
  level = absl_logger.level
  absl_logger.setLevel(logging.ERROR)
  try:
    ocp.type_handlers.register_type_handler(
      jax.Array,
      ocp.type_handlers.ArrayHandler(
        # The default handler's metadata store: the same files as before.
        array_metadata_store=ocp.type_handlers.get_type_handler(jax.Array)._array_metadata_store,
        min_slice_bytes_for_replica_parallel=REPLICA_PARALLEL_MIN_SLICE_BYTES,
      ),
      override=True,
    )
  finally:
    absl_logger.setLevel(level)


_register_array_handler()


def json_config(config) -> dict:
  return (
    json.loads(config.to_json_best_effort())
    if hasattr(config, "to_json_best_effort")
    else dict(config)
  )


def differences(
  saved: Any, current: Any, prefix: str = "", absent_is: Callable[[str, Any], bool] | None = None
) -> list[str]:
  """Settings that differ, as "key: checkpoint X vs config Y" lines.
  `absent_is(key, value)`: True when a key the saved config lacks (one added
  to the code since) behaved as `value` does, so it is no difference."""
  if isinstance(saved, dict) and isinstance(current, dict):
    out = []
    for key in sorted(set(saved) | set(current)):
      if key not in saved and absent_is is not None and absent_is(f"{prefix}{key}", current[key]):
        continue
      out += differences(
        saved.get(key, "<absent>"), current.get(key, "<absent>"), f"{prefix}{key}.", absent_is
      )
    return out
  return [] if saved == current else [f"{prefix[:-1]}: checkpoint {saved!r} vs config {current!r}"]


def saved_steps(directory: str) -> list[int]:
  """The complete (renamed into place) steps in a checkpoints folder, ascending."""
  if not os.path.isdir(directory):
    return []
  return sorted(
    int(name)
    for name in os.listdir(directory)
    if name.isdigit() and os.path.isdir(os.path.join(directory, name))
  )


def temporary_folders(directory: str) -> list[str]:
  """Folders of saves that never completed (the run died or the save failed)."""
  if not os.path.isdir(directory):
    return []
  return sorted(
    os.path.join(directory, name) for name in os.listdir(directory) if TEMPORARY_MARKER in name
  )


def _path_name(path) -> str:
  parts = []
  for key in path:
    for attribute in ("key", "idx", "name"):
      if hasattr(key, attribute):
        parts.append(str(getattr(key, attribute)))
        break
    else:
      parts.append(str(key))
  return ".".join(parts)


def _shapes_by_path(tree) -> dict[str, tuple]:
  out = {}
  for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
    shape, dtype = getattr(leaf, "shape", None), getattr(leaf, "dtype", None)
    out[_path_name(path)] = (
      None if shape is None else tuple(shape),
      None if dtype is None else np.dtype(dtype).name,
    )
  return out


def saved_state_metadata(step_directory: str):
  """The shapes and dtypes saved for a step's train state (reads only the
  metadata files, not the arrays)."""
  return ocp.StandardCheckpointHandler().metadata(epath.Path(step_directory) / "state").tree


def shape_differences(saved_metadata, abstract_state, limit: int = 5) -> list[str]:
  """What differs between a checkpoint's saved arrays and the state a config
  builds: missing or extra entries and other shapes or dtypes, by path."""
  saved, expected = _shapes_by_path(saved_metadata), _shapes_by_path(abstract_state)
  # The params first: the optimizer's moments only repeat their shapes.
  order = lambda paths: sorted(paths, key=lambda path: (not path.startswith("params."), path))
  out = [f"{path}: absent from the checkpoint" for path in order(set(expected) - set(saved))]
  out += [f"{path}: in the checkpoint only" for path in order(set(saved) - set(expected))]
  for path in order(set(saved) & set(expected)):
    (saved_shape, saved_dtype), (shape, dtype) = saved[path], expected[path]
    if saved_shape is None or shape is None:
      continue
    if saved_shape != shape or saved_dtype != dtype:
      out.append(
        f"{path}: checkpoint {saved_dtype}{list(saved_shape)} vs config {dtype}{list(shape)}"
      )
  if len(out) > limit:
    out = out[:limit] + [f"and {len(out) - limit} more"]
  return out


def first_line(error: BaseException, limit: int = 200) -> str:
  # Orbax wraps TensorStore's error in one whose message is a repr of the
  # array's whole TensorStore spec; TensorStore's own message names the file.
  if error.__cause__ is not None and "TensorStore details" in str(error):
    error = error.__cause__
  text = str(error).strip().splitlines()
  text = f"{type(error).__name__}: {text[0] if text else ''}"
  return text if len(text) <= limit else text[: limit - 3] + "..."


def read_step(directory: str, step: int, abstract_state: dict) -> tuple[dict, dict]:
  """(train state, data-iterator state) of one saved step; the state's arrays
  are placed as `abstract_state`'s shardings say. Raises
  CheckpointMismatchError, naming the first differing entries, when the
  saved shapes or dtypes are not those of `abstract_state` (Orbax would
  otherwise restore some other shapes without a word); any other exception
  means the step's files are unreadable."""
  with abandoned_operations.settled():
    step_directory = os.path.join(directory, str(step))
    differing = shape_differences(saved_state_metadata(step_directory), abstract_state)
    if differing:
      raise CheckpointMismatchError(
        f"checkpoint {step_directory} does not match this config's model/optimizer (was it "
        "written by another config?): " + "; ".join(differing)
      )
    checkpointer = ocp.Checkpointer(ocp.CompositeCheckpointHandler())
    try:
      restored = checkpointer.restore(
        epath.Path(step_directory),
        args=ocp.args.Composite(
          state=ocp.args.StandardRestore(abstract_state), data=ocp.args.JsonRestore()
        ),
      )
    finally:
      checkpointer.close()
  return restored["state"], restored["data"]


class Resumable:
  """The newest readable step of a workdir and the unreadable ones after it."""

  def __init__(self, step: int, state: dict, data_state: dict, unreadable: dict[int, str]):
    self.step, self.state, self.data_state = step, state, data_state
    self.unreadable = unreadable  # step -> first line of its error


def find_resumable(directory: str, abstract_state: dict) -> Resumable | None:
  """Restores the newest step of `directory` that can be read, newest first;
  None when it holds no step. Reads only: the caller moves the unreadable
  steps aside (`move_aside`) once the whole run is validated.

  A step whose saved shapes differ from `abstract_state` stops the search
  (CheckpointMismatchError: the config changed, and an older step of the
  same run would differ the same way); when no step can be read at all,
  nothing is moved and NoReadableCheckpointError names them."""
  steps = saved_steps(directory)
  unreadable = {}
  for step in reversed(steps):
    try:
      state, data_state = read_step(directory, step, abstract_state)
    except CheckpointMismatchError:
      raise
    except Exception as error:  # noqa: BLE001 (any failure to read means unreadable)
      unreadable[step] = first_line(error)
      continue
    return Resumable(step, state, data_state, unreadable)
  if unreadable:
    raise NoReadableCheckpointError(
      f"no checkpoint in {directory} can be read ("
      + "; ".join(f"step {s}: {e}" for s, e in unreadable.items())
      + f"); move them out of {directory} to start the run afresh, or use another --workdir"
    )
  return None


def move_aside(workdir: str, step: int) -> str:
  """Moves checkpoint `step` to WORKDIR/corrupt_checkpoints/<step> (with a
  numbered suffix if that exists); never deletes it. Returns the new path."""
  target_root = os.path.join(workdir, CORRUPT_FOLDER)
  os.makedirs(target_root, exist_ok=True)
  target = os.path.join(target_root, str(step))
  suffix = 1
  while os.path.exists(target):
    target, suffix = os.path.join(target_root, f"{step}.{suffix}"), suffix + 1
  os.replace(os.path.join(workdir, "checkpoints", str(step)), target)
  return target


def remove_temporary_folders(directory: str) -> list[str]:
  """Deletes the folders of saves that never completed (incomplete by
  definition: Orbax renames a save into place only once all of it is
  written); returns their names."""
  removed = []
  for path in temporary_folders(directory):
    shutil.rmtree(path, ignore_errors=True)
    removed.append(os.path.basename(path))
  return removed


class Checkpointer:
  """Orbax manager holding train state + data-iterator state per step.

  Orbax writes in a background thread; a save that fails there surfaces
  only when the next one starts. `raise_if_save_failed` looks without
  waiting, so the loop stops at the next step, and every failure is raised
  as one CheckpointSaveError naming the last complete step on disk."""

  def __init__(self, workdir: str, keep: int):
    # Orbax's abandoned operations are settled for the manager's life (its
    # saves run on Orbax's background thread): until `close()`, or until a
    # checkpointer never closed (a run that raised) is collected.
    settled = contextlib.ExitStack()
    settled.enter_context(abandoned_operations.settled())
    self._end_settling = weakref.finalize(self, settled.close)
    self.directory = os.path.join(os.path.abspath(workdir), "checkpoints")
    self.manager = ocp.CheckpointManager(
      self.directory, options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=True)
    )
    self._in_flight = None  # the step of the last save started

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def save(self, step: int, state: dict, data_state: dict, force: bool = False) -> None:
    try:
      self.manager.save(
        step,
        args=ocp.args.Composite(
          state=ocp.args.StandardSave(state), data=ocp.args.JsonSave(data_state)
        ),
        force=force,
      )
    except Exception as error:  # noqa: BLE001 (this one, or the previous one's failure)
      raise self._save_error(error, at_step=step) from error
    self._in_flight = step

  def raise_if_save_failed(self, at_step: int) -> None:
    """Raises CheckpointSaveError if a background save has failed; never
    waits for one still writing."""
    if self._in_flight is None or self.manager.is_saving_in_progress():
      return
    try:
      self.manager.wait_until_finished()  # finished: returns at once, or raises its error
    except Exception as error:  # noqa: BLE001
      raise self._save_error(error, at_step=at_step) from error
    self._in_flight = None

  def _save_error(self, error: BaseException, at_step: int) -> CheckpointSaveError:
    failed = self._in_flight if self._in_flight is not None else at_step
    self._in_flight = None
    good = [s for s in saved_steps(self.directory) if s != failed]
    last = (
      f"the last good checkpoint is step {good[-1]} in {self.directory}"
      if good
      else f"no complete checkpoint in {self.directory}"
    )
    return CheckpointSaveError(
      f"saving the checkpoint of step {failed} failed ({first_line(error)}); training "
      f"stopped at step {at_step}; {last}"
    )

  def restore(self, step: int, abstract_state: dict) -> tuple[dict, dict]:
    """State and data-iterator state of `step` (see `read_step`)."""
    try:
      return read_step(self.directory, step, abstract_state)
    except CheckpointMismatchError:
      raise
    except (ValueError, KeyError, TypeError) as e:
      raise CheckpointMismatchError(
        f"checkpoint {self.directory}/{step} does not match this config's model/optimizer "
        f"(was it written by another config?): {first_line(e)}"
      ) from e

  def reload(self) -> None:
    """Re-reads the steps on disk (after `move_aside`)."""
    self.manager.reload()

  def wait(self, at_step: int | None = None) -> None:
    try:
      self.manager.wait_until_finished()
    except Exception as error:  # noqa: BLE001
      raise self._save_error(
        error, at_step=at_step if at_step is not None else self._in_flight or 0
      ) from error
    self._in_flight = None

  def close(self) -> None:
    try:
      self.manager.close()  # waits for a save in flight
    finally:
      self._end_settling()


def load_run_config(workdir: str) -> ml_collections.ConfigDict:
  path = os.path.join(workdir, "config.json")
  if os.path.isdir(workdir) and not os.access(workdir, os.R_OK | os.X_OK):
    # Unlistable, config.json would look absent: say what is wrong instead.
    raise PermissionError(
      errno.EACCES, "Permission denied (cannot read the run directory)", workdir
    )
  if not os.path.exists(path):
    raise FileNotFoundError(f"{path} not found: {workdir} is not a hyperbolic_vl workdir")
  return load_config_file(path)


def load_config_file(path: str) -> ml_collections.ConfigDict:
  with open(path) as f:
    return ml_collections.ConfigDict(json.load(f))


PROVENANCE_PACKAGES = (
  "jax",
  "jaxlib",
  "flax",
  "optax",
  "orbax-checkpoint",
  "grain",
  "numpy",
  "ml-collections",
  "tensorflow-datasets",
  "hyperbolic_vl",
)


def _git_revision() -> str | None:
  """The source checkout's commit (+ "-dirty" with local changes), if any."""
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  try:
    revision = subprocess.run(
      ["git", "-C", root, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10
    )
    if revision.returncode != 0:
      return None
    status = subprocess.run(
      ["git", "-C", root, "status", "--porcelain", "--untracked-files=no"],
      capture_output=True,
      text=True,
      timeout=10,
    )
    return revision.stdout.strip() + ("-dirty" if status.stdout.strip() else "")
  except (OSError, subprocess.SubprocessError):
    return None


def record_provenance(workdir: str, start_step: int, mesh) -> dict:
  """Appends this start of the run to WORKDIR/provenance.jsonl (process 0):
  time, step, git revision, package versions, processes and devices."""
  versions = {}
  for name in PROVENANCE_PACKAGES:
    try:
      versions[name] = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
      continue
  devices = mesh.devices.flatten()
  record = {
    "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    "start_step": int(start_step),
    "git_revision": _git_revision(),
    "python": platform.python_version(),
    "packages": versions,
    "process_count": jax.process_count(),
    "host": platform.node(),
    "devices": {
      "count": len(devices),
      "kind": devices[0].device_kind,
      "platform": devices[0].platform,
      "per_process": len(jax.local_devices()),
    },
  }
  if jax.process_index() == 0:
    with open(os.path.join(workdir, "provenance.jsonl"), "a") as f:
      f.write(json.dumps(record, sort_keys=True) + "\n")
  return record
