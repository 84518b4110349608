"""Loading another run (or this run, for inference): its params, running
statistics, aux or teacher, with the model its saved config builds. The
one part of runs/ that builds models."""

from __future__ import annotations

import os
import sys

import jax
import ml_collections
import numpy as np
import orbax.checkpoint as ocp
from flax import nnx

from hyperbolic_vl import files
from hyperbolic_vl.data import tokenizer as tokenizer_lib
from hyperbolic_vl.models import registry as models_registry
from hyperbolic_vl.objectives import base as objectives_base
from hyperbolic_vl.runs import abandoned_operations
from hyperbolic_vl.runs.checkpointing import (
  Checkpointer,
  CheckpointMismatchError,
  NoReadableCheckpointError,
  first_line,
  load_config_file,
  load_run_config,
  saved_steps,
)


def _leaf_restore_args() -> ocp.RestoreArgs:
  """How every restored leaf of another run's state is placed.

  One process: a jax.Array on its first device. Several processes
  (`--multihost`): a host numpy array, the whole value, on every process.
  Every process must end with the whole value and the same one: the caller
  treats it like freshly initialised params, which the trainer then places
  with `jax.device_put(state, NamedSharding(mesh, P()))`. Neither device
  form works there: on a device of process 0 (`jax.devices()[0]`), the other
  processes hold no shard and Orbax cannot even build the array ("If the
  Array has no addressable shards, `dtype` must be provided ..."); on each
  process's own first device, the arrays are committed there, and device_put
  takes moving them onto the global mesh for a cross-host transfer, which
  JAX refuses without its cross-host transfer flags (seen on CPU). Host
  arrays are what device_put takes from every process alike (checking that
  the processes agree), and Orbax reads the whole array on each process for
  them, as it does for one process.
  """
  if jax.process_count() == 1:
    return ocp.ArrayRestoreArgs(sharding=jax.sharding.SingleDeviceSharding(jax.devices()[0]))
  return ocp.RestoreArgs(restore_type=np.ndarray)


def _restore_part(workdir: str, run_config, part: str, template, step: int | None):
  """One top-level entry (`params`, `aux`) of the run's train state, restored
  from its latest (or given) checkpoint as `_leaf_restore_args` places it;
  `template` gives its shapes (a partial restore: the entries it leaves out
  are never read). Every process of a run must call it together.

  Without `step`, a newest step whose files cannot be read (a truncated or
  garbled save) is passed over for the newest readable one, with a warning
  naming both, as training's resume does; none readable is one line."""
  if step is not None:
    return _restore_part_of_step(workdir, run_config, part, template, step)
  directory = os.path.join(os.path.abspath(workdir), "checkpoints")
  steps = saved_steps(directory)
  if not steps:
    raise FileNotFoundError(f"no checkpoint in {directory}")
  unreadable = {}
  for candidate in reversed(steps):
    try:
      restored = _restore_part_of_step(workdir, run_config, part, template, candidate)
    except CheckpointMismatchError as error:
      # TensorStore reports a truncated or garbled file as a ValueError,
      # which the step's restore words as a mismatch: that is unreadable.
      cause = error.__cause__
      damaged = ("OUT_OF_RANGE", "DATA_LOSS", "Error reading", "Error opening")
      if cause is None or not any(word in str(cause) for word in damaged):
        raise
      unreadable[candidate] = first_line(cause)
      continue
    except Exception as error:  # noqa: BLE001 (any failure to read means unreadable)
      unreadable[candidate] = first_line(error)
      continue
    if unreadable:
      print(
        f"warning: checkpoint step(s) {sorted(unreadable)} in {directory} are unreadable "
        f"({'; '.join(unreadable.values())}); using step {candidate}, the newest readable "
        "one (--step chooses another)",
        file=sys.stderr,
        flush=True,
      )
    return restored
  raise NoReadableCheckpointError(
    f"no checkpoint in {directory} can be read ("
    + "; ".join(f"step {s}: {e}" for s, e in unreadable.items())
    + ")"
  )


def _restore_part_of_step(workdir: str, run_config, part: str, template, step: int):
  checkpointer = Checkpointer(workdir, keep=run_config.get("keep_ckpts", 3))
  try:
    step = checkpointer.latest_step() if step is None else step
    if step is None:
      raise FileNotFoundError(f"no checkpoint in {checkpointer.directory}")
    item = {part: template}
    leaf_args = _leaf_restore_args()
    try:
      with abandoned_operations.settled():
        restored = checkpointer.manager.restore(
          step,
          args=ocp.args.Composite(
            state=ocp.args.PyTreeRestore(
              item=item,
              restore_args=jax.tree.map(lambda _: leaf_args, item),
              partial_restore=True,
            )
          ),
        )
    except (ValueError, KeyError, TypeError) as error:
      raise CheckpointMismatchError(
        f"checkpoint {checkpointer.directory}/{step} lacks {part} entries "
        f"{sorted(template)}: {error}"
      ) from error
  finally:
    checkpointer.close()
  # Orbax's partial restore hands back the template itself for an entry the
  # checkpoint does not hold; that must fail here, not as a shape-only value later.
  missing = [
    jax.tree_util.keystr(path)
    for path, leaf in jax.tree_util.tree_flatten_with_path(restored["state"][part])[0]
    if isinstance(leaf, jax.ShapeDtypeStruct)
  ]
  if missing:
    raise CheckpointMismatchError(
      f"checkpoint {checkpointer.directory}/{step} lacks {part} entries {missing}"
    )
  return restored["state"][part]


def restore_run_params(workdir: str, step: int | None = None, *, dtype: str | None = None):
  """(run config, ModelDef, params, tokenizer) of the run in `workdir`.

  Rebuilds that run's model from its own config.json (so its architecture
  may differ from the caller's) and restores only the params from its
  latest (or given) checkpoint: onto one device, or with several processes
  as host arrays on each (`_leaf_restore_args`). `dtype` replaces the run's
  `model.dtype` (the towers' compute dtype; params are stored in float32
  either way) in the model built, not in the config returned.
  """
  workdir = os.path.abspath(workdir)
  run_config = load_run_config(workdir)
  tokenizer = tokenizer_lib.get_tokenizer(run_config.input.tokenizer)
  build_config = run_config
  if dtype is not None and "dtype" in run_config.model:
    build_config = ml_collections.ConfigDict(run_config.to_dict())
    build_config.model.dtype = dtype
  model_def, abstract = _model_def_to_restore(build_config, tokenizer, run_config.seed)
  params = _restore_part(workdir, run_config, "params", abstract, step)
  return run_config, model_def, params, tokenizer


# The abstract builds of the models restored in this process, by config:
# tracing a model's init costs about a second even abstractly, and a process
# often restores one architecture again (evaluations of one run, a notebook
# loading twice, a teacher and a student's init_from). Nothing in a ModelDef
# is changed by its users (merge copies the templates).
_RESTORE_BUILDS: dict[tuple, tuple] = {}
_MAX_RESTORE_BUILDS = 16


def _model_def_to_restore(build_config, tokenizer, seed: int):
  key = (
    build_config.to_json_best_effort(sort_keys=True),
    int(tokenizer.vocab_size),
    int(tokenizer.context_length),
    int(seed),
    jax.local_devices()[0],
  )
  if key not in _RESTORE_BUILDS:
    if len(_RESTORE_BUILDS) >= _MAX_RESTORE_BUILDS:
      del _RESTORE_BUILDS[next(iter(_RESTORE_BUILDS))]  # the oldest
    _RESTORE_BUILDS[key] = _build_model_def_to_restore(build_config, tokenizer, seed)
  return _RESTORE_BUILDS[key]


def _build_model_def_to_restore(build_config, tokenizer, seed: int):
  """(ModelDef, param template) of the run's model, its params never computed.

  The params are about to be replaced by the checkpoint's, so only their
  shapes are built (`nnx.eval_shape`): initialising them for real would
  compile one small executable per initialiser and shape (dozens per load),
  and run them. The template's leaves are placed where a freshly initialised
  array would be (this process's first device), as before. State that is not
  a param (a ResNet's running statistics, RNG state) has its real initial
  values, computed by one jitted build whose param work XLA drops as unused.
  """

  def build():
    return models_registry.build_for_run(
      build_config,
      vocab_size=tokenizer.vocab_size,
      context_length=tokenizer.context_length,
      seed=seed,
    )

  module = nnx.eval_shape(build)
  graphdef, param_state, stat_state, rest = nnx.split(module, nnx.Param, nnx.BatchStat, ...)
  if jax.tree.leaves(stat_state) or jax.tree.leaves(rest):

    def non_params():
      _, _, stats, others = nnx.split(build(), nnx.Param, nnx.BatchStat, ...)
      return nnx.to_pure_dict(stats), nnx.to_pure_dict(others)

    stat_values, rest_values = jax.jit(non_params)()
    nnx.replace_by_pure_dict(stat_state, stat_values)
    nnx.replace_by_pure_dict(rest, rest_values)
    module = nnx.merge(graphdef, param_state, stat_state, rest)
  model_def, params = models_registry.ModelDef.from_module(module)
  device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
  template = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device), params)
  return model_def, template


def restore_run_batch_stats(workdir: str, template: dict, step: int | None = None) -> dict:
  """The running statistics (`state["batch_stats"]`) of the run in `workdir`,
  shaped as `template` (a model's `ModelDef.initial_batch_stats()`), from its
  latest (or given) checkpoint; {} for a model without batch norms, whose
  checkpoints have no such entry."""
  if not jax.tree.leaves(template):
    return {}
  workdir = os.path.abspath(workdir)
  abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, template)
  return _restore_part(workdir, load_run_config(workdir), "batch_stats", abstract, step)


# The teacher run's config.json, kept in the student's workdir.
TEACHER_CONFIG = "teacher_config.json"


def restore_teacher(
  teacher_workdir: str, *, run_workdir: str | None, resuming: bool
) -> objectives_base.Teacher:
  """The frozen model of another run (HMID-Net's teacher).

  A first start restores the params from `teacher_workdir` and keeps that
  run's config.json in the run's own workdir; a resumed run rebuilds the
  teacher from the kept config with placeholder params (the run's own
  checkpoint holds the real ones in its aux), so the teacher's workdir may
  be gone by then.
  """
  kept = os.path.join(run_workdir, TEACHER_CONFIG) if run_workdir else None
  if resuming and kept and os.path.exists(kept):
    run_config = load_config_file(kept)
    tokenizer = tokenizer_lib.get_tokenizer(run_config.input.tokenizer)
    model_def, params = models_registry.build_model_def(run_config, tokenizer, run_config.seed)
    return objectives_base.Teacher(model_def, params, run_config)
  run_config, model_def, params, _ = restore_run_params(teacher_workdir)
  if kept and jax.process_index() == 0:
    with open(os.path.join(os.path.abspath(teacher_workdir), "config.json")) as f:
      files.write_file_atomically(kept, f.read())
  return objectives_base.Teacher(model_def, params, run_config)


def restore_run_aux(workdir: str, template: dict, step: int | None = None) -> dict:
  """The entries of `template` (name -> ShapeDtypeStruct) from the non-trainable
  state (aux) of the run's latest (or given) checkpoint, placed as
  `_leaf_restore_args` says: what inference needs beyond the params
  (Radial Embeddings' stored root)."""
  workdir = os.path.abspath(workdir)
  return _restore_part(workdir, load_run_config(workdir), "aux", template, step)
