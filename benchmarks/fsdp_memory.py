"""Per-device memory of the training step at each `mesh.fsdp`, from XLA's
buffer assignment of the compiled step; nothing is allocated or run.

  python benchmarks/fsdp_memory.py --config=configs/meru.py:vit_b \
      --config.input.batch_size=64 --fsdp=1,2,4,8 --devices=8

The train state and the batch are abstract (shapes, dtypes and shardings
only), so paper-scale models compile on a laptop's CPU with `--devices`
virtual devices. Per fsdp it prints the params' and optimizer state's bytes
on one device (their shard shapes: 1/fsdp of each sharded array, the small
and indivisible ones whole) and `compiled.memory_analysis()`: arguments
(the state and this device's batch rows), outputs (the new state, donated
into the arguments' buffers) and temporaries (activations, gradients,
gathered params, collectives' buffers); total = arguments + outputs not
written into donated arguments + temporaries, XLA's figure for the step's
peak. Objectives whose aux needs a run context (HMID-Net's teacher) are not
supported.
"""

from __future__ import annotations

import math
import os
import sys
import time

# jax reads XLA_FLAGS (the virtual devices) when its backend starts, at the
# first device query in main, not at import.
import jax
import jax.numpy as jnp
from absl import app, flags
from ml_collections import config_flags

from hyperbolic_vl import objectives as objectives_lib
from hyperbolic_vl.models import registry as models_registry
from hyperbolic_vl.objectives import base as objectives_base
from hyperbolic_vl.training import optimizer, setup, sharding, step_builder
from hyperbolic_vl.training import step as step_lib

flags.DEFINE_list("fsdp", ["1", "2", "4", "8"], "mesh.fsdp values to compile.")
flags.DEFINE_integer("devices", 8, "Virtual CPU devices (set before jax starts).")
config_flags.DEFINE_config_file("config", None, "Config file.", lock_config=False)
FLAGS = flags.FLAGS
GIB, MIB = 2**30, 2**20


def trainable_mask(config, objective, state) -> dict | None:
  params = state["params"]
  return setup.run_trainable_mask(params, setup.trainable_predicate(config, objective, params))


def abstract_state(config, objective, mesh, min_elements):
  """(ModelDef, abstract train state placed on `mesh`, tx, schedule)."""
  module = models_registry.abstract_model(config)
  model_def, params = models_registry.ModelDef.from_module(module)
  tx, schedule = optimizer.make_optimizer(
    config.optim, config.total_steps, params, objective.trainable
  )
  state = {
    "step": jax.ShapeDtypeStruct((), jnp.int32),
    "params": params,
    "opt_state": jax.eval_shape(tx.init, params),
    "aux": jax.eval_shape(
      lambda: objective.init_aux(module, params, jax.random.key(0), objectives_base.EMPTY_CONTEXT)
    ),
    "first_nonfinite_step": jax.ShapeDtypeStruct((), jnp.int32),
  }
  shardings = sharding.state_shardings(state, mesh, min_elements)
  state = jax.tree.map(
    lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), state, shardings
  )
  return model_def, state, tx, schedule


def bytes_per_device(tree) -> int:
  """Bytes of an abstract tree's shards on one device."""
  return sum(
    x.dtype.itemsize * math.prod(x.sharding.shard_shape(x.shape)) for x in jax.tree.leaves(tree)
  )


def abstract_batch(config, objective, rows) -> dict:
  """The batch step_throughput synthesises, as shapes: every tower input
  the objective declares (uint8 images, int32 token ids) and the indices."""
  size, batch = config.input.image_size, config.input.batch_size
  shapes = {"index": ((batch,), jnp.int32)}
  for key, tower in objective.tower_inputs:
    if tower == "image":
      shapes[key] = ((batch, size, size, 3), jnp.uint8)
    else:
      shapes[key] = ((batch, config.input.tokenizer.context_length), jnp.int32)
  return {k: jax.ShapeDtypeStruct(s, d, sharding=rows) for k, (s, d) in shapes.items()}


def measure(config, fsdp: int) -> dict:
  with config.unlocked():
    config.mesh.fsdp = fsdp
  settings = sharding.mesh_settings(config)
  objective = objectives_lib.get(config.objective)
  mesh = sharding.make_mesh(config.get("num_devices"), fsdp)
  model_def, state, tx, schedule = abstract_state(
    config, objective, mesh, settings.fsdp_min_elements
  )
  batch = abstract_batch(config, objective, sharding.batch_sharding(mesh))
  step = jax.jit(
    step_lib.make_run_step(
      model_def,
      objective,
      tx,
      schedule,
      step_builder.derive_step_settings(
        config, model_def, mesh, trainable_mask(config, objective, state), seed=0
      ),
    ),
    donate_argnums=(0,),
  )
  start = time.perf_counter()
  compiled = step.lower(state, batch).compile()
  compile_s = time.perf_counter() - start
  analysis = compiled.memory_analysis()
  return {
    "fsdp": fsdp,
    "params_mib": bytes_per_device(state["params"]) / MIB,
    "opt_state_mib": bytes_per_device(state["opt_state"]) / MIB,
    "arguments_gib": analysis.argument_size_in_bytes / GIB,
    "outputs_gib": analysis.output_size_in_bytes / GIB,
    "temp_gib": analysis.temp_size_in_bytes / GIB,
    # Outputs written into donated arguments' buffers are counted once.
    "total_gib": (
      analysis.argument_size_in_bytes
      + analysis.output_size_in_bytes
      - analysis.alias_size_in_bytes
      + analysis.temp_size_in_bytes
    )
    / GIB,
    "compile_s": compile_s,
  }


def main(argv):
  del argv
  config = FLAGS.config
  rows = []
  print(
    f"{config.model.image_variant} image tower, {config.model.text_variant} text tower, "
    f"global batch {config.input.batch_size}, {FLAGS.devices} CPU devices, "
    f"mesh.fsdp_min_elements {config.mesh.fsdp_min_elements}",
    flush=True,
  )
  print(
    "| fsdp | params MiB/device | optimizer state MiB/device | arguments GiB | outputs GiB "
    "| temp GiB | total GiB | compile s |"
  )
  print("|" + "---|" * 8)
  for fsdp in (int(f) for f in FLAGS.fsdp):
    r = measure(config, fsdp)
    rows.append(r)
    print(
      f"| {r['fsdp']} | {r['params_mib']:.1f} | {r['opt_state_mib']:.1f} | "
      f"{r['arguments_gib']:.3f} | {r['outputs_gib']:.3f} | {r['temp_gib']:.3f} | "
      f"{r['total_gib']:.3f} | {r['compile_s']:.0f} |",
      flush=True,
    )
  return rows


if __name__ == "__main__":
  # The virtual devices must be requested before jax starts its CPU backend.
  for arg in sys.argv[1:]:
    if arg.startswith("--devices="):
      count = arg.split("=", 1)[1]
      break
  else:
    count = "8"
  os.environ["XLA_FLAGS"] = (
    f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={count}"
  ).strip()
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  flags.mark_flags_as_required(["config"])
  app.run(main)
