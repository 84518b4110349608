"""Sharded parameters (`config.mesh.fsdp`): two steps on a `data` x `fsdp`
mesh equal the replicated run in float64, the params and optimizer state
take 1/fsdp of the bytes per device, checkpoints resume exactly and reshard
into another fsdp, and a bad mesh is a one-line ConfigError.

The reference is the existing path: 8 devices on one `data` axis. fsdp=2
and 4 are (4, 2) and (2, 4) meshes over the same 8 devices; the batch's
rows are split over both axes in the same device order, so every device
sees the rows it saw before. What changes is where the params and optimizer
state live and the order of the gradient's sums (a reduce-scatter over
`fsdp`, then a sum over `data`, instead of one sum over the 8 devices).
Every objective's loss and gradients on the (4, 2) mesh equal those of one
device through the same harness as their 1-vs-8 tests
(`tiny_fixtures.one_device_vs_n_devices(..., fsdp=2)`).
"""

import collections
import dataclasses
import math
import os
import re
import shutil

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from tiny_fixtures import leafwise_relative_differences
from tiny_runs import small_config

from configs import hcl as hcl_config
from hyperbolic_vl import errors
from hyperbolic_vl import objectives as objectives_lib
from hyperbolic_vl.data import registry as data_registry
from hyperbolic_vl.data import tokenizer as tokenizer_lib
from hyperbolic_vl.evaluators import registry
from hyperbolic_vl.runs import checkpointing, metrics_io
from hyperbolic_vl.training import loop, setup, sharding
from hyperbolic_vl.training import step as step_lib

DEVICES = 8
STEPS = 2
# fsdp=2 in the push tier; fsdp=4 (a (2, 4) mesh) repeats its path with
# other groups: slow tier.
FSDP_CASES = [2, pytest.param(4, marks=pytest.mark.slow)]
# Two float64 runs that differ only in the order of their sums: 1e-12
# relative leaves ~1e3 of headroom over what was observed (<= 1e-14 for the
# moments and SGD's params) and fails on any real bug, which moves results
# by far more than 1e-6 (tiny_fixtures.IDENTITY_RTOL is 1e-10).
RTOL = 1e-12


class NoText:
  vocab_size = 1
  context_length = 1


def meru_adamw_config():
  # A constant learning rate: a warmup from 0 would make step 1's update zero.
  return small_config(**{"model.dtype": "float64", "optim.schedule": "constant", "optim.lr": 1e-3})


def hcl_sgd_config():
  config = hcl_config.get_config()
  with config.unlocked():
    config.model.dtype = "float64"
    config.input.image_size = 16
    config.input.batch_size = 16
    config.objective.queue_size = 64
    # The released MoCo-v2 recipe: SGD with momentum.
    config.optim.name = "sgd"
    config.optim.schedule = "constant"
    config.optim.lr = 0.1
  return config


def run_steps(config, tokenizer, fsdp_sizes=(1, 2)):
  """({fsdp: Run after STEPS steps}, initial state): one initial state, the
  same batches; every array with an fsdp-divisible dimension is sharded
  (fsdp_min_elements=0)."""
  objective = objectives_lib.get(config.objective)
  model_def, state, tx, schedule, context, _ = setup.init_state(config, objective, tokenizer)
  batches = data_registry.make_train_iterator(config.input, tokenizer, seed=config.seed)
  batches = [dict(next(batches)) for _ in range(STEPS)]
  initial = jax.device_get(state)
  out = {}
  for fsdp in fsdp_sizes:
    mesh = sharding.make_mesh(DEVICES, fsdp)
    step = jax.jit(
      step_lib.make_train_step(
        model_def, objective, tx, schedule, mesh, jax.random.key(0), context, fsdp_min_elements=0
      ),
      donate_argnums=(0,),
    )
    state = jax.device_put(initial, sharding.state_shardings(initial, mesh, 0))
    placed = {
      key: sharding.addressable_bytes(state[key], jax.devices()[0])
      for key in ("params", "opt_state")
    }
    placed_batches = [jax.device_put(b, sharding.batch_sharding(mesh)) for b in batches]
    compiled = step.lower(state, placed_batches[0]).compile()
    for batch in placed_batches:
      state, metrics = compiled(state, batch)
    out[fsdp] = Run(*jax.device_get((state, metrics)), compiled.memory_analysis(), placed)
    out[fsdp].hlo = compiled.as_text()
  return out, initial


@dataclasses.dataclass
class Run:
  state: dict
  metrics: dict
  memory: object  # compiled.memory_analysis()
  placed: dict  # bytes of params and opt_state on device 0 before the steps
  hlo: str = ""  # the compiled step


def worst(a, b) -> float:
  return max(leafwise_relative_differences(a, b).values(), default=0.0)


def split_key_biases(params):
  """The qkv biases split into their query, key and value thirds."""

  def split(path, leaf):
    if jax.tree_util.keystr(path).endswith("['qkv']['bias']"):
      query, key, value = np.split(np.asarray(leaf), 3, axis=-1)
      return {"query": query, "key": key, "value": value}
    return leaf

  return jax.tree_util.tree_map_with_path(split, params)


def without_key_biases(tree):
  return jax.tree.map(
    lambda x: {k: v for k, v in x.items() if k != "key"} if isinstance(x, dict) else x,
    tree,
    is_leaf=lambda x: isinstance(x, dict) and set(x) == {"query", "key", "value"},
  )


def key_biases(tree) -> list:
  leaves = jax.tree.leaves(tree, is_leaf=lambda x: isinstance(x, dict) and "key" in x)
  return [x["key"] for x in leaves if isinstance(x, dict) and "key" in x]


def meru_steps(fsdp_sizes):
  with jax.enable_x64(True):
    config = meru_adamw_config()
    return run_steps(config, tokenizer_lib.get_tokenizer(config.input.tokenizer), fsdp_sizes)


@pytest.fixture(scope="module")
def meru_runs():
  return meru_steps((1, 2))


@pytest.fixture(scope="module")
def meru_runs_fsdp_4():
  return meru_steps((1, 4))


def meru_runs_for(fsdp, request):
  return request.getfixturevalue("meru_runs" if fsdp == 2 else "meru_runs_fsdp_4")


@pytest.mark.parametrize("fsdp", FSDP_CASES)
def test_meru_adamw_fsdp_equals_replicated(request, fsdp):
  """Loss, metrics and AdamW's moments (which hold both steps' gradients)
  agree leaf by leaf within 1e-12; so do the params but for the key thirds
  of the attention qkv biases. Those have a zero gradient in exact
  arithmetic (softmax ignores the shift q.b_k shared by a row's logits), so
  both runs compute rounding noise g ~ 1e-17 there, which AdamW's update
  g / (|g| + eps) turns into ~g / eps ~ 1e-9 of lr: the two runs' noises
  differ, and these biases (started at zero, so their own scale is ~lr)
  differ by ~3e-10 of themselves. For them the bound is the tree's scale:
  |delta| <= 1e-12 max |params| (observed 2e-13)."""
  runs, initial = meru_runs_for(fsdp, request)
  state, metrics = runs[fsdp].state, runs[fsdp].metrics
  reference, reference_metrics = runs[1].state, runs[1].metrics
  parts = {
    "metrics": worst(metrics, reference_metrics),
    "opt_state": worst(state["opt_state"], reference["opt_state"]),
    "params (no key biases)": worst(
      without_key_biases(split_key_biases(state["params"])),
      without_key_biases(split_key_biases(reference["params"])),
    ),
  }
  scale = max(float(np.max(np.abs(x))) for x in jax.tree.leaves(reference["params"]))
  key_delta = max(
    float(np.max(np.abs(a - b)))
    for a, b in zip(
      key_biases(split_key_biases(state["params"])),
      key_biases(split_key_biases(reference["params"])),
    )
  )
  parts["key biases / max |params|"] = key_delta / scale
  print(f"[MERU AdamW, fsdp {fsdp} vs 1, float64, {STEPS} steps] worst relative {parts}")
  assert max(parts.values()) <= RTOL, parts
  # The key biases' gradients are rounding noise: their first moment is zero
  # but for ~1e-16 of the largest moment.
  mu = [s.mu for s in jax.tree.leaves(reference["opt_state"], is_leaf=_is_adam) if _is_adam(s)][0]
  mu_scale = max(float(np.max(np.abs(x))) for x in jax.tree.leaves(mu))
  for moment in key_biases(split_key_biases(mu)):
    assert float(np.max(np.abs(moment))) <= 1e-12 * mu_scale
  # The steps moved the params (the comparison is not between two inits).
  assert worst(reference["params"], initial["params"]) > 1e-4


def _is_adam(x) -> bool:
  return hasattr(x, "mu") and hasattr(x, "nu")


@pytest.mark.parametrize("fsdp", FSDP_CASES)
def test_hcl_sgd_fsdp_equals_replicated(fsdp):
  """HCL (SGD with momentum, linear in the gradients, so no noise is
  amplified): params, momentum buffers, the momentum encoder and the queues
  (aux, derived from the gathered params inside the step) within 1e-12."""
  with jax.enable_x64(True):
    runs, initial = run_steps(hcl_sgd_config(), NoText(), (1, fsdp))
  reference, reference_metrics = runs[1].state, runs[1].metrics
  state, metrics = runs[fsdp].state, runs[fsdp].metrics
  parts = {key: worst(state[key], reference[key]) for key in ("params", "opt_state", "aux")}
  parts["metrics"] = worst(metrics, reference_metrics)
  print(f"[HCL SGD, fsdp {fsdp} vs 1, float64, {STEPS} steps] worst relative {parts}")
  assert max(parts.values()) <= RTOL, parts
  assert worst(reference["params"], initial["params"]) > 1e-4
  assert worst(reference["aux"]["momentum"], initial["aux"]["momentum"]) > 1e-6


@pytest.mark.parametrize("fsdp", FSDP_CASES)
def test_state_bytes_per_device_fall_by_fsdp(request, fsdp):
  """Per device, the params and optimizer state take 1/fsdp of their bytes,
  up to the arrays no fsdp divides (scalars, odd sizes), which stay whole:
  read from the arrays' shards on device 0 and, independently, from XLA's
  buffer assignment of the compiled step, whose arguments are the state plus
  the same batch rows in every layout."""
  runs, initial = meru_runs_for(fsdp, request)
  analysis_1, placed_1 = runs[1].memory, runs[1].placed
  analysis, placed = runs[fsdp].memory, runs[fsdp].placed
  for key in ("params", "opt_state"):
    leaves = jax.tree.leaves(initial[key])
    whole = sum(x.nbytes for x in leaves)
    unsharded = sum(x.nbytes for x in leaves if sharding.fsdp_dim(np.shape(x), fsdp, 0) is None)
    assert placed_1[key] == whole
    assert placed[key] == (whole - unsharded) // fsdp + unsharded
    # What stays whole is the scalars and the few arrays of odd sizes.
    assert unsharded <= 0.01 * whole, (key, unsharded, whole)
  state_delta = sum(placed.values()) - sum(placed_1.values())
  assert analysis.argument_size_in_bytes - analysis_1.argument_size_in_bytes == state_delta
  print(
    f"fsdp {fsdp}: params + optimizer state {sum(placed.values())} bytes per device "
    f"(fsdp 1: {sum(placed_1.values())}); compiled arguments "
    f"{analysis.argument_size_in_bytes} (fsdp 1: {analysis_1.argument_size_in_bytes})"
  )


def test_params_are_gathered_and_gradients_reduce_scattered_within_fsdp_groups(meru_runs):
  """The compiled fsdp=2 step (devices 0-7 as a (4, 2) mesh, fsdp groups
  {0,1} {2,3} {4,5} {6,7}): every param all-gather and gradient
  reduce-scatter runs within an fsdp group, and the gradient shards are
  then summed across the groups ({0,2,4,6} {1,3,5,7}); the only collectives
  over all 8 devices are the objective's (the 16 embeddings' all-gather
  and its transpose) and the scalar loss and metrics."""
  runs, _ = meru_runs
  fsdp_groups, data_groups = "{{0,1},{2,3},{4,5},{6,7}}", "{{0,2,4,6},{1,3,5,7}}"
  collectives = re.findall(
    r"= (\(.*?\)|\S+) (all-gather|reduce-scatter|all-reduce)\(.*?replica_groups=(\S+?\}\}|\S+)",
    runs[2].hlo,
  )
  by_groups = collections.Counter((kind, groups.rstrip(",")) for _, kind, groups in collectives)
  assert by_groups[("all-gather", fsdp_groups)] > 10
  assert by_groups[("reduce-scatter", fsdp_groups)] > 10
  assert by_groups[("all-reduce", data_groups)] >= 1
  everywhere = [
    (shape, kind) for shape, kind, groups in collectives if groups.startswith("{{0,1,2,3,4")
  ]
  for shape, kind in everywhere:
    arrays = re.findall(r"f64\[([\d,]*)\]", shape)
    # Scalars, the 16 gathered (row, 64) embeddings, a device's 2 rows of them.
    assert all(a in ("", "16,64", "2,64") for a in arrays), (kind, shape)


@pytest.mark.parametrize(
  "shape, fsdp, min_elements, expected",
  [
    ((64, 192), 4, 0, 1),  # the largest divisible dimension
    ((192, 64), 4, 0, 0),
    ((64, 64), 2, 0, 0),  # a tie: the first
    ((6, 4), 4, 0, 1),  # 6 is not divisible by 4
    ((7, 5), 2, 0, None),  # none is
    ((), 2, 0, None),  # scalars stay whole
    ((2,), 4, 0, None),  # smaller than fsdp
    ((128,), 2, 129, None),  # below fsdp_min_elements
    ((128,), 2, 128, 0),
    ((49408, 512), 8, 2**14, 0),  # a CLIP token embedding
    ((5, 3), 1, 0, None),  # fsdp=1 shards nothing
  ],
)
def test_fsdp_dimension_rule(shape, fsdp, min_elements, expected):
  assert sharding.fsdp_dim(shape, fsdp, min_elements) == expected


def test_fsdp_not_dividing_the_devices_is_one_line_config_error(tmp_path):
  workdir = tmp_path / "run"
  with pytest.raises(errors.ConfigError) as raised:
    loop.train(small_config(**{"mesh.fsdp": 3}), str(workdir))
  assert str(raised.value) == "mesh.fsdp=3 must divide the number of devices (8)"
  assert not os.path.exists(workdir / "config.json")  # refused before anything is written
  with pytest.raises(
    errors.ConfigError, match=r"mesh\.fsdq; valid: \['fsdp', 'fsdp_min_elements'\]"
  ):
    sharding.mesh_settings({"mesh": {"fsdq": 2}})
  with pytest.raises(errors.ConfigError, match=r"^mesh\.fsdp=0 must be at least 1$"):
    sharding.mesh_settings({"mesh": {"fsdp": 0}})


@pytest.mark.slow
def test_fsdp_run_resumes_exactly_and_restores_into_another_fsdp(tmp_path):
  """A float32 run with fsdp=2: stopped at step 3 and resumed, it ends with
  the uninterrupted run's params bit for bit. Its step-3 checkpoint read
  into an fsdp=1 state gives the saved arrays exactly (Orbax reshards on
  read), and the run resumed from it with fsdp=1 logs the same losses: the
  params agree to float32 rounding but for the key biases, which the loss
  ignores (see test_meru_adamw_fsdp_equals_replicated), so 1e-5 bounds a
  loss of ~4 summed over 16 rows in float32 (~1e-6 observed)."""
  config = small_config(**{"mesh.fsdp": 2, "mesh.fsdp_min_elements": 0})
  full = loop.train(config, str(tmp_path / "full"))
  # The Predictor takes the params whole (gathered from their shards).
  figures = registry.run_all(full.evaluators, full.predictor())
  assert 0 <= figures["eval/zero_shot_accuracy"] <= 1
  stopped = loop.train(config, str(tmp_path / "resumed"), stop_at_step=3)
  saved_state = jax.device_get(stopped.state)
  embedding = stopped.state["params"]["text_tower"]["token_embedding"]["embedding"]
  assert embedding.shape == (256, 64)  # sharded along its rows, the largest dimension
  assert {s.data.shape for s in embedding.addressable_shards} == {(128, 64)}
  shutil.copytree(tmp_path / "resumed", tmp_path / "as_fsdp_1")
  resumed = loop.train(config, str(tmp_path / "resumed"))
  assert resumed.step == 6
  assert jax.tree.structure(resumed.state) == jax.tree.structure(full.state)
  for a, b in zip(jax.tree.leaves(resumed.state), jax.tree.leaves(full.state)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))

  # The fsdp=2 checkpoint read into the replicated layout of fsdp=1.
  replicated_config = small_config()
  objective = objectives_lib.get(replicated_config.objective)
  tokenizer = tokenizer_lib.get_tokenizer(replicated_config.input.tokenizer)
  _, state, *_ = setup.init_state(replicated_config, objective, tokenizer)
  mesh = sharding.make_mesh()
  state = jax.device_put(state, sharding.state_shardings(state, mesh, 0))
  abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, state)
  restored = checkpointing.find_resumable(str(tmp_path / "as_fsdp_1" / "checkpoints"), abstract)
  assert restored.step == 3
  for a, b in zip(jax.tree.leaves(restored.state), jax.tree.leaves(saved_state)):
    assert a.sharding.is_fully_replicated
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))

  as_fsdp_1 = loop.train(replicated_config, str(tmp_path / "as_fsdp_1"))
  assert as_fsdp_1.step == 6
  losses = lambda run: {
    r["step"]: r["train/loss"]
    for r in metrics_io.read_metrics(str(tmp_path / run))
    if "train/loss" in r
  }
  reference, resharded = losses("full"), losses("as_fsdp_1")
  assert set(resharded) >= {4, 6}
  for step in (4, 6):
    assert math.isclose(resharded[step], reference[step], rel_tol=1e-5), (
      step,
      resharded,
      reference,
    )
