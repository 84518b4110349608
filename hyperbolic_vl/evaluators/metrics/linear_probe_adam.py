"""HCL's object probe: multinomial logistic regression on frozen,
standardised features, fitted by full-batch AdamW (JAX / optax) for a fixed
number of steps; cheap enough to run inside training on the world's crops.
(MERU's benchmark probe, with C searched on a validation split, is
linear_probe_c_search.py.)"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax


def linear_probe(
  train_x,
  train_y,
  test_x,
  test_y,
  num_classes: int,
  steps: int = 300,
  lr: float = 1e-2,
  weight_decay: float = 1e-4,
  score_x=None,
):
  """Test accuracy of multinomial logistic regression on standardised features;
  with `score_x`, also the probe's class probabilities on those rows."""
  mean, std = train_x.mean(0), train_x.std(0) + 1e-6
  train_x, test_x = (train_x - mean) / std, (test_x - mean) / std
  params = {"w": jnp.zeros((train_x.shape[1], num_classes)), "b": jnp.zeros((num_classes,))}
  tx = optax.adamw(lr, weight_decay=weight_decay)
  x, y = jnp.asarray(train_x, jnp.float32), jnp.asarray(train_y)

  def loss(p):
    return optax.softmax_cross_entropy_with_integer_labels(x @ p["w"] + p["b"], y).mean()

  @jax.jit
  def fit(p):
    def step(carry, _):
      p, state = carry
      grads = jax.grad(loss)(p)
      updates, state = tx.update(grads, state, p)
      return (optax.apply_updates(p, updates), state), None

    (p, _), _ = jax.lax.scan(step, (p, tx.init(p)), None, length=steps)
    return p

  params = fit(params)
  predictions = np.argmax(np.asarray(test_x @ params["w"] + params["b"]), axis=1)
  accuracy = float(np.mean(predictions == np.asarray(test_y)))
  if score_x is None:
    return accuracy
  logits = ((np.asarray(score_x) - mean) / std) @ np.asarray(params["w"]) + np.asarray(params["b"])
  return accuracy, np.asarray(jax.nn.softmax(jnp.asarray(logits, jnp.float32), axis=-1))
