"""HySAC's safety view: safe and unsafe images and texts on the Poincare disk
with the radius bounds of each modality as circles, and traversal to safety
as arrows from unsafe queries to where the traversal moves them.

Positions are `layout.disk_layout`'s (exact distance to the origin as the
radius, direction from the tangent vectors' PCA over all four sets, one
frame for all). A bound b is a distance to the origin, drawn as the circle
of that distance; a traversed query is drawn where the release's traversal
puts it (hyperbolic_vl/evaluators/metrics/safety.py: its space norm set to b', so its
distance is asinh(sqrt(c) b') / sqrt(c)).

Artists carry gids: "<key>" per point set (image, text, unsafe_image,
unsafe_text), "bound/<letter>" per circle, "traversal" for the arrows.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from matplotlib.collections import LineCollection
from matplotlib.patches import Circle

from hyperbolic_vl.evaluators.metrics import safety
from hyperbolic_vl.plots import layout, style
from hyperbolic_vl.plots.embedding_views import _disk_frame

# key -> (legend, colour index, marker); safe filled, unsafe hollow-ish.
SETS = {
  "image": ("safe images (V)", 0, "o"),
  "text": ("safe texts (S)", 1, "s"),
  "unsafe_image": ("unsafe images (G)", 2, "o"),
  "unsafe_text": ("unsafe texts (U)", 3, "s"),
}


def safety_view(
  space: layout.Space,
  embeddings: Mapping[str, np.ndarray],
  bounds: Mapping | None = None,
  *,
  statistic: str = "up_95",
  traverse: str | None = "unsafe_text",
  traversal_bound: str = "S",
  alpha: float = safety.DEFAULT_ALPHA,
  title: str | None = None,
  zoom: bool = True,
  ax=None,
):
  """Draws the sets of `embeddings` (keys of SETS) and, given `bounds` (the
  hysac_bounds.json layout), each modality's `statistic` as a circle; with
  `traverse`, arrows from that set's points to their traversal beyond the
  `traversal_bound` modality's bound. `zoom` frames the drawn points (a
  small model's embeddings sit near the origin) instead of the whole disk.
  Returns the figure."""
  if not space.is_lorentz:
    raise ValueError("the safety view draws a Lorentz model's embeddings")
  keys = [key for key in SETS if key in embeddings]
  if not keys:
    raise ValueError(f"no embeddings to draw; keys: {list(SETS)}")
  arrays = [np.asarray(embeddings[key], np.float64) for key in keys]
  moved = None
  if traverse and bounds is not None and traverse in embeddings:
    bound = safety.check_bounds(bounds)[traversal_bound][statistic]
    moved = safety.traverse(embeddings[traverse], bound, space.curv, alpha=alpha)
    arrays.append(moved)
  frame = layout.disk_layout(space, np.concatenate(arrays))
  figure = ax.figure if ax is not None else style.new_figure(5.6, 5.6)
  ax = ax if ax is not None else figure.add_subplot()
  _disk_frame(ax, space.boundary_radius, title)
  start = 0
  positions = {}
  for key, array in zip(keys, arrays):
    positions[key] = frame.xy[start : start + len(array)]
    start += len(array)
    label, colour, marker = SETS[key]
    unsafe = key.startswith("unsafe")
    ax.scatter(
      *positions[key].T,
      s=14,
      marker=marker,
      facecolors="none" if unsafe else style.series_color(colour),
      edgecolors=style.series_color(colour),
      linewidths=0.9,
      label=label,
      gid=key,
      zorder=3,
    )
  if moved is not None:
    moved_xy = frame.xy[start:]
    ax.add_collection(
      LineCollection(
        np.stack([positions[traverse], moved_xy], axis=1),
        colors="0.35",
        lw=0.6,
        alpha=0.7,
        gid="traversal",
      )
    )
    ax.scatter(*moved_xy.T, s=8, color="0.25", marker="x", label="traversed", zorder=4)
  if bounds is not None:
    checked = safety.check_bounds(bounds)
    for letter, (_, colour, _) in zip("VSGU", SETS.values()):
      radius = float(layout.disk_radius(space, checked[letter][statistic]))
      ax.add_patch(
        Circle(
          (0, 0),
          radius,
          fill=False,
          ls="--",
          lw=0.9,
          color=style.series_color(colour),
          gid=f"bound/{letter}",
        )
      )
  if zoom:
    extent = 1.15 * float(np.max(np.linalg.norm(frame.xy, axis=1)))
    ax.set_xlim(-extent, extent)
    ax.set_ylim(-extent, extent)
  ax.set_xlabel(
    f"Poincare disk{' (zoomed)' if zoom else ''}, radius = exact distance to the origin; dashed: {statistic} bounds",
    fontsize=7,
    color="0.35",
  )
  ax.legend(loc="upper right", fontsize=7, frameon=False)
  return figure
