"""Training loop: mesh, init, shard_mapped step, logging, Orbax, resume, eval.

`train_and_evaluate(config, workdir)` is the library entry point used by
`main.py`, the tests and the colabs. The step is

    loss(params) = shard_map(objective.loss, data axis)   (pmean over devices)
    grads        = jax.grad(loss)                          (through shard_map)

so the gradient is that of the global-batch loss: all_gather's transpose
brings every column's gradient back to the device that produced it.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import re
import signal
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import orbax.checkpoint as ocp
from flax import nnx
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from hyperbolic_vl import checkpointing, metrics_io
from hyperbolic_vl import objectives as objectives_lib
from hyperbolic_vl import predictor as predictor_lib
from hyperbolic_vl.data import tokenizer as tokenizer_lib
from hyperbolic_vl.evaluators import registry, world_eval

# Re-exported: the run-directory pieces live in checkpointing.py.
CheckpointMismatchError = checkpointing.CheckpointMismatchError
Checkpointer = checkpointing.Checkpointer
ModelDef = checkpointing.ModelDef
load_run_config = checkpointing.load_run_config

DATA_AXIS = "data"


class NonFiniteLossError(FloatingPointError):
  pass


def build_model(config, objective, tokenizer, seed: int) -> tuple[ModelDef, dict]:
  module = objective.build_model(
    config,
    vocab_size=tokenizer.vocab_size,
    context_length=tokenizer.context_length,
    rngs=nnx.Rngs(params=seed),
  )
  return ModelDef.from_module(module)


def abstract_model(
  config, objective=None, tokenizer_vocab: int | None = None, context_length: int | None = None
):
  """The model with abstract (ShapeDtypeStruct) params: no allocation."""
  objective = objective or objectives_lib.get(config.objective)
  vocab = tokenizer_vocab or config.input.tokenizer.get("vocab_size", 49408)
  ctx = context_length or config.input.tokenizer.context_length
  return nnx.eval_shape(
    lambda: objective.build_model(
      config, vocab_size=vocab, context_length=ctx, rngs=nnx.Rngs(params=0)
    )
  )


def param_count(tree) -> int:
  return int(sum(math.prod(x.shape) for x in jax.tree.leaves(tree)))


# ---------------------------------------------------------------------------
# Optimizer.
# ---------------------------------------------------------------------------
LEARNED_SCALAR_PATTERN = re.compile(r"(^|/)log_[a-z_]+$")


def _path_str(path) -> str:
  return "/".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path)


def weight_decay_mask(params: dict, decay_gains_biases: bool) -> dict:
  """True where AdamW decays.

  MERU's paper disables decay for gains, biases and learned scalars; its code
  (`gain_bias_decay or weight_decay`) in fact decays gains and biases. Both
  are available via `optim.decay_gains_biases`; learned scalars never decay.
  """

  def decide(path, leaf):
    name = _path_str(path)
    if LEARNED_SCALAR_PATTERN.search(name):
      return False
    if decay_gains_biases:
      return True
    return leaf.ndim >= 2 and not name.endswith(("bias", "scale"))

  return jax.tree_util.tree_map_with_path(decide, params)


def learning_rate_schedule(optim_config, total_steps: int) -> optax.Schedule:
  kind = optim_config.get("schedule", "cosine")
  if kind == "constant":
    return optax.constant_schedule(optim_config.lr)
  if kind != "cosine":
    raise ValueError(f"optim.schedule={kind!r}; valid: 'cosine', 'constant'")
  warmup = int(optim_config.warmup_steps)
  if warmup >= total_steps:
    warmup = max(total_steps - 1, 0)
  return optax.warmup_cosine_decay_schedule(
    init_value=0.0,
    peak_value=optim_config.lr,
    warmup_steps=warmup,
    decay_steps=max(total_steps, warmup + 1),
    end_value=0.0,
  )


def make_optimizer(
  optim_config, total_steps: int, params: dict, trainable: Callable[[tuple[str, ...]], bool]
) -> tuple[optax.GradientTransformation, optax.Schedule]:
  schedule = learning_rate_schedule(optim_config, total_steps)
  chain = []
  if optim_config.get("grad_clip_norm"):
    chain.append(optax.clip_by_global_norm(optim_config.grad_clip_norm))
  chain.append(
    optax.adamw(
      schedule,
      b1=optim_config.b1,
      b2=optim_config.b2,
      eps=optim_config.get("eps", 1e-8),
      weight_decay=optim_config.weight_decay,
      mask=weight_decay_mask(params, optim_config.get("decay_gains_biases", False)),
    )
  )
  tx = optax.chain(*chain)
  labels = jax.tree_util.tree_map_with_path(
    lambda path, _: "train" if trainable(tuple(_path_str(path).split("/"))) else "frozen", params
  )
  if all(label == "train" for label in jax.tree.leaves(labels)):
    return tx, schedule
  # Frozen parameters get no optimizer state at all (set_to_zero is stateless).
  return optax.multi_transform({"train": tx, "frozen": optax.set_to_zero()}, labels), schedule


# ---------------------------------------------------------------------------
# The sharded loss and the step.
# ---------------------------------------------------------------------------
def make_mesh(num_devices: int | None = None) -> jax.sharding.Mesh:
  devices = jax.devices()
  if num_devices is not None:
    devices = devices[:num_devices]
  return jax.sharding.Mesh(np.asarray(devices), (DATA_AXIS,))


def make_sharded_loss(model_def: ModelDef, objective, mesh) -> Callable:
  """(params, aux, batch, rng) -> (loss, (metrics, new_aux)), global-batch mean."""

  def local_loss(params, aux, batch, rng):
    model = model_def.merge(params)
    loss, (metrics, new_aux) = objective.loss(model, aux, batch, rng=rng, axis_name=DATA_AXIS)
    pmean = lambda x: jax.lax.pmean(x, DATA_AXIS)
    return pmean(loss), (jax.tree.map(pmean, metrics), new_aux)

  return jax.shard_map(
    local_loss, mesh=mesh, in_specs=(P(), P(), P(DATA_AXIS), P()), out_specs=(P(), (P(), P()))
  )


def make_train_step(model_def: ModelDef, objective, tx, schedule, mesh, base_rng) -> Callable:
  sharded_loss = make_sharded_loss(model_def, objective, mesh)
  grad_fn = jax.value_and_grad(sharded_loss, has_aux=True)

  def train_step(state: dict, batch: dict) -> tuple[dict, dict]:
    step = state["step"]
    rng = jax.random.fold_in(base_rng, step)
    (loss, (metrics, new_aux)), grads = grad_fn(state["params"], state["aux"], batch, rng)
    grad_norm = optax.global_norm(grads)
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
    metrics = {
      **{f"train/{k}": v for k, v in metrics.items()},
      "train/loss": loss,
      "train/l2_grads": grad_norm,
      "train/l2_params": optax.global_norm(state["params"]),
      "train/learning_rate": schedule(step),
    }
    return new_state, metrics

  return train_step


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
      raise CheckpointMismatchError(
        f"{workdir} holds a run with a different configuration; use a new --workdir or "
        "restore the settings:\n  " + "\n  ".join(diffs)
      )
  if jax.process_index() == 0:
    os.makedirs(workdir, exist_ok=True)
    with open(path, "w") as f:
      json.dump(current, f, indent=2, sort_keys=True)


# ---------------------------------------------------------------------------
# Evaluation.
# ---------------------------------------------------------------------------
# ---------------------------------------------------------------------------
# The loop.
# ---------------------------------------------------------------------------
_MIN_EXAMPLES_FOR_BAD_FRACTION = 1000


class InputHealth:
  """Counts the undecodable examples the input pipeline skipped.

  Batches carry host-side ``input/*`` entries, which this pops. Counts are
  this process's; a run stops when the skipped share of all examples read
  passes ``max_bad_fraction``, naming the first bad files.
  """

  def __init__(self, max_bad_fraction: float):
    self.max_bad_fraction = max_bad_fraction
    self.bad, self.read = 0, 0
    self._window_bad = 0
    self.first_names: list[str] = []

  def update(self, batch: dict) -> None:
    counts = batch.pop("input/bad_samples", None)
    names = batch.pop("input/bad_names", None)
    if counts is None:
      return
    bad = int(np.sum(counts))
    self.bad += bad
    self._window_bad += bad
    self.read += bad + len(counts)
    if bad and len(self.first_names) < 5:
      self.first_names += [n for row in names for n in str(row).split("\n") if n][:5]
    # Judged over at least _MIN_EXAMPLES_FOR_BAD_FRACTION examples, so two bad
    # files among the first batch do not end a run that a 1% limit allows.
    if self.bad > self.max_bad_fraction * max(self.read, _MIN_EXAMPLES_FOR_BAD_FRACTION):
      raise BadInputError(
        f"{self.bad} of {self.read} examples read could not be decoded "
        f"({self.bad / self.read:.2%} > input.max_bad_fraction="
        f"{self.max_bad_fraction:.2%}); first: {self.first_names}"
      )

  def window_metrics(self) -> dict:
    """Bad examples since the last call, and the run's bad fraction."""
    if not self.read:
      return {}
    metrics = {
      "train/input/bad_samples": float(self._window_bad),
      "train/input/bad_fraction": self.bad / self.read,
    }
    self._window_bad = 0
    return metrics


class BadInputError(RuntimeError):
  """Too many training examples could not be decoded."""


def _to_global(batch: dict, sharding) -> dict:
  return jax.tree.map(
    lambda x: jax.make_array_from_process_local_data(sharding, np.asarray(x)), batch
  )


def restore_params(workdir: str, step: int | None = None):
  """Params of another run: (its config, ModelDef, params, tokenizer).

  Rebuilds that run's model with its own objective from its saved
  config.json (so the architecture may differ from the caller's) and
  restores only the params from its latest (or given) checkpoint.
  """

  def build(run_config, tokenizer, seed):
    return build_model(run_config, objectives_lib.get(run_config.objective), tokenizer, seed)

  return checkpointing.restore_run_params(workdir, build, step)


def _init_params_from(params: dict, workdir: str, fresh: tuple[str, ...] = ()) -> dict:
  """Copies `workdir`'s params into `params`; top-level names in `fresh`
  (params an objective adds on top of the run it fine-tunes) keep their init."""
  _, _, loaded, _ = restore_params(workdir)
  kept = {name: params[name] for name in fresh if name in params}
  params = {k: v for k, v in params.items() if k not in kept}
  mismatched = []

  def take(path, mine, theirs):
    if mine.shape != theirs.shape:
      mismatched.append(f"{_path_str(path)}: {theirs.shape} in {workdir} vs {mine.shape}")
    return jnp.asarray(theirs, mine.dtype)

  missing = set(map(_path_str, (p for p, _ in jax.tree_util.tree_flatten_with_path(params)[0])))
  missing -= set(map(_path_str, (p for p, _ in jax.tree_util.tree_flatten_with_path(loaded)[0])))
  if missing:
    raise CheckpointMismatchError(f"init_from={workdir} lacks params: {sorted(missing)[:10]}")
  loaded = {k: v for k, v in loaded.items() if k in params}
  out = jax.tree_util.tree_map_with_path(take, params, loaded)
  if mismatched:
    raise CheckpointMismatchError("init_from shapes differ:\n  " + "\n  ".join(mismatched))
  return {**out, **kept}


def init_state(
  config, objective, tokenizer, tx_factory=make_optimizer, *, resuming=False, workdir=None
):
  """The step-0 state. `resuming`: the workdir's own checkpoint will replace
  the params and aux, so neither `init_from` nor anything an objective loads
  from another run (HMID-Net's teacher) is read: those workdirs may be gone."""
  if hasattr(objective, "bind_run"):
    objective.bind_run(workdir, resuming)
  model_def, params = build_model(config, objective, tokenizer, config.seed)
  if config.get("init_from") and not resuming:
    params = _init_params_from(params, config.init_from, objective.fresh_params())
  tx, schedule = tx_factory(config.optim, config.total_steps, params, objective.trainable)
  aux = objective.init_aux(model_def.module, params, jax.random.key(config.seed + 1))
  state = {
    "step": jnp.asarray(0, jnp.int32),
    "params": params,
    "opt_state": tx.init(params),
    "aux": aux,
    "first_nonfinite_step": jnp.asarray(-1, jnp.int32),
  }
  return model_def, state, tx, schedule


@dataclasses.dataclass
class TrainResult:
  state: dict
  model_def: ModelDef
  objective: Any
  tokenizer: Any
  step: int
  checkpoint_dir: str
  evaluators: list  # registry.NamedEvaluator, built before step 1
  predictor_functions: dict  # compiled embedding functions, shared by predictors

  def predictor(self) -> predictor_lib.Predictor:
    return make_predictor(
      self.model_def,
      self.objective,
      self.state,
      self.tokenizer,
      self.config,
      self.predictor_functions,
    )

  config: Any = None
  preempted: bool = False  # stopped early by SIGTERM, with a checkpoint of `step`


def train(
  config: ml_collections.ConfigDict, workdir: str, *, stop_at_step: int | None = None
) -> TrainResult:
  """Trains to `config.total_steps`, resuming from `workdir` if it holds checkpoints.

  `stop_at_step` ends the run early at that step with a checkpoint, as a
  pre-empted or time-limited job would (the schedule still targets
  total_steps); running again in the same workdir continues from there.
  """
  workdir = os.path.abspath(workdir)
  check_config_matches_workdir(config, workdir)
  objective = objectives_lib.get(config.objective)
  tokenizer = tokenizer_lib.get_tokenizer(config.input.tokenizer)
  mesh = make_mesh(config.get("num_devices"))
  num_devices = mesh.devices.size
  if config.input.batch_size % num_devices:
    raise ValueError(
      f"input.batch_size={config.input.batch_size} must be divisible by the "
      f"number of devices ({num_devices})"
    )
  train_iter = objective.make_train_iterator(config, tokenizer)

  checkpointer = Checkpointer(workdir, config.get("keep_ckpts", 3))
  latest = checkpointer.latest_step()
  model_def, state, tx, schedule = init_state(
    config, objective, tokenizer, resuming=latest is not None, workdir=workdir
  )
  replicated = NamedSharding(mesh, P())
  batch_sharding = NamedSharding(mesh, P(DATA_AXIS))
  state = jax.device_put(state, replicated)
  logging.info("model: %s parameters", f"{param_count(state['params']):,}")

  start_step = 0
  if latest is not None:
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, state)
    restored, data_state = checkpointer.restore(latest, abstract)
    state = jax.device_put(restored, replicated)
    train_iter.set_state(data_state)
    start_step = int(state["step"])
    logging.info("resumed from %s at step %d", checkpointer.directory, start_step)
    print(f"Resumed from checkpoint at step {start_step} in {workdir}", flush=True)
  checkpointing.record_provenance(workdir, start_step, mesh)

  train_step = jax.jit(
    make_train_step(model_def, objective, tx, schedule, mesh, jax.random.key(config.seed)),
    donate_argnums=(0,),
  )
  writer = metrics_io.MetricsWriter(workdir)
  total_steps = int(config.total_steps)
  end_step = total_steps if stop_at_step is None else min(stop_at_step, total_steps)
  log_every = int(config.get("log_training_steps", 50))
  ckpt_every = int(config.get("ckpt_steps", 1000))
  # Built before step 1 so that an evaluator that cannot run on this data says
  # so at start-up, not after hours of training.
  # Files evaluators write (plots) go under the workdir, from one process.
  evaluators = registry.build_all(
    config, tokenizer, workdir=workdir if jax.process_index() == 0 else None
  )
  predictor_functions = {}
  eval_steps = sorted({e.every_steps for e in evaluators if e.every_steps > 0})

  def check_finite(at_step: int) -> None:
    bad = int(state["first_nonfinite_step"])
    if bad >= 0:
      checkpointer.wait()
      last = checkpointer.latest_step()
      raise NonFiniteLossError(
        f"non-finite loss or gradient at step {bad + 1} (state step {bad}); training stopped "
        f"at step {at_step}. The state was not updated from that step on and nothing "
        f"non-finite was saved; the last good checkpoint is step {last} in "
        f"{checkpointer.directory}."
      )

  def save(step: int, force: bool = False) -> None:
    check_finite(step)
    checkpointer.save(step, state, train_iter.get_state(), force=force)

  input_health = InputHealth(float(config.input.get("max_bad_fraction", 0.01)))
  # Progress, ETA and the time share of evaluation and checkpointing: clu.
  report_progress = metrics_io.progress_reporter(total_steps, log_every)
  step = start_step
  timer_start, timer_step = time.perf_counter(), step
  input_wait = 0.0  # seconds blocked in the iterator since the last log
  preempted = False
  try:
    with PreemptionWatch() as preemption:
      while step < end_step:
        wait_start = time.perf_counter()
        host_batch = next(train_iter)
        input_wait += time.perf_counter() - wait_start
        input_health.update(host_batch)
        batch = _to_global(host_batch, batch_sharding)
        state, metrics = train_step(state, batch)
        step += 1
        report_progress(step)
        if step % log_every == 0 or step == total_steps:
          check_finite(step)
          elapsed = time.perf_counter() - timer_start
          steps_per_sec = (step - timer_step) / max(elapsed, 1e-9)
          scalars = {k: float(v) for k, v in jax.device_get(metrics).items()}
          scalars["train/steps_per_sec"] = steps_per_sec
          scalars["train/examples_per_sec"] = steps_per_sec * config.input.batch_size
          # Steps are dispatched asynchronously, so the host prepares (and
          # transfers) the next batch while the devices run this one; the
          # time it still blocks in the iterator is input the step waited for.
          scalars["train/input_wait_fraction"] = input_wait / max(elapsed, 1e-9)
          scalars.update(input_health.window_metrics())
          writer.write(step, scalars)
          print(
            f"step {step}/{total_steps}  loss {scalars['train/loss']:.4f}  "
            f"{steps_per_sec:.2f} steps/s",
            flush=True,
          )
          timer_start, timer_step = time.perf_counter(), step
          input_wait = 0.0
        if step % ckpt_every == 0 and step < end_step:
          with report_progress.timed("checkpoint"):
            save(step)
        if step < total_steps and any(step % every == 0 for every in eval_steps):
          predictor = make_predictor(
            model_def, objective, state, tokenizer, config, predictor_functions
          )
          with report_progress.timed("eval"):
            figures = registry.run_all(evaluators, predictor, step)
          if figures:
            writer.write(step, registry.as_logged(figures))
        if step < end_step and preemption.reached(step):
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
    checkpointer.wait()
    raise
  check_finite(step)
  if checkpointer.latest_step() != step:
    save(step, force=True)
  checkpointer.wait()
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
  )


def make_predictor(model_def, objective, state, tokenizer, config, compiled: dict):
  """A Predictor over the current params on this process's devices."""
  return predictor_lib.Predictor(
    model_def,
    objective,
    state["params"],
    aux=state["aux"],
    tokenizer=tokenizer,
    image_size=int(config.input.image_size),
    devices=jax.local_devices()[: make_mesh(config.get("num_devices")).devices.size],
    compiled=compiled,
  )


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict:
  """Trains (resuming if possible), evaluates on the held-out split, prints and
  logs the figures; returns them."""
  run_start = time.perf_counter()
  result = train(config, workdir)
  if result.preempted:
    return {}
  results = registry.run_all(result.evaluators, result.predictor())
  if not results:
    print(f"Training finished at step {result.step}; no evaluation ran.", flush=True)
    return results
  writer = metrics_io.MetricsWriter(os.path.abspath(workdir))
  writer.write(result.step, registry.as_logged(results))
  writer.close()
  print(
    world_eval.format_results(
      results,
      title=f"Evaluation at step {result.step} (run took {time.perf_counter() - run_start:.0f}s)",
    ),
    flush=True,
  )
  return results


class PreemptionWatch:
  """Says, after each step, whether SIGTERM (cluster pre-emption, a job's
  time limit) asks the run to stop, so that it saves and exits between steps.

  Several processes: JAX's pre-emption sync point. JAX's own notifier
  catches SIGTERM on any process, and every process gets True at the same
  step, so all save that step together (Orbax saves are collective; hosts
  stopping at different steps would disagree or hang). One process: a
  SIGTERM handler sets a flag the loop reads after the step in flight.
  """

  def __init__(self):
    self.multi_process = jax.process_count() > 1
    self._signalled = False
    self._previous = None

  def __enter__(self):
    if not self.multi_process:
      try:
        self._previous = signal.signal(signal.SIGTERM, self._on_sigterm)
      except ValueError:  # not the main thread (e.g. a notebook worker): no handler
        self._previous = None
    return self

  def _on_sigterm(self, signum, frame):
    del signum, frame
    self._signalled = True

  def reached(self, step: int) -> bool:
    if self.multi_process:
      return bool(multihost_utils.reached_preemption_sync_point(step))
    return self._signalled

  def __exit__(self, *exc):
    if self._previous is not None:
      signal.signal(signal.SIGTERM, self._previous)
    return False
