"""Views of an embedding space: the disk view, distance histograms and an
entailment cone. Positions come from `layout` (the geometry is documented
there); this module only draws them.

Drawn artists carry a `gid` ("images", "texts", "pairs", "boundary",
"cone_edges", "inside", "outside", "apex") so a caller, or a test, can find
what was drawn where.
"""

from __future__ import annotations

import textwrap
from collections.abc import Mapping, Sequence

import numpy as np
from matplotlib.collections import LineCollection
from matplotlib.patches import Circle

from hyperbolic_vl.plots import layout, style


def _disk_frame(ax, radius: float, title: str | None) -> None:
  ax.add_patch(Circle((0, 0), radius, fill=False, color="0.3", lw=1.0, gid="boundary"))
  ax.plot([0], [0], marker="+", color=style.ROOT_COLOR, ms=10, mew=1.5, gid="root")
  margin = 1.04 * radius
  ax.set_xlim(-margin, margin)
  ax.set_ylim(-margin, margin)
  ax.set_aspect("equal")
  ax.set_xticks([])
  ax.set_yticks([])
  for spine in ax.spines.values():
    spine.set_visible(False)
  if title:
    ax.set_title(title, fontsize=10)


def _write_labels(ax, xy: np.ndarray, labels: Sequence[str], count: int, radius: float) -> None:
  """Writes up to `count` labels beside their points, shortened, skipping
  points closer than a tenth of the disk's radius to one already labelled
  (overlapping labels are unreadable)."""
  placed: list[np.ndarray] = []
  for point, label in zip(xy, labels):
    if len(placed) == count:
      break
    if any(np.linalg.norm(point - other) < 0.1 * radius for other in placed):
      continue
    placed.append(point)
    ax.annotate(
      textwrap.shorten(label, 30, placeholder="..."),
      tuple(point),
      fontsize=6.5,
      xytext=(3, 3),
      textcoords="offset points",
      gid="label",
    )


def disk_view(
  space: layout.Space,
  image_emb: np.ndarray,
  text_emb: np.ndarray,
  *,
  pairs: bool = True,
  labels: Sequence[str] | None = None,
  max_labels: int = 6,
  title: str | None = None,
  ax=None,
):
  """Images and texts on the disk (Lorentz: Poincare disk; Euclidean: the
  unit sphere around [ROOT]; see `layout`), in two colours; with
  `pairs`, image i and text i are joined by a line (same N for both).
  `labels`: one per text, the first `max_labels` written beside their
  points. Draws on `ax` when given (to compose views), else a new figure;
  returns the figure."""
  image_emb, text_emb = np.asarray(image_emb), np.asarray(text_emb)
  if pairs and len(image_emb) != len(text_emb):
    raise ValueError(
      f"pairs=True needs as many images as texts, got {len(image_emb)} and {len(text_emb)}"
    )
  both = layout.disk_layout(space, np.concatenate([image_emb, text_emb]))
  image_xy, text_xy = both.xy[: len(image_emb)], both.xy[len(image_emb) :]
  figure = ax.figure if ax is not None else style.new_figure(5.2, 5.2)
  ax = ax if ax is not None else figure.add_subplot()
  _disk_frame(ax, space.boundary_radius, title)
  if pairs:
    ax.add_collection(
      LineCollection(
        np.stack([image_xy, text_xy], axis=1), colors="0.6", lw=0.5, alpha=0.6, gid="pairs"
      )
    )
  ax.scatter(*image_xy.T, s=14, color=style.IMAGE_COLOR, label="images", gid="images", zorder=3)
  ax.scatter(
    *text_xy.T, s=14, color=style.TEXT_COLOR, marker="s", label="texts", gid="texts", zorder=3
  )
  if labels is not None:
    _write_labels(ax, text_xy, labels, max_labels, space.boundary_radius)
  where = (
    "Poincare disk, radius = exact distance to the origin"
    if space.is_lorentz
    else "unit sphere around [ROOT], radius = exact angle"
  )
  ax.set_xlabel(f"{where};\ndirection: PCA of the tangent vectors", fontsize=7, color="0.35")
  ax.legend(loc="upper right", fontsize=8, frameon=False)
  return figure


def distance_histograms(
  space: layout.Space,
  groups: Mapping[str, np.ndarray],
  *,
  bins: int = 30,
  title: str | None = None,
):
  """One histogram per group of embeddings ({name: (N, D)}, e.g. "images"
  and each caption tier), stacked on a shared axis of distance to the
  origin (Lorentz) or angle to [ROOT] (Euclidean; its [ROOT], when the
  space has none, is the mean direction of all groups together). Every
  embedding is counted: the bins span [0, the largest distance]. The
  median of each group is marked and written."""
  if not groups:
    raise ValueError("distance_histograms needs at least one group")
  if not space.is_lorentz and space.root is None:
    center = layout.sphere_center(space, np.concatenate([np.asarray(g) for g in groups.values()]))
    space = layout.Space(space.geometry, None, center)
  distances = {name: layout.distance_from_center(space, emb) for name, emb in groups.items()}
  top = max(float(d.max()) for d in distances.values())
  edges = np.linspace(0.0, top if top > 0 else 1.0, bins + 1)
  figure = style.new_figure(6.0, 0.9 + 0.9 * len(groups))
  axes = figure.subplots(len(groups), 1, sharex=True, squeeze=False)[:, 0]
  for index, (ax, (name, values)) in enumerate(zip(axes, distances.items())):
    color = style.series_color(index)
    ax.hist(values, bins=edges, color=color, alpha=0.85, gid=f"hist/{name}")
    median = float(np.median(values))
    ax.axvline(median, color="0.2", lw=1.0, ls="--")
    ax.text(
      0.99,
      0.85,
      f"{name}  (n={len(values)}, median {median:.3g})",
      transform=ax.transAxes,
      ha="right",
      va="top",
      fontsize=8,
    )
    ax.set_yticks([])
    for spine in ("top", "right", "left"):
      ax.spines[spine].set_visible(False)
  axes[-1].set_xlabel(space.distance_name)
  if title:
    figure.suptitle(title, fontsize=10)
  return figure


def cone_view(
  curv: float,
  apex_emb: np.ndarray,
  point_emb: np.ndarray,
  *,
  apex_label: str | None = None,
  point_labels: Sequence[str] | None = None,
  max_labels: int = 10,
  highlight: np.ndarray | None = None,
  highlight_label: str = "highlighted",
  min_radius: float = 0.1,
  title: str | None = None,
  ax=None,
):
  """The entailment cone of `apex_emb` (D,) (a text) and `point_emb` (N, D)
  in the exact 2-D view of `layout.cone_layout`: each point at its true
  distance from the origin and true angle from the apex, green when the
  cone contains it (MERU's exterior angle <= half aperture, computed in D
  dimensions), grey when not; the cone's edges are geodesic rays.
  `highlight` (N,) bool circles some points (e.g. the images the apex's
  caption truly describes, which a good model puts inside). Returns
  the figure."""
  cone = layout.cone_layout(apex_emb, point_emb, curv, min_radius)
  figure = ax.figure if ax is not None else style.new_figure(5.2, 5.2)
  ax = ax if ax is not None else figure.add_subplot()
  _disk_frame(ax, 1.0 / np.sqrt(curv), title)
  for edge in cone.boundary:
    ax.plot(*edge.T, color=style.INSIDE_COLOR, lw=1.2, gid="cone_edges")
  for name, mask, color in (
    ("inside", cone.inside, style.INSIDE_COLOR),
    ("outside", ~cone.inside, style.OUTSIDE_COLOR),
  ):
    ax.scatter(
      *cone.xy[mask].T,
      s=16,
      color=color,
      gid=name,
      zorder=3,
      label=f"{name} the cone ({int(mask.sum())})",
    )
  ax.scatter(
    *cone.apex_xy,
    s=60,
    marker="*",
    color=style.TEXT_COLOR,
    gid="apex",
    zorder=4,
    label=apex_label or "apex",
  )
  if highlight is not None:
    highlight = np.asarray(highlight, bool)
    ax.scatter(
      *cone.xy[highlight].T,
      s=48,
      facecolors="none",
      edgecolors=style.IMAGE_COLOR,
      lw=1.0,
      gid="highlight",
      zorder=4,
      label=f"{highlight_label} ({int(highlight.sum())}, "
      f"{int((highlight & cone.inside).sum())} inside)",
    )
  if point_labels is not None:
    _write_labels(ax, cone.xy, point_labels, max_labels, 1.0 / np.sqrt(curv))
  ax.set_xlabel(
    f"half aperture {np.degrees(cone.half_aperture):.1f} deg;\n"
    "exact distances to the origin and angles from the apex",
    fontsize=7,
    color="0.35",
  )
  ax.legend(loc="upper right", fontsize=8, frameon=False)
  return figure
