"""A run's directory before training: the lock that keeps a second run out,
the saved config a resume must match, and params taken from another run
(`config.init_from`)."""

from __future__ import annotations

import itertools
import json
import logging
import os
import platform
import secrets
import sys
import time

import jax
import jax.numpy as jnp
from flax.nnx import traversals

from hyperbolic_vl import errors, files
from hyperbolic_vl.models import lora
from hyperbolic_vl.runs import checkpointing, loading, metrics_io

LOCK_FILE = "run.lock"

# Workdirs this process holds locks on: a second lock on one of them from
# this same process (a nested or concurrent train call) is refused like one
# from another process, while a lock file naming this pid that this process
# does not hold was left by an earlier process with the same pid.
_held: set[str] = set()
# Numbers the lock outcomes process 0 publishes to the other processes; every
# process of a run takes the same locks in the same order.
_lock_sequence = itertools.count()


def _process_start_time(pid: int) -> float | None:
  """When process `pid` started (seconds since the epoch), from /proc; None
  where /proc is not there (macOS) or the process is gone."""
  try:
    with open(f"/proc/{pid}/stat") as f:
      ticks = int(f.read().rsplit(")", 1)[1].split()[19])
    with open("/proc/stat") as f:
      boot = next(int(line.split()[1]) for line in f if line.startswith("btime"))
  except (OSError, ValueError, IndexError, StopIteration):
    return None
  return boot + ticks / os.sysconf("SC_CLK_TCK")


def _pid_alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:  # another user's process: alive
    return True
  return True


class WorkdirLock:
  """An exclusive lock on a workdir for the length of a run: the file
  WORKDIR/run.lock, created with O_CREAT|O_EXCL (atomic on local and network
  filesystems, where fcntl locks are not reliable), holding the host, pid
  and start time of the run that holds it.

  A lock of another live run refuses at once with one line naming it. A lock
  left by a dead process on this host (its pid is gone, or now belongs to a
  process started after the lock was taken) is taken over with a warning; a
  lock of another host cannot be checked from here, so it refuses and says
  how to remove it. Several processes: process 0 alone takes the lock and
  publishes the outcome through JAX's coordination service, so the other
  processes stop with the same message instead of waiting at the first
  barrier. The lock file is removed on exit, exceptions included; a workdir
  this lock created is removed again when the run left nothing in it.
  """

  def __init__(self, workdir: str):
    self.workdir = os.path.abspath(workdir)
    self._key = os.path.realpath(self.workdir)
    self.path = os.path.join(self.workdir, LOCK_FILE)
    self._token = None
    self._created_workdir = False

  def __enter__(self) -> WorkdirLock:
    if jax.process_count() == 1:
      self._acquire()
      return self
    from jax._src import distributed  # pylint: disable=g-import-not-at-top

    client = distributed.global_state.client
    key = f"hyperbolic_vl/workdir_lock/{next(_lock_sequence)}"
    if jax.process_index() != 0:
      outcome = client.blocking_key_value_get(key, 600 * 1000)
      if outcome != "ok":
        raise errors.WorkdirError(outcome)
      return self
    try:
      self._acquire()
    except BaseException as error:
      message = str(error) if isinstance(error, errors.WorkdirError) else repr(error)
      client.key_value_set(key, message or "process 0 could not lock the workdir")
      raise
    client.key_value_set(key, "ok")
    return self

  def __exit__(self, *exc) -> bool:
    self.release()
    return False

  def _acquire(self) -> None:
    if self._key in _held:
      raise errors.WorkdirError(self._in_use_message(self._read() or {}))
    try:
      if not os.path.isdir(self.workdir):
        os.makedirs(self.workdir)
        self._created_workdir = True
    except OSError as error:
      raise errors.WorkdirError(f"cannot create {self.workdir}: {error.strerror}") from error
    token = secrets.token_hex(8)
    record = {
      "host": platform.node(),
      "pid": os.getpid(),
      "started": time.time(),
      "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
      "token": token,
    }
    for _ in range(10):
      try:
        descriptor = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
      except FileExistsError:
        descriptor = None
      except OSError as error:  # a read-only workdir, say
        raise errors.WorkdirError(f"cannot lock {self.workdir}: {error.strerror}") from error
      if descriptor is None:
        holder = self._read()
        if holder is None:  # removed, or still being written: look again
          time.sleep(0.1)
        else:
          self._take_over_if_stale(holder)
        continue
      with os.fdopen(descriptor, "w") as f:
        f.write(json.dumps(record) + "\n")
      self._token = token
      _held.add(self._key)
      return
    raise errors.WorkdirError(
      f"cannot lock {self.workdir}: {self.path} is unreadable or keeps changing; if no run "
      f"uses this workdir, delete {self.path} and start again"
    )

  def _read(self) -> dict | None:
    """The holder's record; None while the file is absent or half written."""
    try:
      with open(self.path) as f:
        text = f.read()
      return json.loads(text)
    except (FileNotFoundError, json.JSONDecodeError):
      return None

  def _in_use_message(self, holder: dict) -> str:
    return (
      f"{self.workdir} is in use by another run (host {holder.get('host')}, pid "
      f"{holder.get('pid')}, started {holder.get('started_at')}); wait for it to end or "
      f"use another --workdir"
    )

  def _take_over_if_stale(self, holder: dict) -> None:
    """Removes `holder`'s lock when it is known dead; raises when it is alive
    or cannot be checked (another host)."""
    host, pid = holder.get("host"), holder.get("pid")
    if host != platform.node():
      raise errors.WorkdirError(
        f"{self.workdir} is locked by a run on host {host} (pid {pid}, started "
        f"{holder.get('started_at')}); if that run is no longer running, delete {self.path} "
        "and start again"
      )
    if not isinstance(pid, int):
      raise errors.WorkdirError(
        f"{self.path} names no process; if no run uses this workdir, delete it and start again"
      )
    if pid == os.getpid():
      alive = False  # this process holds no lock on it (checked above): an earlier one's
    elif not _pid_alive(pid):
      alive = False
    else:
      # A pid taken by a process that started after the lock was written is
      # reused (a restarted container numbers its processes the same way).
      started, locked = _process_start_time(pid), holder.get("started")
      alive = started is None or not isinstance(locked, (int, float)) or started <= locked + 1.0
    if alive:
      raise errors.WorkdirError(self._in_use_message(holder))
    # Moved aside, then checked: of two runs taking over one stale lock at
    # once, the one that moved a fresh lock (the other's) puts it back.
    aside = f"{self.path}.stale.{os.getpid()}"
    try:
      os.rename(self.path, aside)
    except FileNotFoundError:
      return
    with open(aside) as f:
      try:
        moved = json.loads(f.read())
      except json.JSONDecodeError:  # a fresh lock still being written
        moved = {}
    if moved != holder:
      try:
        os.link(aside, self.path)
      except FileExistsError:
        pass
      os.unlink(aside)
      return
    os.unlink(aside)
    print(
      f"warning: took over the lock of {self.workdir} left by pid {pid} on {host} (started "
      f"{holder.get('started_at')}), which is no longer running",
      file=sys.stderr,
      flush=True,
    )

  def release(self) -> None:
    if self._token is None:
      return
    holder = self._read()
    if holder is not None and holder.get("token") == self._token:
      os.unlink(self.path)
    self._token = None
    _held.discard(self._key)
    if self._created_workdir:
      try:
        os.rmdir(self.workdir)  # only if empty: a first start stopped before writing
      except OSError:
        pass


def _absent_means(key: str, value) -> bool:
  """Model keys added since a run may have been saved: a saved config
  without them ran with the value that switches them off."""
  if key == "model.lora":
    return not lora.LoraSettings.from_model_config({"lora": value}).enabled
  if key.startswith("model.lock_") or key in (
    "model.learned_entail_weight",
    "objective.entail_weight_learned",
  ):
    return not value
  if key == "objective.entail_warmup_steps":
    return value == 0
  return False


# Model keys that change what a step keeps in memory, not the function it
# computes: a run may resume with other values (remat turned on after running
# out of memory), and workdirs saved before the keys existed still match.
MEMORY_ONLY_MODEL_KEYS = ("image_remat", "text_remat")


def check_config_matches_workdir(config, workdir: str) -> None:
  """Refuses to resume a workdir written by a different model/objective.
  Reads only: `write_config` saves the config once the run is validated."""
  path = os.path.join(workdir, "config.json")
  if not os.path.exists(path):
    return
  with open(path) as f:
    saved = json.load(f)
  current = checkpointing.json_config(config)
  diffs = []
  for section in ("model", "objective"):
    saved_section, current_section = saved.get(section, {}), current.get(section, {})
    if section == "model":
      without = lambda d: {k: v for k, v in d.items() if k not in MEMORY_ONLY_MODEL_KEYS}
      saved_section, current_section = without(saved_section), without(current_section)
    diffs += checkpointing.differences(saved_section, current_section, f"{section}.", _absent_means)
  if diffs:
    raise checkpointing.CheckpointMismatchError(
      f"{workdir} holds a run with a different configuration; use a new --workdir or "
      "restore the settings: " + "; ".join(diffs)
    )


def write_config(config, workdir: str) -> None:
  """Saves the run's config as WORKDIR/config.json (process 0; the other
  processes may be reading it, hence aside and renamed into place)."""
  if jax.process_index() == 0:
    path = os.path.join(workdir, "config.json")
    current = checkpointing.json_config(config)
    files.write_file_atomically(path, json.dumps(current, indent=2, sort_keys=True))


# Params a run may add on top of the run it starts from, when that run lacks
# them: LoRA adapters, and the Lorentz scalars of a Euclidean CLIP being
# lifted onto the hyperboloid (configs/adapt_clip.py). They keep their init.
NEW_ON_TOP = ("log_curv", "log_alpha_img", "log_alpha_txt")


def _may_be_new(path: tuple) -> bool:
  parts = [str(part) for part in path]
  return parts[-1] in NEW_ON_TOP or any(part.startswith("lora_") for part in parts)


def init_params_from(params: dict, workdir: str, fresh: tuple[str, ...] = ()) -> dict:
  """Copies `workdir`'s params into `params`; top-level names in `fresh`
  (params an objective adds on top of the run it fine-tunes) keep their init,
  as do LoRA adapters and Lorentz scalars that `workdir`'s run lacks."""
  _, _, loaded, _ = loading.restore_run_params(workdir)
  kept = {name: params[name] for name in fresh if name in params}
  params = {k: v for k, v in params.items() if k not in kept}
  mismatched = []

  name = lambda path: "/".join(map(str, path))
  flat_mine = traversals.flatten_mapping(params)
  flat_theirs = traversals.flatten_mapping(loaded)
  absent = [path for path in flat_mine if path not in flat_theirs]
  added = [path for path in absent if _may_be_new(path)]
  missing = sorted(name(path) for path in absent if not _may_be_new(path))
  if missing:
    raise checkpointing.CheckpointMismatchError(f"init_from={workdir} lacks params: {missing[:10]}")
  if added and jax.process_index() == 0:
    names = sorted({str(path[-2]) if "lora_" in name(path) else name(path) for path in added})
    print(
      f"init_from={workdir}: {len(added)} params it lacks keep their init ({', '.join(names[:8])}"
      + (", ..." if len(names) > 8 else "")
      + ")",
      flush=True,
    )
  out = {}
  for path, mine in flat_mine.items():
    if path not in flat_theirs:
      out[path] = mine
      continue
    theirs = flat_theirs[path]
    if mine.shape != theirs.shape:
      mismatched.append(f"{name(path)}: {theirs.shape} in {workdir} vs {mine.shape}")
    out[path] = jnp.asarray(theirs, mine.dtype)
  if mismatched:
    raise checkpointing.CheckpointMismatchError(
      "init_from shapes differ:\n  " + "\n  ".join(mismatched)
    )
  return {**traversals.unflatten_mapping(out), **kept}


def prepare(config, workdir: str, start_step: int, unreadable: dict[int, str], mesh) -> None:
  """A validated run's writes to its workdir, by process 0: the unreadable
  checkpoint steps moved aside, incomplete saves removed, config.json,
  metrics.jsonl cut back to the start step; then this start's provenance."""
  if jax.process_index() == 0:
    checkpoint_dir = os.path.join(workdir, "checkpoints")
    for step, reason in unreadable.items():
      moved = checkpointing.move_aside(workdir, step)
      print(
        f"warning: checkpoint step {step} in {checkpoint_dir} is unreadable ({reason}); "
        f"moved it to {moved} and resuming from step {start_step}",
        file=sys.stderr,
        flush=True,
      )
    removed = checkpointing.remove_temporary_folders(checkpoint_dir)
    if removed:
      print(
        f"Removed {len(removed)} incomplete checkpoint save(s) from {checkpoint_dir}: "
        + ", ".join(removed),
        flush=True,
      )
    write_config(config, workdir)
    dropped = metrics_io.drop_steps_after(workdir, start_step)
    if dropped:
      logging.info("metrics.jsonl: dropped %d lines after step %d", dropped, start_step)
  checkpointing.record_provenance(workdir, start_step, mesh)
