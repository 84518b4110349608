"""Training loop: mesh, init, shard_mapped step, logging, Orbax, resume, eval.

`train_and_evaluate(config, workdir)` is the library entry point used by
`main.py`, the tests and the colabs. The step is

    loss(params) = shard_map(objective.loss, data axis)   (pmean over devices)
    grads        = jax.grad(loss)                          (through shard_map)

so the gradient is that of the global-batch loss: all_gather's transpose
brings every column's gradient back to the device that produced it. With
`config.mesh.fsdp > 1` the params and optimizer state are sharded over an
`fsdp` mesh axis and gathered inside the shard_map (`sharding.py`).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils
from jax.sharding import PartitionSpec as P

from hyperbolic_vl import (
  checkpointing,
  errors,
  geometry_health,
  metrics_io,
  optimizer,
  preemption,
  run_context,
  run_dir,
  sharding,
)
from hyperbolic_vl import objectives as objectives_lib
from hyperbolic_vl import predictor as predictor_lib
from hyperbolic_vl.data import registry as data_registry
from hyperbolic_vl.data import run_length
from hyperbolic_vl.data import tokenizer as tokenizer_lib
from hyperbolic_vl.evaluators import registry
from hyperbolic_vl.input_health import InputHealth
from hyperbolic_vl.models import locking, lora, micro_batches
from hyperbolic_vl.models import registry as models_registry
from hyperbolic_vl.objectives import base as objectives_base

DATA_AXIS = sharding.DATA_AXIS


class NonFiniteLossError(FloatingPointError):
  pass


def build_model(config, objective, tokenizer, seed: int):
  """(ModelDef, fresh params) of `config.model`, checked against the objective."""
  objective.check_model_config(config.model)
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


def trainable_predicate(config, objective, params: dict) -> Callable[[tuple[str, ...]], bool]:
  """Which params the optimizer updates: the objective's choice (Radial trains
  the text tower only) less the model's locked towers and LoRA base weights."""
  locks = locking.Locks.from_model_config(config.model, params)
  return lambda path: objective.trainable(path) and not locks.locked(path)


def trainable_mask(params: dict, trainable: Callable[[tuple[str, ...]], bool]) -> dict:
  return jax.tree_util.tree_map_with_path(
    lambda path, _: trainable(tuple(optimizer.path_str(path).split("/"))), params
  )


def run_trainable_mask(config, objective, params: dict) -> dict | None:
  """The step's `trainable` tree for a run; None when every param trains (the
  step is then exactly what it was before locking existed)."""
  mask = trainable_mask(params, trainable_predicate(config, objective, params))
  return None if all(jax.tree.leaves(mask)) else mask


def without_gradient(params: dict, mask: dict | None) -> dict:
  """`params` with the locked ones (False in `mask`) behind stop_gradient: the
  forward treats them as constants, so a locked tower keeps no activations
  for a backward pass and gets no gradient."""
  if mask is None:
    return params
  return jax.tree.map(lambda p, t: p if t else jax.lax.stop_gradient(p), params, mask)


# Folded into the step's key for LoRA's dropout masks, apart from the keys
# objectives draw from the same step key.
LORA_DROPOUT_STREAM = 0x10_7A


def parameter_summary(params: dict, trainable: dict | None) -> str:
  """ "Parameters: 1,234 (trainable 56, 4.54%)": what the optimizer updates."""
  total = param_count(params)
  if trainable is None:
    return f"Parameters: {total:,} (all trainable)"
  leaves = jax.tree.leaves(jax.tree.map(lambda p, t: p if t else None, params, trainable))
  count = param_count(leaves)
  return f"Parameters: {total:,} (trainable {count:,}, {100 * count / max(total, 1):.2f}%)"


def make_mesh(num_devices: int | None = None, fsdp: int = 1) -> jax.sharding.Mesh:
  """The run's mesh: `data` over the devices, or `data` x `fsdp` (sharding.py)."""
  return sharding.make_mesh(num_devices, fsdp)


def make_sharded_loss(
  model_def,
  objective,
  mesh,
  context=objectives_base.EMPTY_CONTEXT,
  *,
  with_batch_stats=False,
  trainable: dict | None = None,
  accumulation_steps=1,
  fsdp_min_elements: int = sharding.MeshSettings.fsdp_min_elements,
) -> Callable:
  """(params, aux, batch, rng) -> (loss, (metrics, new_aux)), global-batch mean.

  `with_batch_stats` (a model with batch norms): (params, aux, batch, rng,
  batch_stats) -> (loss, (metrics, new_aux, new_batch_stats)); the model's
  batch norms normalise with the global batch's statistics (averaged over
  the data axis, so 1 device equals N) and update the running ones.

  `trainable`: a bool tree like params (`trainable_mask`); the others enter
  the forward as constants (`without_gradient`). None: every param trains.

  `accumulation_steps` K > 1: the towers run over each device's rows in K
  micro-batches (models/micro_batches.py); the loss and its gradient stay
  those of the whole batch, with one micro-batch's tower activations alive
  at a time (`checked_accumulation_steps` says which K a run may use).

  On a mesh with an `fsdp` axis the params arrive sharded as
  `sharding.param_specs` says (`fsdp_min_elements`) and are gathered
  inside; the objective's axis name is then ("data", "fsdp").
  """
  # (Test doubles of ModelDef that stand in for a model carry no module.)
  module = getattr(model_def, "module", None)
  lora_dropout = module is not None and lora.has_dropout(module)
  axes = sharding.device_axes(mesh)
  fsdp = sharding.fsdp_size(mesh)

  def local_loss(params, aux, batch, rng, batch_stats=None, specs=None):
    # Locked params become constants before they are gathered, so neither
    # their gradient nor its reduce-scatter is computed.
    params = without_gradient(params, trainable)
    if specs is not None:
      params = sharding.gather_params(params, specs)
    if batch_stats is None:
      model = model_def.merge(params)
    else:
      model = model_def.merge_for_training(params, batch_stats, axes)
    if lora_dropout:
      # Each device draws masks for its own rows.
      key = jax.random.fold_in(
        jax.random.fold_in(rng, LORA_DROPOUT_STREAM), jax.lax.axis_index(axes)
      )
      lora.training_mode(model, key)
    if accumulation_steps > 1:
      micro_batches.set_micro_batches(model, accumulation_steps)
    loss, (metrics, new_aux) = objective.loss(
      model, aux, batch, rng=rng, axis_name=axes, context=context
    )
    pmean = lambda x: jax.lax.pmean(x, axes)
    if specs is not None:
      # Computed from the gathered params: the same on every device, but
      # typed as varying over the mesh, which out_specs P() refuses.
      new_aux = sharding.replicated_value(new_aux, mesh)
    if batch_stats is None:
      return pmean(loss), (jax.tree.map(pmean, metrics), new_aux)
    # Synchronised batch norms leave the same statistics on every device.
    new_batch_stats = model_def.batch_stats_of(model)
    if specs is not None:
      new_batch_stats = sharding.replicated_value(new_batch_stats, mesh)
    return pmean(loss), (jax.tree.map(pmean, metrics), new_aux, new_batch_stats)

  if fsdp > 1:

    def fsdp_loss(params, aux, batch, rng, *batch_stats):
      specs = sharding.param_specs(params, fsdp, fsdp_min_elements)
      fn = jax.shard_map(
        lambda p, a, b, r, *s: local_loss(p, a, b, r, *s, specs=specs),
        mesh=mesh,
        in_specs=(specs, P(), P(axes), P()) + (P(),) * len(batch_stats),
        out_specs=(P(), (P(), P(), P()) if batch_stats else (P(), P())),
      )
      return fn(params, aux, batch, rng, *batch_stats)

    return fsdp_loss
  if with_batch_stats:
    return jax.shard_map(
      local_loss,
      mesh=mesh,
      in_specs=(P(), P(), P(DATA_AXIS), P(), P()),
      out_specs=(P(), (P(), P(), P())),
    )
  return jax.shard_map(
    local_loss, mesh=mesh, in_specs=(P(), P(), P(DATA_AXIS), P()), out_specs=(P(), (P(), P()))
  )


def checked_accumulation_steps(config, model_def, num_devices: int) -> int:
  """`optim.accumulation_steps` (default 1), or a one-line ConfigError when
  this run cannot split its towers' rows into that many micro-batches."""
  steps = config.optim.get("accumulation_steps", 1)
  key = "optim.accumulation_steps"
  if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
    raise errors.ConfigError(f"{key} must be an integer >= 1, got {steps!r}")
  if steps == 1:
    return 1
  per_device = int(config.input.batch_size) // num_devices
  if per_device % steps:
    raise errors.ConfigError(
      f"{key}={steps} must divide the per-device batch {per_device} "
      f"(input.batch_size={config.input.batch_size} over {num_devices} devices)"
    )
  if model_def.has_batch_stats:
    raise errors.ConfigError(
      f"{key}={steps} needs a model without batch norms: model.image_variant="
      f"{config.model.get('image_variant')!r} has them, and each micro-batch would "
      "normalise with its own statistics"
    )
  if not micro_batches.supports(model_def.module):
    raise errors.ConfigError(
      f"{key}={steps}: model.name={models_registry.model_name(config.model)!r} does not run "
      "its towers in micro-batches (models/micro_batches.py)"
    )
  return steps


def make_train_step(
  model_def,
  objective,
  tx,
  schedule,
  mesh,
  base_rng,
  context=objectives_base.EMPTY_CONTEXT,
  trainable: dict | None = None,
  *,
  accumulation_steps=1,
  fsdp_min_elements: int = sharding.MeshSettings.fsdp_min_elements,
) -> Callable:
  """(state, batch) -> (new state, metrics). `trainable`: as in
  `make_sharded_loss` (`run_trainable_mask`); None trains every param. The
  parameter norm is not among the metrics: the loop computes it at log
  steps only (`param_norm`)."""
  with_batch_stats = model_def.has_batch_stats
  sharded_loss = make_sharded_loss(
    model_def,
    objective,
    mesh,
    context,
    with_batch_stats=with_batch_stats,
    trainable=trainable,
    accumulation_steps=accumulation_steps,
    fsdp_min_elements=fsdp_min_elements,
  )
  grad_fn = jax.value_and_grad(sharded_loss, has_aux=True)

  def train_step(state: dict, batch: dict) -> tuple[dict, dict]:
    step = state["step"]
    rng = jax.random.fold_in(base_rng, step)
    if with_batch_stats:
      (loss, (metrics, new_aux, new_batch_stats)), grads = grad_fn(
        state["params"], state["aux"], batch, rng, state["batch_stats"]
      )
    else:
      (loss, (metrics, new_aux)), grads = grad_fn(state["params"], state["aux"], batch, rng)
    grad_norm = optax.global_norm(grads)
    # The scope names the optimizer's kernels in profiles (benchmarks/profile_split.py).
    with jax.named_scope("optimizer"):
      updates, new_opt_state = tx.update(grads, state["opt_state"], state["params"])
      new_params = optax.apply_updates(state["params"], updates)
      new_params = objective.project_params(new_params, model_def.module)
    # NaN guard without a host sync: a non-finite step leaves the state as it
    # was and records its step; the host checks at log/checkpoint time and
    # stops before anything non-finite is saved.
    finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
    keep = lambda new, old: jax.tree.map(lambda n, o: jnp.where(finite, n, o), new, old)
    first_bad = jnp.where(
      (~finite) & (state["first_nonfinite_step"] < 0), step, state["first_nonfinite_step"]
    )
    new_state = {
      "step": step + 1,
      "params": keep(new_params, state["params"]),
      "opt_state": keep(new_opt_state, state["opt_state"]),
      "aux": keep(new_aux, state["aux"]),
      "first_nonfinite_step": first_bad,
    }
    if with_batch_stats:
      new_state["batch_stats"] = keep(new_batch_stats, state["batch_stats"])
    if sharding.fsdp_size(mesh) > 1:
      # The state leaves the step sharded as it came in (so it can be donated).
      new_state = jax.lax.with_sharding_constraint(
        new_state, sharding.state_shardings(new_state, mesh, fsdp_min_elements)
      )
    metrics = {
      **{f"train/{k}": v for k, v in metrics.items()},
      "train/loss": loss,
      "train/l2_grads": grad_norm,
      "train/learning_rate": schedule(step),
    }
    return new_state, metrics

  return train_step


# `train/l2_params`: the norm of the params a step starts from, computed by
# the loop only before the steps it logs (a read of every param per step
# otherwise).
param_norm = jax.jit(optax.global_norm)


def make_run_step(
  config, model_def, objective, tx, schedule, mesh, params: dict, context=None, *, seed=None
) -> Callable:
  """The (unjitted) train step of a run config: its locks and LoRA
  (`run_trainable_mask`), micro-batches (`optim.accumulation_steps`) and
  sharded params (`mesh.fsdp_min_elements`), so the trainer and the
  benchmarks compile the same step."""
  return make_train_step(
    model_def,
    objective,
    tx,
    schedule,
    mesh,
    jax.random.key(config.seed if seed is None else seed),
    objectives_base.EMPTY_CONTEXT if context is None else context,
    run_trainable_mask(config, objective, params),
    accumulation_steps=checked_accumulation_steps(config, model_def, mesh.devices.size),
    fsdp_min_elements=sharding.mesh_settings(config).fsdp_min_elements,
  )


def _to_global(batch: dict, sharding) -> dict:
  return jax.tree.map(
    lambda x: jax.make_array_from_process_local_data(sharding, np.asarray(x)), batch
  )


def init_state(
  config, objective, tokenizer, tx_factory=optimizer.make_optimizer, *, resuming=False, workdir=None
):
  """(ModelDef, step-0 state, tx, schedule, RunContext). `resuming`: the
  workdir's own checkpoint will replace the params and aux, so neither
  `init_from` nor a teacher's workdir is read (those workdirs may be gone)."""
  model_def, params = build_model(config, objective, tokenizer, config.seed)
  if "init_from" in config and config.init_from is None and not resuming:
    # A recipe that only makes sense from another run (configs/adapt_clip.py).
    raise errors.ConfigError(
      "config.init_from is required by this config: give the workdir of the run to start "
      "from (--config.init_from=DIR)"
    )
  if config.get("init_from") and not resuming:
    fresh = (*objective.fresh_params(), *config.get("init_from_fresh", ()))
    params = run_dir.init_params_from(params, config.init_from, fresh)
  tx, schedule = tx_factory(
    config.optim, config.total_steps, params, trainable_predicate(config, objective, params)
  )
  context = run_context.build(
    config, objective, tokenizer, model_def.module, workdir=workdir, resuming=resuming
  )
  aux = objective.init_aux(model_def.module, params, jax.random.key(config.seed + 1), context)
  state = {
    "step": jnp.asarray(0, jnp.int32),
    "params": params,
    "opt_state": tx.init(params),
    "aux": aux,
    "first_nonfinite_step": jnp.asarray(-1, jnp.int32),
  }
  if model_def.has_batch_stats:
    # Only models with batch norms have this entry: every other state (and
    # checkpoint) keeps the layout it always had.
    state["batch_stats"] = model_def.initial_batch_stats()
    if config.get("init_from") and not resuming:
      state["batch_stats"] = checkpointing.restore_run_batch_stats(
        config.init_from, state["batch_stats"]
      )
  return model_def, state, tx, schedule, context


@dataclasses.dataclass
class TrainResult:
  state: dict
  model_def: models_registry.ModelDef
  objective: Any
  tokenizer: Any
  step: int
  checkpoint_dir: str
  evaluators: list  # registry.NamedEvaluator, built before step 1
  predictor_functions: dict  # compiled embedding functions, shared by predictors

  def predictor(self) -> predictor_lib.Predictor:
    return predictor_lib.for_run_state(
      self.eval_model_def or self.model_def,
      self.objective,
      _replicated_params(self.state, self.mesh) if self.mesh is not None else self.state,
      self.tokenizer,
      self.config,
      self.predictor_functions,
    )

  config: Any = None
  preempted: bool = False  # stopped early by SIGTERM, with a checkpoint of `step`
  # The model evaluators embed with: the run's in float32 (`eval_model_def`).
  eval_model_def: Any = None
  mesh: jax.sharding.Mesh | None = None  # the run's mesh (params sharded over its fsdp axis)


def _replicated_params(state: dict, mesh) -> dict:
  """The state with its params whole on every device, as the Predictor
  takes them (every process calls it together); unchanged without fsdp."""
  return {**state, "params": sharding.gather_to_replicated(state["params"], mesh)}


@dataclasses.dataclass
class _ValidatedRun:
  """What `_validate` built: everything the loop needs, nothing written yet."""

  objective: Any
  tokenizer: Any
  mesh: jax.sharding.Mesh
  train_iter: Any
  model_def: models_registry.ModelDef
  state: dict
  tx: Any
  schedule: Any
  context: Any
  evaluators: list
  resumable: checkpointing.Resumable | None
  mesh_settings: sharding.MeshSettings


def _validate(config, workdir: str) -> _ValidatedRun:
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
  train_iter = data_registry.make_train_iterator(config.input, tokenizer, seed=config.seed)
  mesh_settings = sharding.mesh_settings(config)
  mesh = make_mesh(config.get("num_devices"), mesh_settings.fsdp)
  num_devices = mesh.devices.size
  if config.input.batch_size % num_devices:
    raise errors.ConfigError(
      f"input.batch_size={config.input.batch_size} must be divisible by the "
      f"number of devices ({num_devices})"
    )

  preemption.processes_meet("hyperbolic_vl_train_start")
  checkpoint_dir = os.path.join(workdir, "checkpoints")
  resuming = bool(checkpointing.saved_steps(checkpoint_dir))
  # A first start keeps the teacher's config in the workdir as it builds the
  # teacher (checkpointing.restore_teacher); a refused start takes it back.
  kept_teacher = os.path.join(workdir, checkpointing.TEACHER_CONFIG)
  had_kept_teacher = os.path.exists(kept_teacher)
  try:
    model_def, state, tx, schedule, context = init_state(
      config, objective, tokenizer, resuming=resuming, workdir=workdir
    )
    # Refused here, before anything is written (make_run_step reads it again).
    checked_accumulation_steps(config, model_def, num_devices)
    state = jax.device_put(
      state, sharding.state_shardings(state, mesh, mesh_settings.fsdp_min_elements)
    )
    # Built before step 1 so that an evaluator that cannot run on this data
    # says so at start-up, not after hours of training. Files evaluators
    # write (plots) go under the workdir, from one process.
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
  except BaseException:
    if not had_kept_teacher and jax.process_index() == 0 and os.path.exists(kept_teacher):
      os.unlink(kept_teacher)
    raise
  return _ValidatedRun(
    objective,
    tokenizer,
    mesh,
    train_iter,
    model_def,
    state,
    tx,
    schedule,
    context,
    evaluators,
    resumable,
    mesh_settings,
  )


def train(
  config: ml_collections.ConfigDict, workdir: str, *, stop_at_step: int | None = None
) -> TrainResult:
  """Trains to `config.total_steps`, resuming from `workdir` if it holds checkpoints.

  `stop_at_step` ends the run early at that step with a checkpoint, as a
  pre-empted or time-limited job would (the schedule still targets
  total_steps); running again in the same workdir continues from there.
  The workdir is locked for the run (`run_dir.WorkdirLock`).
  """
  with run_dir.WorkdirLock(workdir):
    return _train(config, os.path.abspath(workdir), stop_at_step)


def _train(config, workdir: str, stop_at_step: int | None) -> TrainResult:
  # A run sized in epochs (HCL's and Radial's paper variants) gets its step
  # counts from the data here, so config.json records them.
  config = run_length.resolve(config)
  run = _validate(config, workdir)
  objective, tokenizer, mesh, train_iter = run.objective, run.tokenizer, run.mesh, run.train_iter
  model_def, state, evaluators = run.model_def, run.state, run.evaluators
  min_elements = run.mesh_settings.fsdp_min_elements
  batch_sharding = sharding.batch_sharding(mesh)
  trainable = run_trainable_mask(config, objective, state["params"])
  print(parameter_summary(state["params"], trainable), flush=True)
  start_step = 0
  if run.resumable is not None:
    state = jax.device_put(
      run.resumable.state, sharding.state_shardings(run.resumable.state, mesh, min_elements)
    )
    start_step = int(state["step"])
  run_dir.prepare(
    config, workdir, start_step, run.resumable.unreadable if run.resumable else {}, run.mesh
  )
  # The other processes open the checkpoints once process 0 has tidied them.
  preemption.processes_meet("hyperbolic_vl_workdir_ready")
  checkpointer = checkpointing.Checkpointer(workdir, config.get("keep_ckpts", 3))
  if run.resumable is not None:
    logging.info("resumed from %s at step %d", checkpointer.directory, start_step)
    print(f"Resumed from checkpoint at step {start_step} in {workdir}", flush=True)

  train_step = jax.jit(
    make_run_step(
      config, model_def, objective, run.tx, run.schedule, mesh, state["params"], run.context
    ),
    donate_argnums=(0,),
  )
  writer = metrics_io.MetricsWriter(workdir)
  total_steps = int(config.total_steps)
  end_step = total_steps if stop_at_step is None else min(stop_at_step, total_steps)
  log_every = int(config.get("log_training_steps", 50))
  ckpt_every = int(config.get("ckpt_steps", 1000))
  predictor_functions = {}
  evaluation_model = eval_model_def(config, model_def, tokenizer)
  eval_steps = sorted({e.every_steps for e in evaluators if e.every_steps > 0})

  def check_finite(at_step: int) -> None:
    bad = int(state["first_nonfinite_step"])
    if bad >= 0:
      checkpointer.wait(at_step)
      last = checkpointer.latest_step()
      raise NonFiniteLossError(
        f"non-finite loss or gradient at step {bad + 1} (state step {bad}); training stopped "
        f"at step {at_step}. The state was not updated from that step on and nothing "
        f"non-finite was saved; the last good checkpoint is step {last} in "
        f"{checkpointer.directory}."
      )

  def check_saves(at_step: int) -> None:
    """Stops the run once a background save has failed: after every step on
    one process; at log steps on several, which all stop together."""
    if jax.process_count() == 1:
      checkpointer.raise_if_save_failed(at_step)
      return
    if at_step % log_every:
      return
    failure = None
    try:
      checkpointer.raise_if_save_failed(at_step)
    except checkpointing.CheckpointSaveError as error:
      failure = error
    if np.any(multihost_utils.process_allgather(np.int32(failure is not None))):
      raise failure or checkpointing.CheckpointSaveError(
        f"a checkpoint save failed on another process; training stopped at step {at_step}"
      )

  def save(step: int, force: bool = False) -> None:
    check_finite(step)
    checkpointer.save(step, state, train_iter.get_state(), force=force)

  def is_log_step(at_step: int) -> bool:
    return at_step % log_every == 0 or at_step == total_steps

  input_health = InputHealth(float(config.input.get("max_bad_fraction", 0.01)))
  # Progress, ETA and the time share of evaluation and checkpointing: clu.
  report_progress = metrics_io.progress_reporter(total_steps, log_every)
  step = start_step
  log = metrics_io.TrainLog(writer, total_steps, int(config.input.batch_size), step)
  preempted = False
  try:
    with preemption.PreemptionWatch() as watch:
      while step < end_step:
        wait_start = time.perf_counter()
        host_batch = next(train_iter)
        log.waited(time.perf_counter() - wait_start)
        input_health.update(host_batch)
        batch = _to_global(host_batch, batch_sharding)
        logged = is_log_step(step + 1)
        if logged:  # dispatched before the step that donates these params
          params_norm = param_norm(state["params"])
        state, metrics = train_step(state, batch)
        step += 1
        report_progress(step)
        check_saves(step)
        if step == 1:  # the initial parameters' metrics: a degenerate geometry shows here
          for warning in geometry_health.first_step_warnings(jax.device_get(metrics)):
            print(f"warning: {warning}", file=sys.stderr, flush=True)
        if logged:
          check_finite(step)
          metrics = {**metrics, "train/l2_params": params_norm}
          log.write(step, jax.device_get(metrics), input_health.window_metrics())
        if step % ckpt_every == 0 and step < end_step:
          with report_progress.timed("checkpoint"):
            save(step)
        if step < total_steps and any(step % every == 0 for every in eval_steps):
          predictor = predictor_lib.for_run_state(
            evaluation_model,
            objective,
            _replicated_params(state, mesh),
            tokenizer,
            config,
            predictor_functions,
          )
          with report_progress.timed("eval"):
            figures = registry.run_all(evaluators, predictor, step)
          if figures:
            writer.write(step, registry.as_logged(figures))
        if step < end_step and watch.reached(step):
          # Every process stops after the same step and saves it together.
          print(
            f"Pre-empted (SIGTERM) after step {step}: saving a checkpoint; run the same "
            "command to resume.",
            flush=True,
          )
          preempted = True
          break
  except KeyboardInterrupt:
    print(f"Interrupted at step {step}; saving a checkpoint before exiting.", flush=True)
    save(step, force=True)
    checkpointer.wait(step)
    raise
  check_finite(step)
  if checkpointer.latest_step() != step:
    save(step, force=True)
  checkpointer.wait(step)
  checkpointer.close()
  writer.close()
  return TrainResult(
    state=state,
    model_def=model_def,
    objective=objective,
    tokenizer=tokenizer,
    step=step,
    checkpoint_dir=checkpointer.directory,
    evaluators=evaluators,
    predictor_functions=predictor_functions,
    config=config,
    preempted=preempted,
    eval_model_def=evaluation_model,
    mesh=mesh,
  )


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict | None:
  """Trains (resuming if possible), evaluates on the held-out split, prints and
  logs the figures; returns them, or None when SIGTERM stopped the run early
  (with a checkpoint: the same call resumes it)."""
  run_start = time.perf_counter()
  # Held through the evaluation too: it appends to metrics.jsonl.
  with run_dir.WorkdirLock(workdir):
    return _evaluate(_train(config, os.path.abspath(workdir), None), workdir, run_start)


def _evaluate(result: TrainResult, workdir: str, run_start: float) -> dict:
  """The held-out figures of a finished run, logged and printed."""
  if result.preempted:
    return None
  results = registry.run_all(result.evaluators, result.predictor())
  if not results:
    print(f"Training finished at step {result.step}; no evaluation ran.", flush=True)
    return results
  writer = metrics_io.MetricsWriter(os.path.abspath(workdir))
  writer.write(result.step, registry.as_logged(results))
  writer.close()
  print(
    registry.format_results(
      results,
      title=f"Evaluation at step {result.step} (run took {time.perf_counter() - run_start:.0f}s)",
    ),
    flush=True,
  )
  return results
