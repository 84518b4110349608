"""The ResNet tower against torchvision: sizes, a training-mode forward pass
with its running-statistics update (float64), and the towers that accept it."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torchvision
from flax import nnx
from torch_resnets import randomize_batch_norms, torch_features

from hyperbolic_vl.interop import torchvision_resnet
from hyperbolic_vl.models import batch_norm, hcl, registry, resnet


def count(tree) -> int:
  return sum(math.prod(x.shape) for x in jax.tree.leaves(tree))


@pytest.mark.parametrize("variant", ["RN50", "RN101", "RN152"])
def test_sizes_equal_torchvision(variant):
  """Params = torchvision's without `fc`; running statistics = its
  running_mean + running_var entries (num_batches_tracked is not kept)."""
  reference = getattr(torchvision.models, f"resnet{variant[2:]}")()
  state = reference.state_dict()
  params = sum(p.numel() for n, p in reference.named_parameters() if not n.startswith("fc."))
  stats = sum(t.numel() for n, t in state.items() if n.endswith(("running_mean", "running_var")))
  module = nnx.eval_shape(lambda: resnet.ResNet(variant, 224, rngs=nnx.Rngs(0)))
  assert count(nnx.state(module, nnx.Param)) == params
  assert count(nnx.state(module, nnx.BatchStat)) == stats
  assert module.width == 2048
  if variant == "RN50":  # torchvision's published 25,557,032 includes fc (2048 x 1000 + 1000)
    assert params == 25_557_032 - 2_049_000


def float64_model_def(variant: str, image_size: int):
  module = nnx.eval_shape(
    lambda: resnet.ResNet(
      variant, image_size, dtype=jnp.float64, param_dtype=jnp.float64, rngs=nnx.Rngs(0)
    )
  )
  return registry.ModelDef.from_module(module)[0]


def as_float64(tree):
  return jax.tree.map(lambda x: jnp.asarray(x, jnp.float64), tree)


def test_training_mode_step_equals_torchvision_float64():
  """One training-mode forward pass of ResNet-50 at 64 px on 4 images:
  features normalised with the batch's statistics, and every running mean
  and variance afterwards (momentum 0.1 in torch's convention, unbiased
  variance), equal torch's in float64. Eval-mode equality is in
  tests/interop/test_torchvision_resnet.py."""
  reference = randomize_batch_norms(torchvision.models.resnet50(), seed=1)
  params, stats = torchvision_resnet.tower_variables(reference.state_dict(), "RN50")
  images = np.random.default_rng(1).uniform(size=(4, 64, 64, 3))
  reference = reference.double().train()
  expected = torch_features(reference, images)
  expected_stats = {
    name: tensor.numpy() for name, tensor in reference.state_dict().items() if "running" in name
  }

  with jax.enable_x64(True):
    model_def = float64_model_def("RN50", 64)

    @jax.jit
    def train_forward(p, s, x):
      model = model_def.merge_for_training(p, s, axis_name=None)
      return model(x), model_def.batch_stats_of(model)

    features, new_stats = train_forward(as_float64(params), as_float64(stats), images)
    features = np.asarray(features)
    worst_feature = float(np.max(np.abs(features - expected)) / np.max(np.abs(expected)))
    ours = {torch_name(path): np.asarray(v) for path, v in flat_paths(new_stats).items()}
    before = {torch_name(path): np.asarray(v) for path, v in flat_paths(stats).items()}
  assert set(ours) == set(expected_stats)
  worst_stat = max(
    float(np.max(np.abs(ours[n] - v)) / np.max(np.abs(v))) for n, v in expected_stats.items()
  )
  moved = max(float(np.max(np.abs(ours[n] - before[n]))) for n in ours)
  print(
    f"RN50 training mode vs torch (float64): features {worst_feature:.2e}, "
    f"running statistics {worst_stat:.2e} (worst relative); statistics moved by up to {moved:.3f}"
  )
  # float64 on both sides (the float32 weight draws convert exactly): only
  # summation order differs, through a ~50-layer chain; 1e-10 leaves ~1e5
  # of headroom and fails on any real difference (a biased running
  # variance alone would move one by 1 / (n - 1) >= 1 / 63).
  assert worst_feature < 1e-10
  assert worst_stat < 1e-10
  assert moved > 1e-2  # the statistics did move in this step


def flat_paths(tree, prefix=()):
  out = {}
  for key, value in tree.items():
    if isinstance(value, dict):
      out.update(flat_paths(value, prefix + (key,)))
    else:
      out[prefix + (key,)] = value
  return out


def torch_name(path) -> str:
  """("layer1", 0, "downsample_norm", "mean") -> "layer1.0.downsample.1.running_mean"."""
  *modules, leaf = path
  modules = ["downsample.1" if m == "downsample_norm" else str(m) for m in modules]
  return ".".join(modules + [f"running_{leaf}"])


def test_tracing_a_training_mode_update_reads_no_tracers_sharding(monkeypatch):
  """A tracer's `sharding` raises with a message that walks every equation
  traced so far; flax's `variable[...] = value` reads it to compare
  shardings, which made tracing ResNet-50's HCL step quadratic in its
  length (two walks per batch norm per pass: minutes). The update assigns
  whole values instead; its statistics are checked against torch above."""
  reads = []

  def counting_sharding(tracer):
    reads.append(type(tracer).__name__)
    raise AttributeError("sharding")  # what a tracer's `sharding` raises

  monkeypatch.setattr(jax.core.Tracer, "sharding", property(counting_sharding))
  norm = batch_norm.BatchNorm(4, rngs=nnx.Rngs(0))
  batch_norm.training_mode(norm, None)
  graph, state = nnx.split(norm)

  def step(state, x):
    module = nnx.merge(graph, state)
    return module(x), nnx.state(module)

  # State and input traced, as in the trainer's step.
  traced = jax.make_jaxpr(step)(state, jnp.ones((3, 4)))
  assert reads == []
  # The update happened: the running statistics come out of the traced
  # program computed, not passed through; the gain and bias pass through.
  inputs = traced.jaxpr.invars
  updated = [out not in inputs for out in traced.jaxpr.outvars[1:]]
  names = [path[0].key for path, _ in jax.tree_util.tree_leaves_with_path(state)]
  assert dict(zip(names, updated)) == {"bias": False, "mean": True, "scale": False, "var": True}


def test_eval_mode_uses_running_statistics_and_merge_requires_them():
  module = resnet.ResNet("RN-mu", 32, rngs=nnx.Rngs(0))
  model_def, params = registry.ModelDef.from_module(module)
  stats = model_def.initial_batch_stats()
  assert model_def.has_batch_stats and set(stats) == {"bn1", "layer1", "layer2", "layer3", "layer4"}
  images = np.random.default_rng(0).uniform(size=(3, 32, 32, 3)).astype(np.float32)
  shifted = jax.tree.map(lambda x: x + 0.5, stats)
  # Each form of merge's forward pass compiled whole (eagerly each op of the
  # ResNet would compile on its own).
  forward = jax.jit(lambda p, s, x: model_def.merge(p, s)(x))
  forward_of_variables = jax.jit(lambda v, x: model_def.merge(v)(x))
  # Evaluation mode reads the running statistics: other statistics, other features.
  a = forward(params, stats, images)
  b = forward(params, shifted, images)
  assert float(np.max(np.abs(a - b))) > 1e-3
  # The one-dict form a Predictor holds gives the same module.
  np.testing.assert_array_equal(
    forward_of_variables(model_def.variables(params, shifted), images), b
  )
  again_params, again_stats = model_def.split_variables(model_def.variables(params, shifted))
  assert jax.tree.structure(again_params) == jax.tree.structure(params)
  assert jax.tree.structure(again_stats) == jax.tree.structure(stats)
  with pytest.raises(ValueError, match="batch norms: merge needs their running statistics"):
    model_def.merge(params)
  with pytest.raises(ValueError, match="patch dropping"):
    module(images, keep_indices=jnp.zeros((3, 2), jnp.int32))


def test_every_model_accepts_a_resnet_tower():
  """Built and run abstractly (nnx.eval_shape, jax.eval_shape): every check
  here is of structure and shapes, which tracing decides in full; built and
  run concretely, each initializer and each op of the forward passes would
  be its own XLA compile. A concrete ResNet forward pass is checked in
  test_eval_mode_uses_running_statistics_and_merge_requires_them."""
  sizes = dict(image_size=32, vocab_size=40, context_length=8)
  build = lambda config: nnx.eval_shape(lambda: registry.build(config, **sizes, rngs=nnx.Rngs(0)))
  images = jax.ShapeDtypeStruct((2, 32, 32, 3), jnp.float32)
  for name, geometry in (("two_towers", "lorentz"), ("two_towers_with_root", "euclidean")):
    config = dict(
      name=name, image_variant="RN-mu", text_variant="mu", embed_dim=16, geometry=geometry
    )
    model = build(config)
    assert isinstance(model.image_tower, resnet.ResNet) and model.image_tower.width == 256
    model_def, params = registry.ModelDef.from_module(model)
    encode = lambda p, s, x, model_def=model_def: model_def.merge(p, s).encode_image(x)
    embeddings = jax.eval_shape(encode, params, model_def.initial_batch_stats(), images)
    assert embeddings.shape == (2, 16)
  model = build(dict(name="hcl", image_variant="RN-mu", embed_dim=8, head_dim=32))
  assert isinstance(model, hcl.HclModel) and isinstance(model.image_tower, resnet.ResNet)
  hcl_def, hcl_params = registry.ModelDef.from_module(model)
  outputs, features = jax.eval_shape(
    lambda p, s, x: (hcl_def.merge(p, s)(x), hcl_def.merge(p, s).features(x)),
    hcl_params,
    hcl_def.initial_batch_stats(),
    images,
  )
  assert outputs.shape == (2, 8) and features.shape == (2, 256)
  # A ViT-only option on a ResNet fails naming the key.
  with pytest.raises(ValueError, match="model.image_ln_pre=True applies to ViT"):
    build(dict(image_variant="RN-mu", text_variant="mu", embed_dim=16, image_ln_pre=True))
  with pytest.raises(ValueError, match=r"Unknown ResNet variant 'RN34'.*'RN-mu', 'RN101'"):
    build(dict(image_variant="RN34", text_variant="mu", embed_dim=16))
  # ViT variants still build ViTs.
  vit_model = build(dict(image_variant="mu/8", text_variant="mu", embed_dim=16))
  assert not isinstance(vit_model.image_tower, resnet.ResNet)
  assert registry.ModelDef.from_module(vit_model)[0].initial_batch_stats() == {}
