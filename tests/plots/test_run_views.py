"""A run's views from its own held-out split, on a non-world source: the
HierarCaps mini fixture (four caption tiers per image). A stand-in model
with fixed linear towers keeps this a test of what is drawn from which
data, not of training."""

import textwrap

import ml_collections
import numpy as np
import pytest
from paths import FIXTURES

pytest.importorskip("matplotlib")

from hyperbolic_vl.data import tokenizer as tokenizer_lib  # noqa: E402
from hyperbolic_vl.evaluators.metrics import traversal  # noqa: E402
from hyperbolic_vl.plots import run_views, walk_views  # noqa: E402

MINI = FIXTURES / "hierarcaps_mini"


class LinearTowers:
  """`Predictor`'s interface over fixed random linear maps (Lorentz, c = 1)."""

  geometry, curv, image_size = "lorentz", 1.0, 16
  has_text_tower = True

  def __init__(self, config, tokenizer):
    self.config, self.tokenizer, self.embedded_texts = config, tokenizer, []
    rng = np.random.default_rng(0)
    self.image_map = rng.normal(size=(16 * 16 * 3, 8)) / 40
    self.token_map = rng.normal(size=(32, 8)) / 4000

  def encode_images(self, images):
    return np.asarray(images, np.float64).reshape(len(images), -1) @ self.image_map

  def encode_tokens(self, tokens):
    return np.asarray(tokens, np.float64) @ self.token_map

  def encode_texts(self, texts):
    self.embedded_texts.extend(texts)
    return self.encode_tokens(self.tokenizer.encode(list(texts)))

  def root_embedding(self):
    return None


@pytest.fixture(scope="module")
def model(tmp_path_factory):
  tokenizer = tokenizer_lib.world_tokenizer(
    context_length=32, cache_dir=tmp_path_factory.mktemp("spm")
  )
  data = dict(
    name="image_text_csv",
    path=str(MINI / "hierarcaps_mini.csv"),
    image_root=str(MINI / "images"),
    image_column="image_url",
    caption_column="captions",
    tier_separator=" => ",
  )
  config = ml_collections.ConfigDict({"input": {"batch_size": 2, "image_size": 16, "data": data}})
  return LinearTowers(config, tokenizer)


def test_views_of_a_hierarcaps_run(model):
  figures = run_views.run_figures(model, num_examples=6, name="mini")
  assert set(figures) == {"disk_view", "distance_histograms", "traversals", "interpolation", "cone"}
  # Images and each of the four caption tiers, every one of the 6 rows counted.
  histograms = figures["distance_histograms"].axes
  assert len(histograms) == 5
  assert all(sum(bar.get_height() for bar in ax.patches) == 6 for ax in histograms)
  # No caption strings off the world: traversals retrieve from MERU's pexels
  # pool, embedded through MERU's prompts, and report the bare tags.
  pool = traversal.load_text_pool()
  assert list(pool.prompts) == model.embedded_texts[: len(pool)]
  shortened = {textwrap.shorten(t, 34, placeholder="...") for t in pool.texts}  # as drawn
  for row in range(min(run_views.TRAVERSAL_IMAGES, 6)):
    walk = walk_views.read_walk(figures["traversals"], "mini", row)
    assert walk[-1] == traversal.ROOT
    assert set(walk[:-1]) <= shortened


def test_views_need_a_text_tower_and_a_held_out_split(model):
  image_only = LinearTowers(model.config, model.tokenizer)
  image_only.has_text_tower = False
  with pytest.raises(run_views.ViewsUnavailable, match="no text tower"):
    run_views.run_figures(image_only, num_examples=6)
  no_split = LinearTowers(model.config.copy_and_resolve_references(), model.tokenizer)
  # GRIT web shards have no evaluation split.
  no_split.config.input.data = ml_collections.ConfigDict({"name": "grit", "path": "/nowhere"})
  with pytest.raises(run_views.ViewsUnavailable, match="no held-out split"):
    run_views.run_figures(no_split, num_examples=6)
