"""Walks through the embedding space, drawn: traversal strips (MERU Sec. 3.3:
an image, then the texts met on the way to [ROOT]) and interpolations (the
geodesic between two images, with the nearest text and image at each step).

The walks themselves are computed in `evaluators.metrics.traversal`; here
they are laid out. Every caption drawn is its own text artist with a `gid`
("walk/<model>/<row>/<k>", "step_text/<k>", "step_image/<k>"), so a caller
or a test can read back what the figure shows, in order.
"""

from __future__ import annotations

import textwrap
from collections.abc import Mapping, Sequence

import numpy as np

from hyperbolic_vl.evaluators.metrics import traversal
from hyperbolic_vl.plots import layout, style

ARROW = "\u2193"  # a downward arrow between consecutive texts of a walk


def traversal_strips(
  images: Sequence[np.ndarray],
  walks: Mapping[str, Sequence[Sequence[str]]],
  *,
  image_titles: Sequence[str] | None = None,
  wrap: int = 34,
):
  """One row per image: the image, then, per model ({model: one walk per
  image}), the texts its traversal met from the image (top) to [ROOT]
  (bottom, bold). Models side by side (e.g. {"MERU": ..., "CLIP": ...}).
  Returns the figure."""
  if not len(images):
    raise ValueError("traversal_strips needs at least one image")
  for model, model_walks in walks.items():
    if len(model_walks) != len(images):
      raise ValueError(f"{model}: {len(model_walks)} walks for {len(images)} images")
  longest = max((len(walk) for model_walks in walks.values() for walk in model_walks), default=1)
  row_height = max(1.5, 0.34 * longest)
  figure = style.new_figure(1.6 + 2.9 * len(walks), row_height * len(images) + 0.3)
  grid = figure.add_gridspec(len(images), 1 + len(walks), width_ratios=[1.0] + [2.0] * len(walks))
  for row, image in enumerate(images):
    image_ax = figure.add_subplot(grid[row, 0])
    style.show_image(image_ax, image)
    if image_titles is not None:
      image_ax.set_title(textwrap.fill(image_titles[row], 28), fontsize=7)
    for column, (model, model_walks) in enumerate(walks.items(), start=1):
      ax = figure.add_subplot(grid[row, column])
      ax.axis("off")
      if row == 0:
        ax.set_title(model, fontsize=10, fontweight="bold")
      walk = list(model_walks[row])
      # Texts and arrows alternate down the cell, the image's end at the top,
      # at one spacing for every cell (that of the longest walk).
      slots = max(2 * longest - 1, 1)
      for k, text in enumerate(walk):
        y = 1.0 - (2 * k + 0.5) / slots
        ax.text(
          0.02,
          y,
          textwrap.shorten(text, wrap, placeholder="..."),
          fontsize=8,
          va="center",
          transform=ax.transAxes,
          gid=f"walk/{model}/{row}/{k}",
          fontweight="bold" if text == traversal.ROOT else "normal",
        )
        if k + 1 < len(walk):
          ax.text(
            0.06,
            1.0 - (2 * k + 1.5) / slots,
            ARROW,
            fontsize=7,
            color="0.5",
            va="center",
            transform=ax.transAxes,
          )
  return figure


def read_walk(figure, model: str, row: int) -> list[str]:
  """The texts `traversal_strips` drew for (model, row), top to bottom, as
  drawn (shortened to the strip's width)."""
  found = []
  for ax in figure.axes:
    for text in ax.texts:
      gid = text.get_gid() or ""
      if gid.startswith(f"walk/{model}/{row}/"):
        found.append((-text.get_position()[1], text.get_text()))
  return [text for _, text in sorted(found)]


def interpolation_strip(
  space: layout.Space,
  start_emb: np.ndarray,
  end_emb: np.ndarray,
  *,
  texts: Sequence[str],
  text_emb: np.ndarray,
  images: np.ndarray,
  image_emb: np.ndarray,
  steps: int = 8,
  wrap: int = 16,
  title: str | None = None,
):
  """The geodesic from `start_emb` to `end_emb` (two images' embeddings) in
  `steps` equal parts; under each step, the nearest image of `images` (by
  geodesic distance, or cosine for Euclidean models) and the nearest text
  of `texts`. Returns the figure; `figure.nearest` holds the indices drawn
  ({"text": (steps,), "image": (steps,)})."""
  nearest = layout.interpolation(
    space, start_emb, end_emb, steps, {"text": np.asarray(text_emb), "image": np.asarray(image_emb)}
  )
  figure = style.new_figure(1.25 * steps, 2.6)
  axes = figure.subplots(2, steps, squeeze=False, height_ratios=[1.0, 0.75])
  for k in range(steps):
    image_ax, text_ax = axes[0, k], axes[1, k]
    style.show_image(image_ax, images[nearest["image"][k]])
    image_ax.images[-1].set_gid(f"step_image/{k}")
    image_ax.set_title(f"t = {k / max(steps - 1, 1):.2f}", fontsize=7)
    text_ax.axis("off")
    text_ax.text(
      0.5,
      0.95,
      textwrap.fill(texts[nearest["text"][k]], wrap),
      fontsize=7,
      ha="center",
      va="top",
      transform=text_ax.transAxes,
      gid=f"step_text/{k}",
    )
  if title:
    figure.suptitle(title, fontsize=10)
  figure.nearest = nearest
  return figure
