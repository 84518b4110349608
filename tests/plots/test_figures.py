"""The figures draw what the layout computes: read back from the drawn
artists, points sit at their exact radii, pairs join the right points,
histograms count every embedding, traversal strips list the walk in order
down to [ROOT], interpolations show the nearest texts and images, training
curves plot the logged values."""

import json

import numpy as np
import pytest

pytest.importorskip("matplotlib")

from hyperbolic_vl import plots  # noqa: E402
from hyperbolic_vl.evaluators.metrics import traversal  # noqa: E402
from hyperbolic_vl.plots import layout, style, walk_views  # noqa: E402

CURV = 0.8


def artist(ax_or_figure, gid):
  axes = getattr(ax_or_figure, "axes", [ax_or_figure])
  for ax in axes:
    for child in ax.get_children():
      if child.get_gid() == gid:
        return child
  raise AssertionError(f"no artist {gid!r}")


def points_at(distances, rng, dim=6):
  directions = rng.normal(size=(len(distances), dim))
  directions /= np.linalg.norm(directions, axis=1, keepdims=True)
  return (np.sinh(np.sqrt(CURV) * distances) / np.sqrt(CURV))[:, None] * directions


def test_disk_view_draws_exact_radii_and_joins_each_pair():
  rng = np.random.default_rng(0)
  image_d, text_d = rng.uniform(1.0, 3.0, 12), rng.uniform(0.1, 1.0, 12)
  images, texts = points_at(image_d, rng), points_at(text_d, rng)
  figure = plots.disk_view(layout.Space("lorentz", CURV), images, texts, labels=["t"] * 12)
  image_xy = artist(figure, "images").get_offsets()
  text_xy = artist(figure, "texts").get_offsets()
  radius = lambda d: np.tanh(np.sqrt(CURV) * d / 2) / np.sqrt(CURV)  # noqa: E731
  np.testing.assert_allclose(np.linalg.norm(image_xy, axis=1), radius(image_d), rtol=1e-12)
  np.testing.assert_allclose(np.linalg.norm(text_xy, axis=1), radius(text_d), rtol=1e-12)
  segments = artist(figure, "pairs").get_segments()
  assert len(segments) == 12
  for i, segment in enumerate(segments):
    np.testing.assert_array_equal(segment, [image_xy[i], text_xy[i]])
  assert artist(figure, "boundary").get_radius() == pytest.approx(1 / np.sqrt(CURV))
  with pytest.raises(ValueError, match="as many images as texts"):
    plots.disk_view(layout.Space("lorentz", CURV), images, texts[:5])


def test_clip_disk_view_draws_angles_to_root_inside_pi():
  rng = np.random.default_rng(1)
  images, texts = rng.normal(size=(2, 10, 5))
  root = traversal.clip_root(images, texts)
  figure = plots.disk_view(layout.Space("euclidean", None, root), images, texts)
  unit = lambda x: x / np.linalg.norm(x, axis=1, keepdims=True)  # noqa: E731
  expected = np.arccos(np.clip(unit(images) @ root, -1, 1))
  drawn = np.linalg.norm(artist(figure, "images").get_offsets(), axis=1)
  np.testing.assert_allclose(drawn, expected, rtol=1e-6)  # root is float32 (clip_root)
  assert artist(figure, "boundary").get_radius() == pytest.approx(np.pi)


def test_histograms_count_every_embedding_in_every_group():
  rng = np.random.default_rng(2)
  groups = {
    "images": points_at(rng.uniform(0, 4, 37), rng),
    "tier 1": points_at(rng.uniform(0, 1, 23), rng),
  }
  figure = plots.distance_histograms(layout.Space("lorentz", CURV), groups, bins=15)
  assert len(figure.axes) == 2
  for ax, (name, embeddings) in zip(figure.axes, groups.items()):
    bars = ax.patches
    heights = [bar.get_height() for bar in bars]
    assert sum(heights) == len(embeddings), name  # the farthest point included
    assert len(bars) == 15
    assert any(f"n={len(embeddings)}" in text.get_text() for text in ax.texts)


def test_traversal_strip_lists_each_walk_in_order_ending_at_root():
  rng = np.random.default_rng(3)
  pool = [f"caption {i}" for i in range(25)]
  image_emb = rng.normal(size=(3, 6)) * 1.5
  # Texts on the way from the origin to the images: inside their cones.
  text_emb = image_emb[np.arange(25) % 3] * np.linspace(0.05, 0.9, 25)[:, None]
  text_emb += 0.01 * rng.normal(size=text_emb.shape)
  walks = {
    "MERU": [
      traversal.traverse(image_emb[i], text_emb, pool, geometry="lorentz", curv=CURV)
      for i in range(3)
    ],
    "CLIP": [
      traversal.traverse(image_emb[i], text_emb, pool, geometry="euclidean") for i in range(3)
    ],
  }
  images = rng.integers(0, 256, size=(3, 8, 8, 3), dtype=np.uint8)
  figure = plots.traversal_strips(images, walks)
  for model, model_walks in walks.items():
    for row, walk in enumerate(model_walks):
      drawn = walk_views.read_walk(figure, model, row)
      assert drawn == walk and drawn[-1] == traversal.ROOT
      assert len(set(drawn)) == len(drawn)
  assert sum(1 for walk in walks["MERU"] if len(walk) > 1) >= 1  # not only [ROOT]
  with pytest.raises(ValueError, match="2 walks for 3 images"):
    plots.traversal_strips(images, {"MERU": walks["MERU"][:2]})


def test_interpolation_strip_shows_the_nearest_text_and_image_at_each_step():
  rng = np.random.default_rng(4)
  image_emb = rng.normal(size=(10, 5))
  text_emb = rng.normal(size=(15, 5))
  texts = [f"text {i}" for i in range(15)]
  images = rng.integers(0, 256, size=(10, 6, 6, 3), dtype=np.uint8)
  space = layout.Space("lorentz", CURV)
  figure = plots.interpolation_strip(
    space,
    image_emb[0],
    image_emb[1],
    texts=texts,
    text_emb=text_emb,
    images=images,
    image_emb=image_emb,
    steps=6,
  )
  expected = layout.interpolation(
    space, image_emb[0], image_emb[1], 6, {"text": text_emb, "image": image_emb}
  )
  assert expected["image"][0] == 0 and expected["image"][-1] == 1  # the endpoints themselves
  for k in range(6):
    assert artist(figure, f"step_text/{k}").get_text() == texts[expected["text"][k]]
    np.testing.assert_array_equal(
      artist(figure, f"step_image/{k}").get_array(), images[expected["image"][k]]
    )


def test_cone_view_colours_members_and_circles_highlights():
  rng = np.random.default_rng(5)
  apex = points_at(np.array([0.7]), rng)[0]
  points = points_at(rng.uniform(0.5, 3.0, 30), rng) + 0.5 * apex
  cone = layout.cone_layout(apex, points, CURV)
  highlight = np.arange(30) % 3 == 0
  figure = plots.cone_view(CURV, apex, points, highlight=highlight, highlight_label="h")
  assert len(artist(figure, "inside").get_offsets()) == cone.inside.sum()
  assert len(artist(figure, "outside").get_offsets()) == (~cone.inside).sum()
  np.testing.assert_allclose(artist(figure, "highlight").get_offsets(), cone.xy[highlight])
  legend = [t.get_text() for t in figure.axes[0].get_legend().get_texts()]
  assert f"h (10, {int((highlight & cone.inside).sum())} inside)" in legend


def test_training_curves_plot_the_logged_values(tmp_path):
  records = [
    {
      "step": 10,
      "train/loss": 3.0,
      "train/loss/entailment": 0.5,
      "train/curv": 1.0,
      "train/steps_per_sec": 9.0,
      "train/loss/entailment/box_text": 0.125,  # a sub-term (HyCoCLIP's kind)
    },
    {"step": 20, "train/loss": 2.0, "train/loss/entailment": "nan", "train/curv": 0.9},
    {
      "step": 30,
      "train/loss": 1.5,
      "train/loss/entailment": 0.25,
      "train/curv": 0.8,
      "eval/i2t_recall@5": 0.5,
      "eval/zero_shot_accuracy": 0.25,
    },
    # A finished run started again re-evaluates its last step: latest kept.
    {"step": 30, "eval/i2t_recall@5": 0.6},
  ]
  path = tmp_path / "metrics.jsonl"
  path.write_text("".join(json.dumps(r) + "\n" for r in records))
  figure = plots.training_curves(tmp_path)
  loss = artist(figure, "train/loss")
  np.testing.assert_array_equal(loss.get_xdata(), [10, 20, 30])
  np.testing.assert_array_equal(loss.get_ydata(), [3.0, 2.0, 1.5])
  entailment = artist(figure, "train/loss/entailment").get_ydata()
  assert entailment[0] == 0.5 and np.isnan(entailment[1]) and entailment[2] == 0.25
  np.testing.assert_array_equal(artist(figure, "train/curv").get_ydata(), [1.0, 0.9, 0.8])
  # Evaluated once: bars of the final values.
  assert artist(figure, "eval/i2t_recall@5").get_width() == 0.6
  assert artist(figure, "eval/zero_shot_accuracy").get_width() == 0.25
  with pytest.raises(AssertionError):
    artist(figure, "train/steps_per_sec")  # throughput is not a training curve
  titles = [ax.get_title() for ax in figure.axes if ax.get_title()]
  assert titles == ["loss terms", "loss sub-terms", "curvature", "evaluation"]
  np.testing.assert_array_equal(
    artist(figure, "train/loss/entailment/box_text").get_ydata(), [0.125]
  )
  path.write_text(json.dumps({"step": 1, "train/steps_per_sec": 3.0}) + "\n")
  with pytest.raises(ValueError, match="no training or evaluation metrics"):
    plots.training_curves(path)


def test_save_png_writes_a_whole_png(tmp_path):
  figure = plots.distance_histograms(
    layout.Space("lorentz", CURV), {"a": points_at(np.array([0.5, 1.0]), np.random.default_rng(6))}
  )
  path = tmp_path / "sub" / "h.png"
  style.save_png(figure, str(path))
  data = path.read_bytes()
  assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 1000
  assert [p.name for p in path.parent.iterdir()] == ["h.png"]  # no temporary left
