"""The training step: which params train, the sharded loss, micro-batches and
the optimizer update, compiled the same way by the loop (`loop.py`), the
throughput tool and the benchmarks.

    loss(params) = shard_map(objective.loss, data axis)   (pmean over devices)
    grads        = jax.grad(loss)                          (through shard_map)

so the gradient is that of the global-batch loss: all_gather's transpose
brings every column's gradient back to the device that produced it. With
`mesh.fsdp > 1` the params and optimizer state are sharded over an `fsdp`
mesh axis and gathered inside the shard_map (`sharding.py`).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
import optax
from jax.sharding import PartitionSpec as P

from hyperbolic_vl.models import compile_target, lora, micro_batches
from hyperbolic_vl.objectives import base as objectives_base
from hyperbolic_vl.training import optimizer, sharding

DATA_AXIS = sharding.DATA_AXIS


@dataclasses.dataclass(frozen=True)
class StepSettings:
  """What a run's step is compiled with, derived once from its config
  (`step_builder.derive_step_settings`): the mesh, the step key's seed, the trainable
  mask (None: every param trains), micro-batches per device and the size
  under which `fsdp` leaves arrays whole."""

  mesh: jax.sharding.Mesh
  seed: int
  trainable: dict | None = None
  accumulation_steps: int = 1
  fsdp_min_elements: int = sharding.MeshSettings.fsdp_min_elements


def trainable_mask(params: dict, trainable: Callable[[tuple[str, ...]], bool]) -> dict:
  return jax.tree_util.tree_map_with_path(
    lambda path, _: trainable(tuple(optimizer.path_str(path).split("/"))), params
  )


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


def make_sharded_loss(
  model_def,
  objective,
  mesh,
  context=objectives_base.EMPTY_CONTEXT,
  *,
  trainable: dict | None = None,
  accumulation_steps=1,
  fsdp_min_elements: int = sharding.MeshSettings.fsdp_min_elements,
) -> Callable:
  """(params, aux, batch, rng) -> (loss, (metrics, new_aux)), global-batch mean.

  With batch statistics (a model with batch norms): (params, aux, batch, rng,
  batch_stats) -> (loss, (metrics, new_aux, new_batch_stats)); the model's
  batch norms normalise with the global batch's statistics (averaged over
  the data axis, so 1 device equals N) and update the running ones.

  `trainable`: a bool tree like params (`trainable_mask`); the others enter
  the forward as constants (`without_gradient`). None: every param trains.

  `accumulation_steps` K > 1: the towers run over each device's rows in K
  micro-batches (models/micro_batches.py); the loss and its gradient stay
  those of the whole batch, with one micro-batch's tower activations alive
  at a time (`step_builder.checked_accumulation_steps` says which K a run may use).

  Params enter as `sharding.step_param_specs` says: on a mesh with an
  `fsdp` axis sharded (`fsdp_min_elements`) and gathered inside, the
  objective's axis name then being ("data", "fsdp"); on one device split
  over its `data` axis, so no all-reduce copies their gradient.
  """
  # (Test doubles of ModelDef that stand in for a model carry no module.)
  module = getattr(model_def, "module", None)
  lora_dropout = module is not None and lora.has_dropout(module)
  axes = sharding.device_axes(mesh)

  def local_loss(params, aux, batch, rng, *batch_stats, specs):
    # Locked params become constants before they are gathered, so neither
    # their gradient nor its reduce-scatter is computed.
    params = sharding.gather_params(without_gradient(params, trainable), specs)
    batch_stats = batch_stats[0] if batch_stats else None
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
    # What comes from gathered or split params is the same on every device
    # but typed as varying over the mesh, which out_specs P() refuses.
    new_aux = sharding.replicated_value(new_aux, mesh)
    if batch_stats is None:
      return pmean(loss), (jax.tree.map(pmean, metrics), new_aux)
    # Synchronised batch norms leave the same statistics on every device.
    new_batch_stats = sharding.replicated_value(model_def.batch_stats_of(model), mesh)
    return pmean(loss), (jax.tree.map(pmean, metrics), new_aux, new_batch_stats)

  def sharded_loss(params, aux, batch, rng, *batch_stats):
    specs = sharding.step_param_specs(params, mesh, fsdp_min_elements)
    fn = jax.shard_map(
      functools.partial(local_loss, specs=specs),
      mesh=mesh,
      in_specs=(specs, P(), P(axes), P()) + (P(),) * len(batch_stats),
      out_specs=(P(), (P(), P(), P()) if batch_stats else (P(), P())),
    )
    return fn(params, aux, batch, rng, *batch_stats)

  return sharded_loss


def skips_non_finite_updates_by_cond() -> bool:
  """How the train step keeps a non-finite step's state: on a CPU the update
  runs under `lax.cond`; elsewhere it is computed and then the old values
  selected, as the GPU figures were measured (XLA:GPU may copy a
  conditional's predicate to the host, a sync per step; not measured). On a
  CPU the select kept every old moment alive beside its update,
  and XLA:CPU, which recomputes the moments inside the parameter update,
  copied each one first: 5 to 12% of a ViT-S step. Same state either way
  (tests/train/test_train.py runs both)."""
  return compile_target.platform() == "cpu"


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
    # NaN guard without a host sync: a non-finite step leaves the state as it
    # was and records its step; the host checks at log/checkpoint time and
    # stops before anything non-finite is saved.
    finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)

    def apply_update(grads, opt_state, params):
      updates, new_opt_state = tx.update(grads, opt_state, params)
      new_params = optax.apply_updates(params, updates)
      return objective.project_params(new_params, model_def.module), new_opt_state

    def skip_update(grads, opt_state, params):
      del grads
      return params, opt_state

    keep = lambda new, old: jax.tree.map(lambda n, o: jnp.where(finite, n, o), new, old)
    operands = (grads, state["opt_state"], state["params"])
    # The scope names the optimizer's kernels in profiles (benchmarks/profile_split.py).
    with jax.named_scope("optimizer"):
      if skips_non_finite_updates_by_cond():
        new_params, new_opt_state = jax.lax.cond(finite, apply_update, skip_update, *operands)
      else:
        new_params, new_opt_state = keep(apply_update(*operands), skip_update(*operands))
    first_bad = jnp.where(
      (~finite) & (state["first_nonfinite_step"] < 0), step, state["first_nonfinite_step"]
    )
    new_state = {
      "step": step + 1,
      "params": new_params,
      "opt_state": new_opt_state,
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
  model_def, objective, tx, schedule, settings: StepSettings, context=None
) -> Callable:
  """The (unjitted) train step of a run: its locks and LoRA, micro-batches
  and sharded params as `settings` says, so the trainer and the benchmarks
  compile the same step."""
  return make_train_step(
    model_def,
    objective,
    tx,
    schedule,
    settings.mesh,
    jax.random.key(settings.seed),
    objectives_base.EMPTY_CONTEXT if context is None else context,
    settings.trainable,
    accumulation_steps=settings.accumulation_steps,
    fsdp_min_elements=settings.fsdp_min_elements,
  )
