"""Shared pieces of the objective tests: a tiny two-tower model, random
batches, float64 NumPy references and the 1-vs-N-device harness."""

import jax
import numpy as np
from flax import nnx

from hyperbolic_vl import train
from hyperbolic_vl.models import two_towers

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
  return train.ModelDef.from_module(module)


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
def loss_and_grads(model_def, params, objective, batch, num_devices, aux=None):
  mesh = train.make_mesh(num_devices)
  fn = jax.jit(
    jax.value_and_grad(train.make_sharded_loss(model_def, objective, mesh), has_aux=True)
  )
  (loss, (metrics, new_aux)), grads = fn(
    params, {} if aux is None else aux, batch, jax.random.key(0)
  )
  return float(loss), jax.device_get(grads), jax.device_get(metrics)


def max_relative_difference(a, b) -> float:
  """Largest leaf-wise max|a-b| / max|b| over two pytrees."""
  diffs = jax.tree.map(lambda x, y: np.max(np.abs(x - y)) / (np.max(np.abs(y)) + 1e-12), a, b)
  return float(max(jax.tree.leaves(diffs)))


def assert_one_device_equals_eight(
  model_def, params, objective, batch, aux=None, rtol: float = 1e-5
) -> dict:
  """Loss, gradients and metrics of the sharded loss agree on 1 and 8 devices
  within `rtol` (relative); returns the 1-device gradients."""
  loss1, grads1, metrics1 = loss_and_grads(model_def, params, objective, batch, 1, aux)
  loss8, grads8, metrics8 = loss_and_grads(model_def, params, objective, batch, 8, aux)
  assert abs(loss1 - loss8) / abs(loss1) <= rtol
  assert max_relative_difference(grads8, grads1) <= rtol
  for key in metrics1:
    np.testing.assert_allclose(metrics8[key], metrics1[key], rtol=rtol, atol=1e-7)
  return grads1
