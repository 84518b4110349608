"""torchvision / timm ResNet state dicts -> a ResNet tower (models/resnet.py).

Both libraries name a ResNet-50's tensors alike: `conv1.weight`,
`bn1.{weight,bias,running_mean,running_var,num_batches_tracked}`,
`layerS.B.{conv1,bn1,conv2,bn2,conv3,bn3}.*`, the shortcut
`layerS.0.downsample.0.weight` (1x1 conv) and `layerS.0.downsample.1.*`
(its batch norm), and the classifier `fc.{weight,bias}`. The tower keeps
torchvision's names, so the conversion is a renaming plus the conv layout
(O, I, kh, kw) -> (kh, kw, I, O); a batch norm's `weight`/`bias` are the
params `scale`/`bias`, its `running_mean`/`running_var` the running
statistics `mean`/`var` (state["batch_stats"]). `num_batches_tracked` is
checked to be a count and dropped (momentum is fixed here), and so is the
ImageNet classifier `fc` (reported as ignored).

    params, batch_stats = tower_variables(torchvision.models.resnet50().state_dict(), "RN50")
    params, batch_stats = into_model(model_def, params, batch_stats, state_dict)
"""

from __future__ import annotations

from collections.abc import Mapping

import jax
import numpy as np
from flax import nnx

from hyperbolic_vl.interop import common
from hyperbolic_vl.models import resnet

# The ImageNet classifier: no place in an image tower.
CLASSIFIER = (r"fc\.weight", r"fc\.bias")
_NORMS = (("scale", "weight"), ("bias", "bias"), ("mean", "running_mean"), ("var", "running_var"))


def _fill_norm(conv: common.Conversion, target: str, source: str) -> None:
  for ours, theirs in _NORMS:
    conv.put(f"{target}/{ours}", f"{source}.{theirs}")
  tracked = f"{source}.num_batches_tracked"
  if conv.has(tracked):
    conv.check(tracked, lambda v: np.asarray(v).size == 1, "expected a scalar count")


def convert(
  source: Mapping[str, np.ndarray],
  target_shapes: Mapping[str, tuple[int, ...]],
  *,
  tower: str = "image_tower",
  prefix: str = "",
  extra_ignored: tuple[str, ...] = (),
) -> common.Conversion:
  """Fills the ResNet tower `tower` of a flat {name: shape} of a model's
  params AND running statistics (`ModelDef.variables`) from the source
  tensors named `prefix` + torchvision's names."""
  ignored = tuple(f"{prefix}{name}" for name in CLASSIFIER) + tuple(extra_ignored)
  conv = common.Conversion(source, target_shapes, ignorable=ignored)
  conv.put(f"{tower}/conv1/kernel", f"{prefix}conv1.weight", common.conv_kernel)
  _fill_norm(conv, f"{tower}/bn1", f"{prefix}bn1")
  for stage in range(1, 5):
    name = f"layer{stage}"
    blocks = max(
      common.count_blocks(source, f"{prefix}{name}"),
      _count_target_blocks(target_shapes, f"{tower}/{name}"),
    )
    for block in range(blocks):
      target, theirs = f"{tower}/{name}/{block}", f"{prefix}{name}.{block}"
      for i in (1, 2, 3):
        conv.put(f"{target}/conv{i}/kernel", f"{theirs}.conv{i}.weight", common.conv_kernel)
        _fill_norm(conv, f"{target}/bn{i}", f"{theirs}.bn{i}")
      if conv.has(f"{theirs}.downsample.0.weight") or (
        f"{target}/downsample_conv/kernel" in target_shapes
      ):
        conv.put(
          f"{target}/downsample_conv/kernel", f"{theirs}.downsample.0.weight", common.conv_kernel
        )
        _fill_norm(conv, f"{target}/downsample_norm", f"{theirs}.downsample.1")
  return conv


def _count_target_blocks(target_shapes: Mapping[str, tuple], stage: str) -> int:
  prefix = stage + "/"
  found = {
    int(name[len(prefix) :].split("/")[0]) for name in target_shapes if name.startswith(prefix)
  }
  return max(found) + 1 if found else 0


def _split(variables: dict) -> tuple[dict, dict]:
  """(params, running statistics) of a ResNet tower's nested variables."""
  stat_names = {"mean", "var"}

  def visit(tree, want_stats):
    out = {}
    for key, value in tree.items():
      if isinstance(value, dict):
        sub = visit(value, want_stats)
        if sub:
          out[key] = sub
      elif (key in stat_names) == want_stats:
        out[key] = value
    return out

  return visit(variables, False), visit(variables, True)


def tower_variables(
  state_dict: Mapping, variant: str = "RN50", *, prefix: str = ""
) -> tuple[dict, dict]:
  """(params, batch_stats) of a standalone `resnet.ResNet(variant)` from a
  torchvision or timm state dict (torch tensors or numpy arrays); raises
  `common.ConversionError` naming what does not fit."""
  source = {name: common._to_numpy(value) for name, value in state_dict.items()}  # noqa: SLF001
  module = nnx.eval_shape(lambda: resnet.ResNet(variant, 224, rngs=nnx.Rngs(0)))
  template = nnx.to_pure_dict(nnx.state(module, nnx.Any(nnx.Param, nnx.BatchStat)))
  conversion = convert(
    source, common.flat_param_shapes({"tower": template}), tower="tower", prefix=prefix
  )
  flat, _ = conversion.finish()
  return _split(common.unflatten(flat, {"tower": template})["tower"])


def into_model(
  model_def,
  params: dict,
  batch_stats: dict,
  state_dict: Mapping,
  *,
  tower: str = "image_tower",
  prefix: str = "",
) -> tuple[dict, dict]:
  """A model's (params, batch_stats) with its ResNet tower `tower` replaced
  by a torchvision/timm state dict's weights (every other entry kept):
  an ImageNet backbone under a fresh two-tower or HCL model."""
  source = {name: common._to_numpy(value) for name, value in state_dict.items()}  # noqa: SLF001
  variables = model_def.variables(params, batch_stats)
  shapes = common.flat_param_shapes(variables)
  tower_shapes = {name: shape for name, shape in shapes.items() if name.startswith(tower + "/")}
  flat, _ = convert(source, tower_shapes, tower=tower, prefix=prefix).finish()
  filled = common.unflatten(flat, {tower: variables[tower]})[tower]
  dtypes = jax.tree.map(lambda x: x.dtype, variables[tower])
  filled = jax.tree.map(lambda x, dtype: np.asarray(x, dtype), filled, dtypes)
  return model_def.split_variables({**variables, tower: filled})
