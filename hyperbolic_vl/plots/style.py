"""Shared look of the figures: colours, figure creation, image panels.

Colours are from the Okabe-Ito palette, which stays distinguishable under
the common colour-vision deficiencies and in greyscale print.
"""

from __future__ import annotations

import io

import numpy as np
from matplotlib.figure import Figure

from hyperbolic_vl import files

IMAGE_COLOR = "#0072B2"  # blue
TEXT_COLOR = "#D55E00"  # vermillion
ROOT_COLOR = "#000000"
INSIDE_COLOR = "#009E73"  # bluish green
OUTSIDE_COLOR = "#999999"
# Sequences (caption tiers, box levels, curves): most general first.
SERIES_COLORS = ("#E69F00", "#56B4E9", "#009E73", "#CC79A7", "#0072B2", "#D55E00", "#F0E442")


def new_figure(width: float, height: float) -> Figure:
  """A figure outside pyplot (no global state; `savefig` works headless)."""
  return Figure(figsize=(width, height), dpi=110, layout="constrained")


def series_color(index: int) -> str:
  return SERIES_COLORS[index % len(SERIES_COLORS)]


def show_image(ax, image) -> None:
  """An (H, W, 3) uint8 or [0, 1] float image on `ax`, without ticks."""
  image = np.asarray(image)
  if np.issubdtype(image.dtype, np.floating):
    image = np.clip(image, 0.0, 1.0)
  ax.imshow(image, interpolation="nearest")
  ax.set_xticks([])
  ax.set_yticks([])


def save_png(figure: Figure, path: str) -> None:
  """Writes `figure` as a PNG, atomically (a reader never sees half a file)."""
  buffer = io.BytesIO()
  figure.savefig(buffer, format="png")
  files.write_file_atomically(path, buffer.getvalue())
