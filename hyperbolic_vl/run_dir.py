"""A run's directory before training: the saved config a resume must match,
and params taken from another run (`config.init_from`)."""

from __future__ import annotations

import json
import os

import jax
import jax.numpy as jnp

from hyperbolic_vl import checkpointing
from hyperbolic_vl.optimizer import path_str


def check_config_matches_workdir(config, workdir: str) -> None:
  """Refuses to resume a workdir written by a different model/objective."""
  path = os.path.join(workdir, "config.json")
  current = checkpointing.json_config(config)
  if os.path.exists(path):
    with open(path) as f:
      saved = json.load(f)
    diffs = []
    for section in ("model", "objective"):
      diffs += checkpointing.differences(
        saved.get(section, {}), current.get(section, {}), f"{section}."
      )
    if diffs:
      raise checkpointing.CheckpointMismatchError(
        f"{workdir} holds a run with a different configuration; use a new --workdir or "
        "restore the settings:\n  " + "\n  ".join(diffs)
      )
  if jax.process_index() == 0:  # the other processes are reading it now
    checkpointing.write_file_atomically(path, json.dumps(current, indent=2, sort_keys=True))


def init_params_from(params: dict, workdir: str, fresh: tuple[str, ...] = ()) -> dict:
  """Copies `workdir`'s params into `params`; top-level names in `fresh`
  (params an objective adds on top of the run it fine-tunes) keep their init."""
  _, _, loaded, _ = checkpointing.restore_run_params(workdir)
  kept = {name: params[name] for name in fresh if name in params}
  params = {k: v for k, v in params.items() if k not in kept}
  mismatched = []

  def take(path, mine, theirs):
    if mine.shape != theirs.shape:
      mismatched.append(f"{path_str(path)}: {theirs.shape} in {workdir} vs {mine.shape}")
    return jnp.asarray(theirs, mine.dtype)

  missing = set(map(path_str, (p for p, _ in jax.tree_util.tree_flatten_with_path(params)[0])))
  missing -= set(map(path_str, (p for p, _ in jax.tree_util.tree_flatten_with_path(loaded)[0])))
  if missing:
    raise checkpointing.CheckpointMismatchError(
      f"init_from={workdir} lacks params: {sorted(missing)[:10]}"
    )
  loaded = {k: v for k, v in loaded.items() if k in params}
  out = jax.tree_util.tree_map_with_path(take, params, loaded)
  if mismatched:
    raise checkpointing.CheckpointMismatchError(
      "init_from shapes differ:\n  " + "\n  ".join(mismatched)
    )
  return {**out, **kept}
