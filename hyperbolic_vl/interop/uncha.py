"""UNCHA's released checkpoints (`hayeonkim/uncha`: `uncha_vit_s.pth`,
`uncha_vit_b.pth`) -> params of `configs/uncha.py`'s model.

UNCHA's model subclasses MERU's, so its state dict is MERU's layout
(`interop/meru.py`, the table used here) plus:

  global_logit_scale        s_g, our `log_logit_scale` (the loss's whole-image scale)
  local_logit_scale         s_l, our `log_logit_scale_local`
  global_local_logit_scale  s_gl, our `log_logit_scale_global_local`
  logit_scale               MERU's scale, which UNCHA's loss never reads
  textual.min_radius_head.0.{weight,bias}
                            a Linear(text width, 1) + Softplus the text
                            encoder builds and nothing calls

The two unused entries are checked for the release's shapes (a file of
another layout is refused, not half-read), dropped, and reported as ignored.
All three scales are stored in log space, as our params. Export
(`python -m hyperbolic_vl.export --format=uncha`) writes a run back in this
layout, the unused entries filled as an untrained release's are (MERU's
scale at log(1/0.07), the head at zero), so that `--source=uncha` reads it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from hyperbolic_vl.interop import common, meru

# (our param, the release's tensor): the three learned log-scales.
SCALES = (
  ("log_logit_scale", "global_logit_scale"),
  ("log_logit_scale_local", "local_logit_scale"),
  ("log_logit_scale_global_local", "global_local_logit_scale"),
)
UNUSED_SCALE = "logit_scale"
UNUSED_HEAD = ("textual.min_radius_head.0.weight", "textual.min_radius_head.0.bias")
# What an export writes for the unused scale: MERU's initial log(1 / 0.07).
UNUSED_SCALE_VALUE = math.log(1 / 0.07)


def table(
  target_shapes: Mapping[str, tuple[int, ...]],
  *,
  pixel_stats: str,
  source: Mapping[str, np.ndarray] | None = None,
  fixed_curv: float | None = None,
  image_size: int | None = None,
) -> list[common.Entry]:
  """MERU's table with the whole-image scale read from `global_logit_scale`,
  the two further scales, and checks of the unused scale and head (their
  values when exporting). `fixed_curv`, `image_size`: as `meru.table`."""
  source = source or {}
  entries = [
    entry
    for entry in meru.table(
      target_shapes,
      pixel_stats=pixel_stats,
      source=source,
      fixed_curv=fixed_curv,
      image_size=image_size,
    )
    if not (isinstance(entry, common.Param) and entry.ours == "log_logit_scale")
  ]
  entries += [common.Param(ours, theirs, common.SCALAR) for ours, theirs in SCALES]
  width = target_shapes.get("text_tower/norm/scale", (None,))[0]
  entries.append(
    common.Buffer(
      UNUSED_SCALE,
      lambda value: np.size(value) == 1 and np.isfinite(value).all(),
      "UNCHA's unused logit_scale is not a finite scalar",
      value=lambda: np.asarray(UNUSED_SCALE_VALUE, np.float32),
      required=True,
    )
  )
  entries.append(
    common.Buffer(
      UNUSED_HEAD[0],
      lambda value: tuple(np.shape(value)) == (1, width),
      f"UNCHA's min-radius head should be a Linear({width}, 1) weight",
      value=lambda: np.zeros((1, width), np.float32),
      required=True,
    )
  )
  entries.append(
    common.Buffer(
      UNUSED_HEAD[1],
      lambda value: tuple(np.shape(value)) == (1,),
      "UNCHA's min-radius head bias should have shape (1,)",
      value=lambda: np.zeros((1,), np.float32),
      required=True,
    )
  )
  return entries


def export(
  flat_params: Mapping[str, np.ndarray],
  *,
  pixel_stats: str,
  image_size: int,
  fixed_curv: float | None = None,
) -> dict[str, np.ndarray]:
  """UNCHA's state dict ({name: array}, buffers and unused entries included)
  of our flat params."""
  shapes = {name: tuple(np.shape(value)) for name, value in flat_params.items()}
  entries = table(shapes, pixel_stats=pixel_stats, fixed_curv=fixed_curv, image_size=image_size)
  return common.export_tensors(entries, flat_params)


def convert(
  source: Mapping[str, np.ndarray],
  target_shapes: Mapping[str, tuple[int, ...]],
  *,
  pixel_stats: str,
  extra_ignored: tuple[str, ...] = (),
) -> tuple[dict[str, np.ndarray], list[str]]:
  """(flat params, ignored source names). The unused scale and head count as
  ignored (checked by the table, then listed) besides `extra_ignored`."""
  conversion = common.Conversion(source, target_shapes, ignorable=extra_ignored)
  conversion.apply(table(target_shapes, pixel_stats=pixel_stats, source=source))
  params, ignored = conversion.finish()
  unused = [name for name in (UNUSED_SCALE, *UNUSED_HEAD) if name in source]
  return params, sorted({*ignored, *unused})
