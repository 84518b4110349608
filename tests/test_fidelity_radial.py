"""Radial Embeddings pull-back regulariser as released, (1 - mean cos(e, e_0)) / 2
over the texts only, against a float64 NumPy reference; paper-scale optimiser."""

import jax
import ml_collections
import numpy as np
from test_radial import CONTEXT, RUN_CONTEXT, tier_batch, tiny

from configs import radial as radial_config
from hyperbolic_vl.objectives import radial as radial_lib


def test_released_pullback_matches_float64_reference():
  model_def, params, _ = tiny()
  objective = radial_lib.RadialObjective(
    ml_collections.ConfigDict(dict(name="radial", re_weight=0.0, reg_weight=1.0))
  )
  aux = objective.init_aux(model_def.module, params, jax.random.key(0), RUN_CONTEXT)
  params = jax.tree.map(lambda x: x * 1.05, params)  # away from the reference
  batch = tier_batch(6)
  loss, (metrics, _) = objective.loss(
    model_def.merge(params), aux, batch, rng=jax.random.key(0), axis_name=None
  )
  encode = jax.jit(lambda p, t: model_def.merge(p).encode_text(t))

  def emb(p, tokens):
    out = np.asarray(encode(p, tokens), np.float64)
    return out / np.linalg.norm(out, axis=-1, keepdims=True)

  tokens = np.concatenate([batch["tier_tokens"], batch["neg_tier_tokens"]], 1).reshape(-1, CONTEXT)
  cos = np.sum(emb(params, tokens) * emb({**params, **aux["reference"]}, tokens), -1)
  expected = (1 - cos.mean()) / 2  # texts only: no root term
  assert expected > 1e-6
  # float32 embeddings: cos carries ~1e-7 absolute error, the term is ~1e-3.
  np.testing.assert_allclose(float(metrics["loss/reg"]), expected, rtol=1e-4)
  np.testing.assert_allclose(float(loss), expected, rtol=1e-4)


def test_paper_scale_optimiser_as_released():
  config = radial_config.get_config("vit_b")
  assert config.objective.pullback == "released"
  assert config.optim.lr == 1e-7 and config.optim.schedule == "constant"
  assert (config.optim.b1, config.optim.b2, config.optim.weight_decay) == (0.9, 0.999, 0.01)
  assert config.optim.grad_clip_norm == 0.0 and config.optim.decay_gains_biases
