"""MERU traversals as released: entailment-cone filter ([ROOT] exempt) and
removal of every repeated text, against a float64 NumPy reference."""

import jax
import numpy as np
import pytest
from tiny_fixtures import np_time

from hyperbolic_vl.evaluators.metrics import traversal


def np_ext(x, y, c):
  """Exterior angle at x towards y (MERU eq. 11), float64, one pair."""
  inner = c * (x @ y - np_time(x, c) * np_time(y, c))
  num = np_time(y, c) + np_time(x, c) * inner
  den = np.linalg.norm(x) * np.sqrt(max(inner**2 - 1, 1e-300))
  return np.arccos(np.clip(num / den, -1, 1))


def reference_lorentz(image, text, names, c, steps, entailment=True):
  found = []
  norm = np.linalg.norm(image)
  for t in np.linspace(1.0, 0.0, steps):
    # Geodesic to the origin: exp_0(t log_0(x)) in space components.
    point = np.sinh(t * np.arcsinh(np.sqrt(c) * norm)) / np.sqrt(c) * image / norm
    best, best_score = len(names), -np_time(point, c) / np.sqrt(c)  # [ROOT]: <p, O>_L
    for j, y in enumerate(text):
      aperture = np.arcsin(min(1.0, 2 * 0.1 / (np.sqrt(c) * np.linalg.norm(y))))
      if entailment and np_ext(y, point, c) > aperture:
        continue
      score = point @ y - np_time(point, c) * np_time(y, c)
      if score > best_score:
        best, best_score = j, score
    name = (list(names) + [traversal.ROOT])[best]
    if name not in found:
      found.append(name)
  return found


@pytest.mark.parametrize("entailment", [True, False])
def test_lorentz_traversal_matches_reference(entailment):
  rng = np.random.default_rng(0)
  c = 0.5
  filter_mattered = False
  with jax.enable_x64(True):
    for trial in range(4):
      # Texts near the image's direction at several radii, so some entail it.
      direction = rng.normal(size=4)
      image = 3.0 * direction / np.linalg.norm(direction)
      text = np.stack([r * (direction + 0.3 * rng.normal(size=4)) for r in (0.2, 0.5, 1, 2, 3, 4)])
      names = [f"t{j}" for j in range(len(text))]
      got = traversal.traverse(
        image, text, names, geometry="lorentz", curv=c, steps=20, entailment_filter=entailment
      )
      assert got == reference_lorentz(image, text, names, c, 20, entailment), trial
      assert len(got) == len(set(got)) and got[-1] == traversal.ROOT
      other = reference_lorentz(image, text, names, c, 20, not entailment)
      filter_mattered |= got != other
  assert filter_mattered  # the inputs exercise the cone test


def test_clip_root_and_all_repeats_removed():
  rng = np.random.default_rng(1)
  image_emb, text_emb = rng.normal(size=(5, 3)), rng.normal(size=(7, 3))
  unit = lambda v: v / np.linalg.norm(v, axis=-1, keepdims=True)
  root = traversal.clip_root(image_emb, text_emb)
  expected = unit(np.concatenate([unit(image_emb), unit(text_emb)]).mean(0))
  np.testing.assert_allclose(root, expected, rtol=1e-12)
  # A pool where the straight path meets A, B, A again: "all" keeps A once.
  a, b = np.array([1.0, 0.2, 0]), np.array([0.6, 0.8, 0])
  pool = np.stack([a, b, np.array([0.9, -0.1, 0.1])])
  names = ["A", "B", "C"]
  kw = dict(geometry="euclidean", steps=30, root=np.array([0.0, 0.0, 1.0]))
  adjacent = traversal.traverse(np.array([1.0, 0.0, 0.0]), pool, names, dedupe="adjacent", **kw)
  released = traversal.traverse(np.array([1.0, 0.0, 0.0]), pool, names, **kw)
  assert released == list(dict.fromkeys(adjacent))


def test_pexels_pool_uses_merus_released_prompts():
  """MERU's scripts/image_traversals.py embeds captions as they are, nouns as
  "a photo of a {}." and adjectives as "this photo is {}.", and reports the
  bare tag. The shipped pool (60 captions, 624 nouns, 67 adjectives)."""
  pool = traversal.load_text_pool()  # the package's copy of MERU's pool
  prompt = dict(zip(pool.texts, pool.prompts))
  assert pool.texts[0] == pool.prompts[0] == "spinach caprese salad on white ceramic plate"
  assert (
    prompt["an orca whale jumping out of the water"] == "an orca whale jumping out of the water"
  )
  assert prompt["1 wtc"] == "a photo of a 1 wtc."
  assert prompt["active volcano"] == "a photo of a active volcano."  # "a", as released
  assert prompt["adorable"] == "this photo is adorable."
  assert prompt["arctic"] == "this photo is arctic."
  assert len(pool) == 60 + 624 + 67


def test_traversal_reports_texts_and_scores_prompts():
  """A walk over a TextPool names the bare tags while the model embedded
  the prompts: here the pool's rows are found by the prompt's embedding."""
  pool = traversal.TextPool(("dog", "cat"), ("a photo of a dog.", "a photo of a cat."))
  embed = {"a photo of a dog.": np.array([0.2, 0.0]), "a photo of a cat.": np.array([0.0, 0.2])}
  text_emb = np.stack([embed[p] for p in pool.prompts])
  walk = traversal.traverse(
    np.array([1.5, 0.1]), text_emb, list(pool.texts), geometry="lorentz", curv=1.0
  )
  assert walk == ["dog", traversal.ROOT]
