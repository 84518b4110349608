"""The device mesh and where the train state lives on it (`config.mesh`).

`mesh.fsdp=1` (the default): one axis, `data`, over every device; the
batch's rows are split over it and the whole train state is replicated.

`mesh.fsdp=N > 1`: a (devices / N, N) mesh with axes (`data`, `fsdp`).
The batch's rows are split over BOTH axes, so every device still holds
different rows and the objectives see one axis name, ("data", "fsdp"),
that covers every device (jax's collectives take a tuple of mesh axes;
their device order is the 1-axis mesh's, so a loss, its gradient and the
data each process reads are the same). The params and the optimizer state
are sharded over `fsdp`: each array along its largest dimension that N
divides, while arrays with fewer than `mesh.fsdp_min_elements` elements or
no such dimension stay replicated. Inside the step's `shard_map` each
sharded param is all-gathered over `fsdp` for the forward pass; the
all-gather's transpose reduce-scatters its gradient over `fsdp`, and the
shard's gradient is then summed over `data`. Everything else of the state
(aux, running statistics, counters) stays replicated.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from hyperbolic_vl import errors

DATA_AXIS = "data"
FSDP_AXIS = "fsdp"
# The parts of the train state that are sharded over `fsdp`.
SHARDED_STATE_KEYS = ("params", "opt_state")


@dataclasses.dataclass(frozen=True)
class MeshSettings:
  """`config.mesh`: the fsdp axis size and the smallest array it shards."""

  fsdp: int = 1
  # Arrays below this many elements stay replicated: gathering a bias or a
  # norm's scale costs a collective's latency and saves next to nothing.
  fsdp_min_elements: int = 2**14


def mesh_settings(config) -> MeshSettings:
  """`config.mesh` parsed (a config without the section gets the defaults);
  a bad key or value raises a one-line ConfigError naming it."""
  section = config.get("mesh") if hasattr(config, "get") else None
  values = dict(section) if section is not None else {}
  valid = [field.name for field in dataclasses.fields(MeshSettings)]
  unknown = sorted(set(values) - set(valid))
  if unknown:
    raise errors.ConfigError(f"unknown config key mesh.{unknown[0]}; valid: {valid}")
  settings = MeshSettings(**values)
  for name in valid:
    value = getattr(settings, name)
    if isinstance(value, bool) or not isinstance(value, int):
      raise errors.ConfigError(f"mesh.{name}={value!r} must be an integer")
  if settings.fsdp < 1:
    raise errors.ConfigError(f"mesh.fsdp={settings.fsdp} must be at least 1")
  if settings.fsdp_min_elements < 0:
    raise errors.ConfigError(
      f"mesh.fsdp_min_elements={settings.fsdp_min_elements} must not be negative"
    )
  return settings


def make_mesh(num_devices: int | None = None, fsdp: int = 1, devices=None) -> jax.sharding.Mesh:
  """The first `num_devices` devices (all: None) as a `data` mesh, or as a
  (devices / fsdp, fsdp) `data` x `fsdp` mesh when fsdp > 1. `devices`:
  those of a topology compiled for ahead of time (tools/aot.py) in place of
  this process's."""
  devices = jax.devices() if devices is None else list(devices)
  if num_devices is not None:
    devices = devices[:num_devices]
  if fsdp == 1:
    return jax.sharding.Mesh(np.asarray(devices), (DATA_AXIS,))
  if len(devices) % fsdp:
    raise errors.ConfigError(f"mesh.fsdp={fsdp} must divide the number of devices ({len(devices)})")
  return jax.sharding.Mesh(np.asarray(devices).reshape(-1, fsdp), (DATA_AXIS, FSDP_AXIS))


def fsdp_size(mesh: jax.sharding.Mesh) -> int:
  return int(dict(mesh.shape).get(FSDP_AXIS, 1))


def device_axes(mesh: jax.sharding.Mesh) -> str | tuple[str, ...]:
  """The axis name covering every device: what the batch's rows are split
  over and what objectives pass to their collectives. `"data"` on a 1-axis
  mesh (exactly the name it always was), the tuple of axes otherwise."""
  names = tuple(mesh.axis_names)
  return names[0] if len(names) == 1 else names


def batch_sharding(mesh: jax.sharding.Mesh) -> NamedSharding:
  return NamedSharding(mesh, P(device_axes(mesh)))


def fsdp_dim(shape: tuple[int, ...], fsdp: int, min_elements: int) -> int | None:
  """The dimension an array of `shape` is sharded along: its largest one
  that `fsdp` divides (the first such on ties); None = replicated."""
  if fsdp == 1 or math.prod(shape) < max(min_elements, 1):
    return None
  divisible = [d for d, size in enumerate(shape) if size % fsdp == 0 and size >= fsdp]
  if not divisible:
    return None
  return max(divisible, key=lambda d: (shape[d], -d))


def leaf_spec(shape: tuple[int, ...], fsdp: int, min_elements: int) -> P:
  dim = fsdp_dim(tuple(shape), fsdp, min_elements)
  if dim is None:
    return P()
  return P(*([None] * dim), FSDP_AXIS)


def param_specs(tree, fsdp: int, min_elements: int):
  """A PartitionSpec per leaf of `tree` (params, optimizer state)."""
  return jax.tree.map(lambda x: leaf_spec(np.shape(x), fsdp, min_elements), tree)


def step_param_specs(params, mesh: jax.sharding.Mesh, min_elements: int):
  """How each param enters the step's shard_map (`gather_params` makes it
  whole inside): sharded over `fsdp` as `param_specs` says; on a mesh of
  one device split over its one-device `data` axis (scalars: P()), as it
  is; otherwise replicated. A replicated param's gradient is summed over
  the mesh on its way out, which on one device is an all-reduce that only
  copies every gradient (55-80 ms of a ViT-S CPU step, nothing beside it);
  a split one's leaves as it is."""
  if fsdp_size(mesh) > 1:
    return param_specs(params, fsdp_size(mesh), min_elements)
  if mesh.size == 1:
    return jax.tree.map(lambda x: P(DATA_AXIS) if np.ndim(x) else P(), params)
  return jax.tree.map(lambda _: P(), params)


def state_shardings(state: dict, mesh: jax.sharding.Mesh, min_elements: int) -> dict:
  """Where every leaf of a train state lives: `params` and `opt_state`
  sharded over `fsdp` as `leaf_spec` says, the rest replicated (on a
  1-axis mesh everything is replicated)."""
  fsdp = fsdp_size(mesh)
  replicated = NamedSharding(mesh, P())

  def place(key, subtree):
    if fsdp == 1 or key not in SHARDED_STATE_KEYS:
      return jax.tree.map(lambda _: replicated, subtree)
    return jax.tree.map(
      lambda x: NamedSharding(mesh, leaf_spec(np.shape(x), fsdp, min_elements)), subtree
    )

  return {key: place(key, subtree) for key, subtree in state.items()}


def gather_params(params, specs):
  """Inside the step's shard_map: every sharded param all-gathered over
  `fsdp` into its whole value. The shard is first marked as varying over
  `data`, so that the gradient is reduce-scattered over `fsdp` (the
  all-gather's transpose) before the shard, N times smaller, is summed
  over `data`."""

  def gather(x, spec):
    if FSDP_AXIS not in spec:
      return x
    x = jax.lax.pcast(x, DATA_AXIS, to="varying")
    return jax.lax.all_gather(x, FSDP_AXIS, axis=spec.index(FSDP_AXIS), tiled=True)

  return jax.tree.map(gather, params, specs, is_leaf=lambda x: isinstance(x, P))


def replicated_value(tree, mesh: jax.sharding.Mesh):
  """Inside the step's shard_map: leaves that hold the same value on every
  device but are typed as varying because they came from gathered or split
  params (HCL's momentum encoder, running statistics) as replicated values:
  the first device's copy, spread by a sum that adds exact zeros. Leaves
  typed as replicated already are returned as they are."""

  def spread(x):
    varying = tuple(name for name in mesh.axis_names if name in _varying_axes(x))
    if not varying:
      return x
    first = jax.lax.axis_index(varying) == 0
    if x.dtype == jnp.bool_:
      return jax.lax.psum(jnp.where(first, x, False).astype(jnp.int32), varying).astype(bool)
    return jax.lax.psum(jnp.where(first, x, jnp.zeros_like(x)), varying)

  return jax.tree.map(spread, tree)


def _varying_axes(x) -> frozenset:
  """The mesh axes a value inside shard_map is typed as varying over (the
  attribute moved between jax versions)."""
  aval = jax.typeof(x)
  if hasattr(aval, "vma"):
    return frozenset(aval.vma)
  return frozenset(aval.mat.varying)


def gather_to_replicated(tree, mesh: jax.sharding.Mesh):
  """A sharded tree as replicated arrays on the same mesh (every process
  calls it together); a 1-axis mesh's tree is returned as it is."""
  if fsdp_size(mesh) == 1:
    return tree
  return _replicating_copy(mesh)(tree)


@functools.cache
def _replicating_copy(mesh: jax.sharding.Mesh):
  # One jitted copy per mesh, so evaluating every few steps compiles it once.
  return jax.jit(lambda tree: tree, out_shardings=NamedSharding(mesh, P()))


def addressable_bytes(tree, device: jax.Device) -> int:
  """Bytes of `tree`'s arrays held on `device` (its addressable shards)."""
  total = 0
  for leaf in jax.tree.leaves(tree):
    for shard in leaf.addressable_shards:
      if shard.device == device:
        total += shard.data.nbytes
  return total
