"""A run's set-up: the model and its step-0 state, and `validate`, which
builds everything that can refuse a run before anything is written and
returns one frozen `Run` whose settings (trainable mask, micro-batches,
mesh, fsdp threshold) are derived here once."""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import orbax.checkpoint as ocp

from hyperbolic_vl import errors
from hyperbolic_vl import objectives as objectives_lib
from hyperbolic_vl.data import registry as data_registry
from hyperbolic_vl.data import tokenizer as tokenizer_lib
from hyperbolic_vl.evaluators import registry
from hyperbolic_vl.models import locking
from hyperbolic_vl.models import registry as models_registry
from hyperbolic_vl.runs import checkpointing, loading, run_dir
from hyperbolic_vl.training import (
  optimizer,
  preemption,
  preflight,
  run_context,
  sharding,
  step,
  step_builder,
)


def check_model_config(config, objective) -> None:
  """`config.model` against the objective, as one ConfigError line: an
  objective's check is about the config alone, so any ValueError it raises
  is the user's to fix (the model's own ranges are checked as it is built)."""
  try:
    objective.check_model_config(config.model)
  except errors.UserError:
    raise
  except ValueError as error:
    raise errors.ConfigError(str(error)) from error


def build_model(config, objective, tokenizer, seed: int):
  """(ModelDef, fresh params) of `config.model`, checked against the objective."""
  check_model_config(config, objective)
  return models_registry.build_model_def(config, tokenizer, seed)


def eval_model_def(config, model_def, tokenizer):
  """The model evaluators embed with: the run's towers in `config.eval_dtype`
  (float32 unless set; MERU's evaluation runs in float32, and bf16 towers
  move released models' embeddings by 1-2%). Built abstractly: the params
  are the run's own, in float32 whatever the towers compute in."""
  dtype = config.get("eval_dtype") or "float32"
  if "dtype" not in config.model or config.model.dtype in (dtype, "float64"):
    return model_def
  eval_config = ml_collections.ConfigDict(config.to_dict())
  eval_config.model.dtype = dtype
  abstract = models_registry.abstract_model(
    eval_config, vocab_size=tokenizer.vocab_size, context_length=tokenizer.context_length
  )
  return models_registry.ModelDef.from_module(abstract)[0]


def param_count(tree) -> int:
  return int(sum(math.prod(x.shape) for x in jax.tree.leaves(tree)))


@functools.lru_cache(maxsize=8)
def _abstract_params(model_json: str, image_size: int, vocab_size: int, context_length: int):
  """The param template (ShapeDtypeStructs) of a model config, traced once
  per process: building it abstractly takes a few seconds at paper sizes and
  a test session starts many runs of the same tiny model."""
  config = ml_collections.ConfigDict(
    {"model": json.loads(model_json), "input": {"image_size": image_size}}
  )
  module = models_registry.abstract_model(config, vocab_size, context_length)
  return models_registry.ModelDef.from_module(module)[1]


def state_bytes_per_device(config, objective, tokenizer, fsdp: int) -> int:
  """What a device holds of the params, their optimizer state and their
  gradients, from abstract shapes (nothing allocated): the part of a step's
  memory that no lever on the batch shrinks; fsdp splits it."""
  # The objective names a bad model key (a misspelt geometry) in one line
  # before anything is built, as `build_model` does.
  check_model_config(config, objective)
  params = _abstract_params(
    json.dumps(config.model.to_dict(), sort_keys=True, default=str),
    int(config.input.image_size),
    tokenizer.vocab_size,
    tokenizer.context_length,
  )
  trainable = trainable_predicate(config, objective, params)
  tx, _ = optimizer.make_optimizer(config.optim, config.total_steps, params, trainable)
  optimizer_state = jax.eval_shape(tx.init, params)
  nbytes = lambda tree: sum(leaf.size * leaf.dtype.itemsize for leaf in jax.tree.leaves(tree))
  trained = jax.tree.leaves(step.trainable_mask(params, trainable))
  gradients = nbytes(
    [leaf for leaf, trains in zip(jax.tree.leaves(params), trained, strict=True) if trains]
  )
  return (nbytes(params) + nbytes(optimizer_state) + gradients) // max(fsdp, 1)


def trainable_predicate(config, objective, params: dict) -> Callable[[tuple[str, ...]], bool]:
  """Which params the optimizer updates: the objective's choice (Radial trains
  the text tower only) less the model's locked towers and LoRA base weights."""
  locks = locking.Locks.from_model_config(config.model, params)
  return lambda path: objective.trainable(path) and not locks.locked(path)


def run_trainable_mask(params: dict, trainable: Callable[[tuple[str, ...]], bool]) -> dict | None:
  """The step's `trainable` tree; None when every param trains (the step is
  then exactly what it was before locking existed)."""
  mask = step.trainable_mask(params, trainable)
  return None if all(jax.tree.leaves(mask)) else mask


def parameter_summary(params: dict, trainable: dict | None) -> str:
  """ "Parameters: 1,234 (trainable 56, 4.54%)": what the optimizer updates."""
  total = param_count(params)
  if trainable is None:
    return f"Parameters: {total:,} (all trainable)"
  leaves = jax.tree.leaves(jax.tree.map(lambda p, t: p if t else None, params, trainable))
  count = param_count(leaves)
  return f"Parameters: {total:,} (trainable {count:,}, {100 * count / max(total, 1):.2f}%)"


class InitialState(NamedTuple):
  model_def: models_registry.ModelDef
  state: dict  # {step, params, opt_state, aux, first_nonfinite_step[, batch_stats]}
  tx: Any
  schedule: Any
  context: Any  # the objective's RunContext
  trainable: dict | None  # the step's trainable mask (`run_trainable_mask`)


def keep_fresh_paths(loaded: dict, fresh: dict, paths: tuple[str, ...]) -> dict:
  """`loaded` with the subtrees at the "/"-joined `paths` taken from `fresh`
  (`init_from_fresh` entries below the top level: HAC re-initialises the
  towers' final LayerNorms, "image_tower/norm")."""
  if not paths:
    return loaded
  from flax.nnx import traversals

  flat_loaded = traversals.flatten_mapping(loaded)
  flat_fresh = traversals.flatten_mapping(fresh)
  for path in paths:
    chosen = [
      k
      for k in flat_fresh
      if "/".join(map(str, k)) == path or "/".join(map(str, k)).startswith(path + "/")
    ]
    if not chosen:
      raise errors.ConfigError(f"init_from_fresh names {path!r}, which the model does not have")
    flat_loaded.update({k: flat_fresh[k] for k in chosen})
  return traversals.unflatten_mapping(flat_loaded)


def init_state(
  config,
  objective,
  tokenizer,
  tx_factory=optimizer.make_optimizer,
  *,
  resuming=False,
  workdir=None,
  context=None,
) -> InitialState:
  """The step-0 state of a run. `resuming`: the workdir's own checkpoint
  will replace the params and aux, so neither `init_from` nor a teacher's
  workdir is read (those workdirs may be gone). `context`: the objective's
  RunContext built already (tools/aot builds it outside its abstract trace,
  where a teacher's concrete weights cannot be made)."""
  model_def, params = build_model(config, objective, tokenizer, config.seed)
  if "init_from" in config and config.init_from is None and not resuming:
    # A recipe that only makes sense from another run (configs/adapt_clip.py).
    raise errors.ConfigError(
      "config.init_from is required by this config: give the workdir of the run to start "
      "from (--config.init_from=DIR)"
    )
  if config.get("init_from") and not resuming:
    fresh = (*objective.fresh_params(), *config.get("init_from_fresh", ()))
    top = tuple(name for name in fresh if "/" not in name)
    loaded = run_dir.init_params_from(params, config.init_from, top)
    params = keep_fresh_paths(loaded, params, tuple(name for name in fresh if "/" in name))
  trainable = trainable_predicate(config, objective, params)
  tx, schedule = tx_factory(config.optim, config.total_steps, params, trainable)
  if context is None:
    context = run_context.build(
      config, objective, tokenizer, model_def.module, workdir=workdir, resuming=resuming
    )
  aux = objective.init_aux(model_def.module, params, jax.random.key(config.seed + 1), context)
  state = {
    "step": jnp.asarray(0, jnp.int32),
    "params": params,
    # One compile, not a zeros_like per parameter shape (op by op).
    "opt_state": jax.jit(tx.init)(params),
    "aux": aux,
    "first_nonfinite_step": jnp.asarray(-1, jnp.int32),
  }
  if model_def.has_batch_stats:
    # Only models with batch norms have this entry: every other state (and
    # checkpoint) keeps the layout it always had.
    state["batch_stats"] = model_def.initial_batch_stats()
    if config.get("init_from") and not resuming:
      state["batch_stats"] = loading.restore_run_batch_stats(config.init_from, state["batch_stats"])
  return InitialState(
    model_def, state, tx, schedule, context, run_trainable_mask(params, trainable)
  )


@dataclasses.dataclass(frozen=True)
class Run:
  """What `validate` built: everything the loop needs, nothing written yet."""

  config: ml_collections.ConfigDict
  objective: Any
  tokenizer: Any
  train_iter: Any
  model_def: models_registry.ModelDef
  state: dict  # step 0's, or the resumable checkpoint's (placed on the mesh)
  start_step: int  # 0, or the step of the checkpoint a resume starts from
  tx: Any
  schedule: Any
  context: Any
  evaluators: list
  resumable: checkpointing.Resumable | None
  train_step: step_builder.TrainStep  # jitted, not yet compiled

  @property
  def step_settings(self) -> step.StepSettings:
    return self.train_step.settings

  @property
  def mesh(self) -> jax.sharding.Mesh:
    return self.train_step.mesh


def validate(config, workdir: str) -> Run:
  """Everything that can refuse the run, before anything is written to the
  workdir: the saved config, the objective, the data, the model and its
  state, the evaluators, and, on a resume, the checkpoint itself (its saved
  shapes against this config's state, then a full read). So a refused first
  start leaves no config.json behind and a refused resume leaves the
  workdir as it was."""
  run_dir.check_config_matches_workdir(config, workdir)
  objective = objectives_lib.get(config.objective)
  tokenizer = tokenizer_lib.get_tokenizer(config.input.tokenizer)
  # Reads every input key and range first, so a negative batch size is
  # named as such before the device count is checked against it.
  source, _, data_settings = data_registry.read_config(config.input)
  objective.check_input_config(config.input)
  mesh = step_builder.run_mesh(config)
  num_devices = mesh.devices.size
  # Before the iterator builds a batch: inputs a machine cannot hold (box
  # slots by the thousand) would have the kernel end the process unheard.
  preflight.refuse_inputs_that_cannot_fit(
    config,
    source,
    data_settings,
    context_length=tokenizer.context_length,
    num_devices=num_devices,
  )
  train_iter = data_registry.make_train_iterator(config.input, tokenizer, seed=config.seed)

  # Before the state is built: a machine that cannot hold the params and
  # their optimizer state would otherwise be ended by the kernel's OOM killer
  # while they are initialised, with no word said.
  preflight.refuse_a_state_that_cannot_fit(
    state_bytes_per_device(config, objective, tokenizer, sharding.mesh_settings(config).fsdp)
  )
  preemption.processes_meet("hyperbolic_vl_train_start")
  checkpoint_dir = os.path.join(workdir, "checkpoints")
  resuming = bool(checkpointing.saved_steps(checkpoint_dir))
  # A first start keeps the teacher's config in the workdir as it builds the
  # teacher (loading.restore_teacher); a refused start takes it back.
  kept_teacher = os.path.join(workdir, loading.TEACHER_CONFIG)
  had_kept_teacher = os.path.exists(kept_teacher)
  try:
    initial = init_state(config, objective, tokenizer, resuming=resuming, workdir=workdir)
    train_step = step_builder.build_train_step(config, objective, initial, mesh)
    state = train_step.place(initial.state)
    # Built before step 1 so that an evaluator that cannot run on this data
    # or model geometry says so at start-up, not after hours of training.
    # Files evaluators write (plots) go under the workdir, from one process.
    evaluators = registry.build_all(
      config, tokenizer, workdir=workdir if jax.process_index() == 0 else None
    )
    resumable = None
    if resuming:
      # With the state's shardings: Orbax reads each array into this run's
      # layout, whatever mesh.fsdp the checkpoint was written with.
      abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, state)
      resumable = checkpointing.find_resumable(checkpoint_dir, abstract)
      train_iter.set_state(resumable.data_state)
      state = train_step.place(resumable.state)
  except BaseException:
    if not had_kept_teacher and jax.process_index() == 0 and os.path.exists(kept_teacher):
      os.unlink(kept_teacher)
    raise
  return Run(
    config=config,
    objective=objective,
    tokenizer=tokenizer,
    train_iter=train_iter,
    model_def=initial.model_def,
    state=state,
    start_step=int(state["step"]) if resumable is not None else 0,
    tx=initial.tx,
    schedule=initial.schedule,
    context=initial.context,
    evaluators=evaluators,
    resumable=resumable,
    train_step=train_step,
  )
