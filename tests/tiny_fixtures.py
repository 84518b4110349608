"""Shared pieces of the objective tests: a tiny two-tower model, random
batches, float64 NumPy references and the 1-vs-N-device harness."""

import jax
import numpy as np
from flax import nnx

from hyperbolic_vl import train
from hyperbolic_vl.models import registry as models_registry
from hyperbolic_vl.models import two_towers
from hyperbolic_vl.objectives import base as objectives_base

VOCAB, CONTEXT, IMAGE = 40, 8, 16


def tiny_two_towers(
  seed: int = 0, geometry: str = "lorentz", image_variant: str = "mu/8", **kwargs
):
  """(ModelDef, params) of a 16-px mu ViT + mu text tower, embed dim 16."""
  module = two_towers.TwoTowers(
    image_variant=image_variant,
    image_size=IMAGE,
    text_variant="mu",
    vocab_size=VOCAB,
    context_length=CONTEXT,
    embed_dim=16,
    geometry=geometry,
    rngs=nnx.Rngs(params=seed),
    **kwargs,
  )
  return models_registry.ModelDef.from_module(module)


def random_batch(batch_size: int, seed: int = 0, index_offset: int = 0) -> dict:
  """Random images and CLIP-convention token rows; rows 0 and 1 are duplicates
  so self-pair distances (acosh at 1) are exercised."""
  rng = np.random.default_rng(seed)
  tokens = np.zeros((batch_size, CONTEXT), np.int32)
  for i in range(batch_size):
    length = rng.integers(2, CONTEXT - 1)
    tokens[i, 0] = VOCAB - 2
    tokens[i, 1:length] = rng.integers(1, VOCAB - 2, size=length - 1)
    tokens[i, length] = VOCAB - 1  # EOT: the largest id
  tokens[1] = tokens[0]
  return {
    "image": rng.uniform(size=(batch_size, IMAGE, IMAGE, 3)).astype(np.float32),
    "tokens": tokens,
    "index": np.arange(index_offset, index_offset + batch_size, dtype=np.int32),
  }


# -- float64 references written from the papers' formulas ----------------------
def np_time(x, c):
  return np.sqrt(1 / c + np.sum(x * x, -1))


def np_dist(x, y, c):
  """Pairwise Lorentz distance (N, M)."""
  inner = x @ y.T - np_time(x, c)[:, None] * np_time(y, c)[None, :]
  return np.arccosh(np.maximum(-c * inner, 1.0)) / np.sqrt(c)


def np_ce(logits):
  """Mean CE of square logits with the diagonal as targets."""
  logits = logits - logits.max(1, keepdims=True)
  logp = logits - np.log(np.exp(logits).sum(1, keepdims=True))
  return -np.mean(np.diag(logp))


# -- the sharded loss on 1 or N devices -----------------------------------------
def loss_and_grads(
  model_def,
  params,
  objective,
  batch,
  num_devices,
  aux=None,
  rng_seed=0,
  context=objectives_base.EMPTY_CONTEXT,
):
  """(loss, grads, metrics, new_aux) of the sharded loss on `num_devices`."""
  mesh = train.make_mesh(num_devices)
  fn = jax.jit(
    jax.value_and_grad(train.make_sharded_loss(model_def, objective, mesh, context), has_aux=True)
  )
  (loss, (metrics, new_aux)), grads = fn(
    params, {} if aux is None else aux, batch, jax.random.key(rng_seed)
  )
  return float(loss), jax.device_get(grads), jax.device_get(metrics), jax.device_get(new_aux)


def as_float64(tree):
  """Floating leaves of a pytree (params, aux, batch) cast to float64; call
  inside `jax.enable_x64(True)`."""

  def cast(x):
    x = np.asarray(x) if not isinstance(x, jax.Array) else x
    return x.astype(np.float64) if np.issubdtype(x.dtype, np.floating) else x

  return jax.tree.map(cast, tree)


def leafwise_relative_differences(a, b) -> dict:
  """{path: max|a - b| / max(max|b|, floor)} over two pytrees of equal structure.

  floor = 1e-12 x the largest magnitude in b: a leaf that is zero up to
  cancellation (a gradient of terms of both signs summing to ~0) is judged
  against the scale of its tree, not against its own rounding noise.
  """
  leaves_b = jax.tree_util.tree_flatten_with_path(b)[0]
  leaves_a = jax.tree.leaves(a)
  assert len(leaves_a) == len(leaves_b)
  scale = max(
    (float(np.max(np.abs(np.asarray(y, np.float64)), initial=0)) for _, y in leaves_b), default=0.0
  )
  floor = max(1e-12 * scale, np.finfo(np.float64).tiny)
  out = {}
  for x, (path, y) in zip(leaves_a, leaves_b):
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    reference = max(float(np.max(np.abs(y), initial=0)), floor)
    out[jax.tree_util.keystr(path)] = float(np.max(np.abs(x - y), initial=0)) / reference
  return out


# In float64 a sum reordered across devices moves by a few ulps times the
# condition number of the sum; 1e-10 leaves ~1e5 of headroom for the loss's
# cancelling terms and still fails on any real bug (which moves results by
# far more than 1e-6).
IDENTITY_RTOL = 1e-10


def one_device_vs_n_devices(
  model_def,
  params,
  objective,
  batch,
  aux=None,
  *,
  num_devices=8,
  rng_seed=0,
  context=objectives_base.EMPTY_CONTEXT,
) -> dict:
  """Runs the sharded loss on 1 and on `num_devices` devices and returns the
  worst relative difference of each part: loss, metrics, gradients and the
  new aux state (queues, momentum encoders, step counters)."""
  assert jax.device_count() >= num_devices
  one = loss_and_grads(model_def, params, objective, batch, 1, aux, rng_seed, context)
  many = loss_and_grads(model_def, params, objective, batch, num_devices, aux, rng_seed, context)
  parts = {}
  for name, index in (("loss", 0), ("grads", 1), ("metrics", 2), ("aux", 3)):
    diffs = leafwise_relative_differences(many[index], one[index])
    parts[name] = max(diffs.values(), default=0.0)
  parts["grads_1_device"] = one[1]
  return parts


def assert_one_device_equals_n_devices_float64(
  build, *, num_devices=8, rng_seed=0, label="", rtol=IDENTITY_RTOL
) -> dict:
  """The 1-vs-N identity in float64.

  `build()` is called inside `enable_x64` and returns (model_def, params,
  objective, batch, aux[, run context]) for a float64 model (`dtype="float64"`); params,
  batch and aux are cast to float64 here. Prints and asserts the worst
  relative difference of each part; returns the 1-device gradients.
  """
  with jax.enable_x64(True):
    model_def, params, objective, batch, aux, *rest = build()
    context = rest[0] if rest else objectives_base.EMPTY_CONTEXT
    params, batch = as_float64(params), as_float64(batch)
    aux = None if aux is None else as_float64(aux)
    parts = one_device_vs_n_devices(
      model_def,
      params,
      objective,
      batch,
      aux,
      num_devices=num_devices,
      rng_seed=rng_seed,
      context=context,
    )
  grads = parts.pop("grads_1_device")
  worst = max(parts.values())
  print(
    f"[1 vs {num_devices} devices, float64] {label}: worst relative difference {worst:.2e} {parts}"
  )
  assert worst <= rtol, (label, parts)
  return grads
