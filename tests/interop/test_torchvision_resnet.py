"""torchvision / timm ResNet-50 state dicts -> our ResNet tower: the
evaluation-mode forward pass equals theirs in float64, every tensor is
accounted for, and the tower drops into a two-tower model."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import timm
import torch
import torchvision
from flax import nnx
from torch_resnets import randomize_batch_norms, torch_features

from hyperbolic_vl.interop import common, torchvision_resnet
from hyperbolic_vl.models import registry, resnet


def test_torchvision_and_timm_resnet50_match_in_float64():
  images = np.random.default_rng(0).uniform(size=(2, 64, 64, 3))
  references = {
    "torchvision": randomize_batch_norms(torchvision.models.resnet50(), seed=0),
    "timm": randomize_batch_norms(timm.create_model("resnet50", pretrained=False), seed=1),
  }
  with jax.enable_x64(True):
    module = nnx.eval_shape(
      lambda: resnet.ResNet(
        "RN50", 64, dtype=jnp.float64, param_dtype=jnp.float64, rngs=nnx.Rngs(0)
      )
    )
    model_def = registry.ModelDef.from_module(module)[0]
    forward = jax.jit(lambda p, s, x: model_def.merge(p, s)(x))
    to64 = lambda tree: jax.tree.map(lambda x: jnp.asarray(x, jnp.float64), tree)
    worst = {}
    for name, reference in references.items():
      params, stats = torchvision_resnet.tower_variables(reference.state_dict(), "RN50")
      ours = np.asarray(forward(to64(params), to64(stats), images))
      with torch.no_grad():
        expected = torch_features(reference.double().eval(), images)
      worst[name] = float(np.max(np.abs(ours - expected)))
      scale = float(np.max(np.abs(expected)))
      print(
        f"RN50 from {name}, eval mode, float64: max |ours - torch| {worst[name]:.2e} of {scale:.1f}"
      )
      # float64 on both sides; summation order alone differs through ~50
      # layers: 1e-10 relative leaves ~1e5 of headroom over rounding.
      assert worst[name] <= 1e-10 * scale
  # The two references differ (different draws), so neither comparison is vacuous.
  assert not np.allclose(
    references["torchvision"].state_dict()["bn1.running_mean"].numpy(),
    references["timm"].state_dict()["bn1.running_mean"].numpy(),
  )


def test_every_tensor_is_accounted_for():
  state = torchvision.models.resnet50().state_dict()
  # fc is the ImageNet classifier: dropped, and reported as ignored.
  module = nnx.eval_shape(lambda: resnet.ResNet("RN50", 224, rngs=nnx.Rngs(0)))
  template = nnx.to_pure_dict(nnx.state(module, nnx.Any(nnx.Param, nnx.BatchStat)))
  conversion = torchvision_resnet.convert(
    {n: t.numpy() for n, t in state.items()},
    common.flat_param_shapes({"t": template}),
    tower="t",
  )
  flat, ignored = conversion.finish()
  assert ignored == ["fc.bias", "fc.weight"]
  assert len(flat) == sum(not n.endswith("num_batches_tracked") for n in state) - 2
  # The same tensors under a wrapper's prefix convert alike.
  plain = torchvision_resnet.tower_variables(state, "RN50")
  prefixed = torchvision_resnet.tower_variables(
    {f"backbone.{n}": t for n, t in state.items()}, "RN50", prefix="backbone."
  )
  for a, b in zip(jax.tree.leaves(plain), jax.tree.leaves(prefixed)):
    np.testing.assert_array_equal(a, b)
  # A missing tensor, a wrong variant and an unknown tensor each fail naming it.
  missing = dict(state)
  del missing["layer3.5.bn2.running_var"]
  with pytest.raises(common.ConversionError, match=r"layer3\.5\.bn2\.running_var"):
    torchvision_resnet.tower_variables(missing, "RN50")
  with pytest.raises(common.ConversionError, match=r"layer3\.6\.conv1\.weight"):
    torchvision_resnet.tower_variables(state, "RN101")
  with pytest.raises(common.ConversionError, match="left unused: extra.weight"):
    torchvision_resnet.tower_variables({**state, "extra.weight": torch.zeros(1)}, "RN50")


def test_into_model_replaces_only_the_image_tower():
  module = nnx.eval_shape(
    lambda: registry.build(
      dict(image_variant="RN50", text_variant="mu", embed_dim=16),
      image_size=64,
      vocab_size=40,
      context_length=8,
      rngs=nnx.Rngs(0),
    )
  )
  model_def = registry.ModelDef.from_module(module)[0]
  fresh = jax.tree.map(
    lambda s: np.full(s.shape, 7.0, s.dtype), nnx.to_pure_dict(model_def.param_template)
  )
  fresh_stats = jax.tree.map(
    lambda s: np.full(s.shape, 7.0, s.dtype), model_def.initial_batch_stats()
  )
  state = randomize_batch_norms(torchvision.models.resnet50(), seed=2).state_dict()
  params, stats = torchvision_resnet.into_model(model_def, fresh, fresh_stats, state)
  expected_params, expected_stats = torchvision_resnet.tower_variables(state, "RN50")
  for ours, theirs in (
    (params["image_tower"], expected_params),
    (stats["image_tower"], expected_stats),
  ):
    assert jax.tree.structure(ours) == jax.tree.structure(theirs)
    for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(theirs)):
      np.testing.assert_array_equal(a, b)
  # Everything else is as it was.
  assert set(params) == set(fresh) and set(stats) == {"image_tower"}
  for name in set(params) - {"image_tower"}:
    assert all(np.all(np.asarray(x) == 7.0) for x in jax.tree.leaves(params[name]))
