"""Radial Embeddings objective: float64 reference, freezing, 1 vs 8 devices, CLI run.

As released: Radial Embeddings pull-back regulariser as released, (1 - mean cos(e, e_0)) / 2
over the texts only, against a float64 NumPy reference; paper-scale optimiser."""

import json
import os
import shutil
import subprocess
import sys

import cheap_codegen
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from flax import nnx
from paths import REPO
from tiny_fixtures import MESH_LAYOUTS, assert_one_device_equals_n_devices_float64

from configs import radial as radial_config
from hyperbolic_vl import evaluate, inference
from hyperbolic_vl.evaluators import command_entries
from hyperbolic_vl.models import registry as models_registry
from hyperbolic_vl.models import two_towers
from hyperbolic_vl.objectives import base as objectives_base
from hyperbolic_vl.objectives import radial as radial_lib
from hyperbolic_vl.training import optimizer

VOCAB, CONTEXT, IMAGE = 40, 8, 16
ROOT = str(REPO)


class FakeTokenizer:
  """encode([""]) -> BOS EOS, the shape of the real tokenizers' empty string."""

  vocab_size, context_length = VOCAB, CONTEXT

  def encode(self, texts):
    out = np.zeros((len(texts), CONTEXT), np.int32)
    for i, text in enumerate(texts):
      # Word-level ids: distinct words get distinct ids (up to 6 words fit).
      words = [1 + sum(map(ord, w)) % (VOCAB - 4) for w in text.split()]
      ids = [VOCAB - 2] + words[: CONTEXT - 2] + [VOCAB - 1]
      out[i, : len(ids)] = ids
    return out


def tiny(geometry="euclidean", root="auto", seed=0, dtype="float32"):
  module = two_towers.TwoTowers(
    image_variant="mu/8",
    image_size=IMAGE,
    text_variant="mu",
    vocab_size=VOCAB,
    context_length=CONTEXT,
    embed_dim=16,
    geometry=geometry,
    dtype=dtype,
    rngs=nnx.Rngs(params=seed),
  )
  objective = radial_lib.RadialObjective(
    ml_collections.ConfigDict(
      dict(
        name="radial",
        root=root,
        re_weight=1.0,
        reg_weight=10.0,
        hard_mining=True,
        pullback="squared",  # the released default is tested in test_fidelity_radial.py
      )
    )
  )
  model_def, params = models_registry.ModelDef.from_module(module)
  return model_def, params, objective


# What the trainer hands Radial: the tokenizer that encodes its root text.
RUN_CONTEXT = objectives_base.RunContext(tokenizer=FakeTokenizer())


def tier_batch(batch_size, seed=0):
  rng = np.random.default_rng(seed)
  tok = FakeTokenizer()
  words = ["a", "b", "c", "d", "e", "f", "g", "h"]  # distinct ids, "z" apart
  pos, neg = [], []
  for _ in range(batch_size):
    base_words = list(rng.choice(words, size=4))
    pos += [" ".join(base_words[: k + 1]) for k in range(4)]
    # "z" never occurs in positives: a negative never duplicates a positive.
    neg += ["z " + " ".join(list(rng.choice(words, size=k + 1))) for k in range(4)]
  return {
    "tier_tokens": tok.encode(pos).reshape(batch_size, 4, CONTEXT),
    "neg_tier_tokens": tok.encode(neg).reshape(batch_size, 4, CONTEXT),
  }


def np_angle(e, e2, r):
  a, b = e - r, e2 - e
  cos = np.sum(a * b, -1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))
  return np.arccos(np.clip(cos, -1, 1))


def test_exterior_angle_known_values():
  r = jnp.zeros(2)
  e = jnp.array([1.0, 0.0])
  # Beyond e on the ray: 0; perpendicular: pi/2; back towards the root: pi.
  np.testing.assert_allclose(
    radial_lib.euclidean_exterior_angle(e, jnp.array([2.0, 0.0]), r), 0, atol=1e-3
  )
  np.testing.assert_allclose(
    radial_lib.euclidean_exterior_angle(e, jnp.array([1.0, 1.0]), r), np.pi / 2, atol=1e-6
  )
  np.testing.assert_allclose(
    radial_lib.euclidean_exterior_angle(e, jnp.array([0.5, 0.0]), r), np.pi, atol=1e-3
  )
  grad = jax.grad(lambda x: radial_lib.euclidean_exterior_angle(x, x, r))(e)
  assert np.all(np.isfinite(grad))  # duplicate captions stay finite


def test_loss_matches_float64_reference():
  model_def, params, objective = tiny()
  aux = objective.init_aux(model_def.module, params, jax.random.key(0), RUN_CONTEXT)
  # Move the live params away from the reference so the regulariser is active.
  params = jax.tree.map(lambda x: x * 1.05, params)
  batch = tier_batch(6)
  loss, (metrics, _) = jax.jit(
    lambda p, a, b: objective.loss(model_def.merge(p), a, b, rng=jax.random.key(0), axis_name=None)
  )(params, aux, batch)
  encode = jax.jit(lambda p, t: model_def.merge(p).encode_text(t))

  def emb(p, tokens):
    out = np.asarray(encode(p, tokens), np.float64)
    return out / np.linalg.norm(out, axis=-1, keepdims=True)

  pos = emb(params, batch["tier_tokens"].reshape(-1, CONTEXT)).reshape(6, 4, -1)
  neg = emb(params, batch["neg_tier_tokens"].reshape(-1, CONTEXT)).reshape(6, 4, -1)
  root = emb(params, FakeTokenizer().encode([""]))[0]
  a_pos = np_angle(pos[:, :-1], pos[:, 1:], root)
  a_neg = np_angle(pos[:, :-1], neg[:, :-1], root)
  terms = a_pos - a_neg
  i, j = np.argmax(a_pos), np.argmin(a_neg)
  re = terms.mean() + terms.reshape(-1)[i] + terms.reshape(-1)[j]
  ref_params = {**params, **aux["reference"]}
  tokens = np.concatenate([batch["tier_tokens"], batch["neg_tier_tokens"]], 1).reshape(-1, CONTEXT)
  sq = lambda t: np.sum((emb(params, t) - emb(ref_params, t)) ** 2, -1)
  reg = np.mean(sq(tokens)) + sq(FakeTokenizer().encode([""]))[0]
  assert reg > 1e-6
  np.testing.assert_allclose(float(metrics["loss/reg"]), reg, rtol=1e-4)
  np.testing.assert_allclose(float(loss), re + 10 * reg, rtol=1e-4)


def test_only_text_side_trains():
  _, params, objective = tiny()
  flat = {optimizer.path_str(p): None for p, _ in jax.tree_util.tree_flatten_with_path(params)[0]}
  trainable = {k for k in flat if objective.trainable(tuple(k.split("/")))}
  assert trainable and all(k.startswith(("text_tower", "text_proj")) for k in trainable)
  assert not any(
    objective.trainable(tuple(k.split("/"))) for k in flat if k.startswith(("image_", "log_logit"))
  )


@pytest.mark.parametrize("geometry", ["euclidean", "lorentz"])
@pytest.mark.parametrize("fsdp", MESH_LAYOUTS)
def test_one_device_equals_eight_devices(geometry, fsdp):
  def build():
    model_def, params, objective = tiny(geometry, "auto", dtype="float64")
    aux = objective.init_aux(model_def.module, params, jax.random.key(0), RUN_CONTEXT)
    # Move off the initial params so the pull-back regulariser is active.
    params = jax.tree.map(lambda x: x * 1.02, params)
    return model_def, params, objective, tier_batch(16, seed=1), aux

  grads1 = assert_one_device_equals_n_devices_float64(build, label=f"radial/{geometry}", fsdp=fsdp)
  assert float(np.abs(grads1["text_proj"]["kernel"]).max()) > 0


def test_lorentz_uses_origin_and_rejects_other_roots():
  model_def, params, objective = tiny("lorentz")
  assert objective.root_kind("lorentz") == "origin"
  bad = radial_lib.RadialObjective(ml_collections.ConfigDict(dict(name="radial", root="mean")))
  with pytest.raises(ValueError, match="origin"):
    bad.root_kind("lorentz")


def test_vit_s_variant_builds_abstractly():
  config = radial_config.get_config("vit_s")
  model = models_registry.abstract_model(config)
  assert model.text_proj.kernel.shape == (512, 512)
  config = radial_config.get_config("variant=vit_s,geometry=lorentz")
  assert models_registry.abstract_model(config).geometry == "lorentz"


@pytest.mark.slow  # an end-to-end run of the command line
def test_tiny_fine_tune_from_the_command_line(tmp_path):
  common = [
    "--config.input.batch_size=16",
    "--config.input.image_size=16",
    "--config.evals.world.num_examples=32",
    "--config.evals.world.batch_size=32",
    "--config.log_training_steps=1",
    "--config.optim.warmup_steps=1",
  ]
  env = dict(os.environ, XLA_FLAGS=cheap_codegen.XLA_FLAG, JAX_PLATFORMS="cpu")

  def main(*flags):
    result = subprocess.run(
      [sys.executable, "-m", "hyperbolic_vl.main", *flags, *common],
      cwd=ROOT,
      env=env,
      capture_output=True,
      text=True,
      timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result

  main(
    "--config=configs/clip.py",
    f"--workdir={tmp_path / 'clip'}",
    "--config.total_steps=2",
  )
  radial_evals = (
    "--config.evals.hierarchy.num_examples=32",
    "--config.evals.hierarchy.batch_size=32",
  )
  run = main(
    "--config=configs/radial.py",
    f"--workdir={tmp_path / 'radial'}",
    "--config.total_steps=2",
    *radial_evals,
    f"--config.init_from={tmp_path / 'clip'}",
  )
  assert "eval/hierarchy/tau_d" in run.stdout and "eval/i2t_recall@5" in run.stdout
  # A learned root is a param the CLIP run lacks: init_from keeps it fresh.
  learned = main(
    "--config=configs/radial.py:root=learned",
    f"--workdir={tmp_path / 'radial_learned'}",
    "--config.total_steps=1",
    *radial_evals,
    f"--config.init_from={tmp_path / 'clip'}",
  )
  assert "eval/hierarchy/tau_d" in learned.stdout
  # The command-line evaluator scores with the run's own root (here the
  # stored mean of training texts), as the training-time evaluator did on
  # the same checkpoint and items.
  main(
    "--config=configs/radial.py",
    f"--workdir={tmp_path / 'radial_mean'}",
    "--config.total_steps=1",
    "--config.objective.root=mean",
    *radial_evals,
    f"--config.init_from={tmp_path / 'clip'}",
  )
  logged = {}
  for line in (tmp_path / "radial_mean" / "metrics.jsonl").read_text().splitlines():
    logged.update(json.loads(line))
  model = inference.load(str(tmp_path / "radial_mean"))
  cli = evaluate.evaluate(
    model.config,
    command_entries.one_evaluator("hierarchy", name="hierarchy", dataset="world", num_examples=32),
    model,
  )
  figures = {k.rpartition("/")[2]: v for k, v in cli.items()}
  for key in ("precision", "recall", "tau_d"):
    assert key in figures, sorted(cli)
    assert figures[key] == pytest.approx(logged[f"eval/hierarchy/{key}"], abs=1e-6)
  # Resuming never re-reads init_from: with the CLIP run deleted, the same
  # command restores the fine-tune's own checkpoint and finishes.
  shutil.rmtree(tmp_path / "clip")
  resumed = main(
    "--config=configs/radial.py",
    f"--workdir={tmp_path / 'radial'}",
    "--config.total_steps=2",
    *radial_evals,
    f"--config.init_from={tmp_path / 'clip'}",
  )
  assert "Resumed from checkpoint at step 2" in resumed.stdout


def test_released_pullback_matches_float64_reference():
  model_def, params, _ = tiny()
  objective = radial_lib.RadialObjective(
    ml_collections.ConfigDict(dict(name="radial", re_weight=0.0, reg_weight=1.0))
  )
  aux = objective.init_aux(model_def.module, params, jax.random.key(0), RUN_CONTEXT)
  params = jax.tree.map(lambda x: x * 1.05, params)  # away from the reference
  batch = tier_batch(6)
  # One compiled program (an eager loss compiles each of its ~130 operations).
  loss, (metrics, _) = jax.jit(
    lambda p, a, b: objective.loss(model_def.merge(p), a, b, rng=jax.random.key(0), axis_name=None)
  )(params, aux, batch)
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
