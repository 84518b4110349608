"""Evaluator figures of product embeddings (PHyCLIP): distances to the origin
are the mean of the per-factor ones, cone figures count (pair, factor)
entries and are named `..._per_factor`; evaluators that work in one Lorentz
space refuse in one line."""

import types

import numpy as np
import phyclip_reference as ref
import pytest

from hyperbolic_vl.evaluators import EvaluatorUnavailable, require_single_space, world_boxes
from hyperbolic_vl.evaluators.metrics import origin_distance
from hyperbolic_vl.plots import layout

K, D = 4, 3


def product_embeddings(seed=0, n=40):
  """Each level further out along its general level's direction, with noise,
  so that every cone holds some of its pairs' factors and misses others."""
  rng = np.random.default_rng(seed)
  noise = lambda: 0.4 * rng.normal(size=(n, K * D))
  phrase = 0.4 * rng.normal(size=(n, K * D))
  caption = 2.0 * phrase + noise()
  box = 2.0 * phrase + noise()
  image = 1.5 * caption + 0.5 * box + noise()
  return dict(phrase=phrase, caption=caption, box=box, image=image)


def test_world_box_figures_of_a_product_model_equal_the_per_factor_formulas():
  curvs = np.asarray([0.5, 1.0, 2.0, 3.0])
  embeddings = product_embeddings()
  figures = world_boxes.compositional_figures(embeddings, "lorentz", curvs)
  for level, emb in embeddings.items():
    norms = np.linalg.norm(ref.factors(emb, K), axis=-1)
    expected = (np.arcsinh(np.sqrt(curvs) * norms) / np.sqrt(curvs)).mean()
    np.testing.assert_allclose(figures[f"mean_dist_origin/{level}"], expected, rtol=1e-5)
  for name, apex, inside in world_boxes.CONES:
    # eps = 0: the plain guards, which equal the formula at these generic points.
    general, specific = ref.factors(embeddings[apex], K), ref.factors(embeddings[inside], K)
    angle = ref.oxy_angle(general, specific, curvs, eps=0.0)
    inside_share = np.mean(angle <= ref.half_aperture(general, curvs, eps=0.0))
    assert 0 < inside_share < 1, name  # both outcomes occur: the count is exercised
    # Named per factor: a (pair, factor) share never shares a column with a
    # one-space share of pairs.
    assert name not in figures, name
    np.testing.assert_allclose(
      figures[f"{name}_per_factor"], inside_share, atol=1.5 / angle.size, err_msg=name
    )


def test_single_space_evaluators_and_plots_refuse_product_models_in_one_line():
  product = types.SimpleNamespace(num_factors=64, geometry="lorentz", curv=np.ones(64))
  with pytest.raises(EvaluatorUnavailable, match=r"^the hierarchy metrics works in one Lorentz "):
    require_single_space(product, "the hierarchy metrics")
  with pytest.raises(EvaluatorUnavailable, match="product of 64 spaces \\(model.factor_dim\\)$"):
    require_single_space(product, "traversals")
  require_single_space(types.SimpleNamespace(num_factors=0), "traversals")  # one space: fine
  with pytest.raises(ValueError, match="the plots draw one Lorentz space .* product of 64 spaces"):
    layout.Space.of(product)


def test_text_image_order_figures_of_a_product_model():
  curvs = np.asarray([0.5, 1.0, 2.0, 3.0])
  embeddings = product_embeddings(seed=1)
  figures = origin_distance.text_image_order_figures(
    embeddings["image"], embeddings["caption"], "lorentz", curvs
  )
  image_d = origin_distance.distance_to_origin(embeddings["image"], "lorentz", curvs)
  text_d = origin_distance.distance_to_origin(embeddings["caption"], "lorentz", curvs)
  assert figures["text_closer_fraction"] == np.mean(text_d < image_d)
  np.testing.assert_allclose(figures["mean_dist_origin/image"], image_d.mean())
  inside = origin_distance.inside_cone(embeddings["caption"], embeddings["image"], curvs)
  assert inside.shape == (40, K)
  assert "inside_cone_fraction" not in figures
  assert figures["inside_cone_fraction_per_factor"] == inside.mean()
  # One Lorentz space (a scalar curvature) keeps the plain name: a share of pairs.
  one_space = origin_distance.text_image_order_figures(
    embeddings["image"][:, :D], embeddings["caption"][:, :D], "lorentz", 1.0
  )
  inside_pairs = origin_distance.inside_cone(
    embeddings["caption"][:, :D], embeddings["image"][:, :D], 1.0
  )
  assert inside_pairs.shape == (40,)
  assert one_space["inside_cone_fraction"] == inside_pairs.mean()
  assert "inside_cone_fraction_per_factor" not in one_space
