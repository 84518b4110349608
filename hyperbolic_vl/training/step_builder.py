"""The train step, built and jitted in one place for every caller: the
trainer (`setup.validate`, run by `loop`), the step benchmark
(`tools/step_throughput`) and the ahead-of-time compile (`tools/aot`). Each
gets the same program from the same inputs: the run's mesh (its batch
checked against it), the step's settings (micro-batches, the trainable
mask, the fsdp threshold), the state's shardings and `jax.jit` of
`step.make_run_step` with the state donated and the package's compiler
options, plus any a compile target adds.

A benchmark or a compile for other hardware runs a config without its data
or its source run: `benchmark_config` gives it placeholder lengths and
random starting weights."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable

import jax

from hyperbolic_vl import errors
from hyperbolic_vl.models import micro_batches
from hyperbolic_vl.models import registry as models_registry
from hyperbolic_vl.training import compilation, sharding
from hyperbolic_vl.training import step as step_lib

# Placeholder lengths of a run sized in epochs (`placeholder_run_length`).
PLACEHOLDER_TOTAL_STEPS = 1000
PLACEHOLDER_STEPS_PER_EPOCH = 100


# ---------------------------------------------------------------------------
# A config as a benchmark runs it.
# ---------------------------------------------------------------------------


def placeholder_run_length(config):
  """A config sized in epochs (total_steps=0, HCL's and Radial's paper
  variants) with placeholder lengths: a benchmark reads no data, and the
  schedule's length does not change the step's cost. `config` itself when
  its lengths are given."""
  per_epoch_schedule = config.optim.get("schedule") == "cosine_per_epoch"
  if int(config.total_steps) > 0 and not (
    per_epoch_schedule and not config.optim.get("steps_per_epoch")
  ):
    return config
  config = copy.deepcopy(config)
  with config.unlocked():
    config.total_steps = int(config.total_steps) or PLACEHOLDER_TOTAL_STEPS
    if per_epoch_schedule and not config.optim.get("steps_per_epoch"):
      config.optim.steps_per_epoch = PLACEHOLDER_STEPS_PER_EPOCH
  return config


def set_mask_ratio(config, mask_ratio: float | None) -> None:
  """In place: HMID-Net's student mask or, for every other objective, the
  image tower's token dropping (`model.image_token_drop`) at `mask_ratio`
  (None keeps the config's); an HMID-Net config without
  `objective.teacher_workdir` gets a random teacher of
  `objective.teacher_model`'s size."""
  if config.objective.name != "hmid":
    if mask_ratio is not None:
      config.model.image_token_drop = mask_ratio
    return
  if mask_ratio is not None:
    config.objective.mask_ratio = mask_ratio
  if not config.objective.get("teacher_workdir"):
    config.objective.allow_random_teacher = True


def benchmark_config(config, mask_ratio: float | None = None):
  """A copy of `config` as a benchmark of its step runs it: placeholder
  lengths for a run sized in epochs, random starting weights for a recipe
  that starts from another run (`init_from`: its step costs the same), and
  the mask ratio and random teacher of `set_mask_ratio`."""
  config = copy.deepcopy(placeholder_run_length(config))
  with config.unlocked():
    if "init_from" in config and config.init_from is None:
      config.init_from = ""
    set_mask_ratio(config, mask_ratio)
  return config


# ---------------------------------------------------------------------------
# The mesh and the step's settings.
# ---------------------------------------------------------------------------


def run_mesh(config, devices=None, *, devices_named: str = "devices") -> jax.sharding.Mesh:
  """The run's mesh (`config.num_devices` of `devices`, default this
  host's; `mesh.fsdp`), refused in one line when the global batch does not
  split evenly over it. `devices_named` says what the devices are in that
  line ("chips of v5e:2x2")."""
  mesh = sharding.make_mesh(
    config.get("num_devices"), sharding.mesh_settings(config).fsdp, devices=devices
  )
  if config.input.batch_size % mesh.devices.size:
    raise errors.ConfigError(
      f"input.batch_size={config.input.batch_size} must be divisible by the number of "
      f"{devices_named} ({mesh.devices.size})"
    )
  return mesh


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


def derive_step_settings(
  config, model_def, mesh, trainable: dict | None, *, seed: int | None = None
) -> step_lib.StepSettings:
  """The step's settings for a run config (refused in one line when the run
  cannot use its `optim.accumulation_steps`); `seed` defaults to the config's."""
  return step_lib.StepSettings(
    mesh=mesh,
    seed=config.seed if seed is None else seed,
    trainable=trainable,
    accumulation_steps=checked_accumulation_steps(config, model_def, mesh.devices.size),
    fsdp_min_elements=sharding.mesh_settings(config).fsdp_min_elements,
  )


# ---------------------------------------------------------------------------
# The step.
# ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class TrainStep:
  """A run's jitted train step and what it was built with."""

  # jax.jit of `step.make_run_step`: (state, batch) -> (state, metrics),
  # the state donated. Traced and compiled on first call or `.lower()`.
  jitted: Callable
  settings: step_lib.StepSettings
  # The state's shardings on the mesh (its params and optimizer state split
  # over the fsdp axis where `settings` says).
  state_shardings: dict

  @property
  def mesh(self) -> jax.sharding.Mesh:
    return self.settings.mesh

  def place(self, state: dict) -> dict:
    """`state` (arrays) on the mesh, as the step takes it."""
    return jax.device_put(state, self.state_shardings)

  def place_abstract(self, state: dict) -> dict:
    """`state`'s shapes and dtypes as ShapeDtypeStructs with the step's
    shardings: what a compile without the arrays lowers against."""
    return jax.tree.map(
      lambda leaf, where: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=where),
      state,
      self.state_shardings,
    )


def build_train_step(
  config,
  objective,
  initial,
  mesh: jax.sharding.Mesh,
  *,
  seed: int | None = None,
  extra_compiler_options: dict | None = None,
) -> TrainStep:
  """The run's train step on `mesh`, jitted: the one `jax.jit` of the step.

  `initial` is `setup.InitialState` (model_def, state, tx, schedule,
  context, trainable); its state may be arrays or ShapeDtypeStructs (an
  abstract state, `jax.eval_shape` of `setup.init_state`): only its shapes
  set the shardings. `extra_compiler_options` are a compile target's, over
  the package's own (`compilation.step_compiler_options`). The options are
  those of `compile_target.platform()` when this is called: a compile for
  another platform builds the step inside `compile_target.compiling_for`."""
  settings = derive_step_settings(config, initial.model_def, mesh, initial.trainable, seed=seed)
  jitted = jax.jit(
    step_lib.make_run_step(
      initial.model_def, objective, initial.tx, initial.schedule, settings, initial.context
    ),
    donate_argnums=(0,),
    compiler_options={
      **compilation.step_compiler_options(),
      **(extra_compiler_options or {}),
    },
  )
  shardings = sharding.state_shardings(initial.state, mesh, settings.fsdp_min_elements)
  return TrainStep(jitted, settings, shardings)
