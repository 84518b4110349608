"""HySAC's safety view draws each set at its exact radius, each bound as the
circle of that distance, and traversal arrows ending where the release's
traversal puts the queries."""

import numpy as np
import pytest

pytest.importorskip("matplotlib")

from hyperbolic_vl import plots  # noqa: E402
from hyperbolic_vl.evaluators.metrics import safety  # noqa: E402
from hyperbolic_vl.plots import layout  # noqa: E402

CURV = 0.8


def artist(figure, gid):
  for child in figure.axes[0].get_children():
    if child.get_gid() == gid:
      return child
  raise AssertionError(f"no artist {gid!r}")


def disk(distance):
  """Drawn radius of a distance on the disk of curvature CURV (hand formula)."""
  return np.tanh(np.sqrt(CURV) * distance / 2) / np.sqrt(CURV)


def test_sets_bounds_and_traversal_are_drawn_at_their_exact_radii():
  rng = np.random.default_rng(0)
  directions = rng.normal(size=(4, 5))
  directions /= np.linalg.norm(directions, axis=1, keepdims=True)
  norms = {"image": 0.4, "text": 0.3, "unsafe_image": 1.5, "unsafe_text": 1.2}
  embeddings = {key: norm * directions for key, norm in norms.items()}
  bounds = {letter: {"up_95": 0.5 + i, "low_05": 0.2, "avg": 0.4} for i, letter in
            enumerate("VSGU")}  # fmt: skip
  space = layout.Space("lorentz", CURV)
  figure = plots.safety_view(space, embeddings, bounds, alpha=5.0)
  for key, norm in norms.items():
    radii = np.linalg.norm(artist(figure, key).get_offsets(), axis=1)
    np.testing.assert_allclose(radii, disk(np.arcsinh(np.sqrt(CURV) * norm) / np.sqrt(CURV)))
  for i, letter in enumerate("VSGU"):
    assert artist(figure, f"bound/{letter}").get_radius() == pytest.approx(disk(0.5 + i))
  # Unsafe texts (norm 1.2, distance 1.063) beyond S's bound 1.5? No:
  # b' = 1.5 + tanh((1.5 - 5) / 0.8) + 1 = 1.5126 > 1.063, so they stay put.
  segments = artist(figure, "traversal").get_segments()
  for start, end in segments:
    np.testing.assert_allclose(start, end, atol=1e-12)
  # With S's bound at 0.2 they move to the space norm b' (the release's rule).
  bounds["S"]["up_95"] = 0.2
  figure = plots.safety_view(space, embeddings, bounds, alpha=5.0)
  radius = safety.traversal_radius(0.2, CURV, 5.0)
  moved = np.arcsinh(np.sqrt(CURV) * radius) / np.sqrt(CURV)
  for _, end in artist(figure, "traversal").get_segments():
    assert np.linalg.norm(end) == pytest.approx(disk(moved))
