"""Evaluator type "entailment": does the geometry tell "general entails
specific" caption pairs from pairs that do not entail?

Pairs come from caption chains, most general first: the world's four caption
tiers of held-out scenes (source="world") or a HierarCaps-format CSV's four
tiers (source="hierarcaps", path=CSV; no images needed).
  positive  (tier a, tier b) of one chain, a < b: b is more specific
  negative  (tier a of chain i, tier b of chain j), j != i, a < b, kept only
            when chain j does not itself hold chain i's tier-a text (the
            world repeats general tiers such as "a circle" across scenes;
            such a pair entails and is not a negative)

Score, higher = more entailed:
  Lorentz models: -angle / aperture, the exterior angle at the general text's
    point towards the specific one (MERU eq. 11) relative to the half
    aperture of the general text's entailment cone (MERU eq. 10, K =
    min_radius, MERU's 0.1); a pair lies inside the cone when the ratio is <= 1.
  Euclidean models (euclidean="cosine", default): the cosine of the two
    caption embeddings, the Euclidean analogue without a cone (no cone
    statistics); euclidean="refuse" refuses them instead.
Other geometries (product embeddings) are refused with one line: their
per-factor cones are not defined here yet.

Figures: entailment/<label>/{auc_roc, average_precision} over all pairs
(metrics/ranked_labels.py: ties one half / grouped), and for Lorentz models
{positives_in_cone, negatives_in_cone}, the fractions with ratio <= 1;
num_positive, num_negative.
"""

from __future__ import annotations

import itertools

import jax.numpy as jnp
import numpy as np

from hyperbolic_vl.data import synthetic_world as world
from hyperbolic_vl.evaluators import EvaluatorUnavailable, registry
from hyperbolic_vl.evaluators.datasets import hierarcaps_csv, world_scenes
from hyperbolic_vl.evaluators.metrics import ranked_labels
from hyperbolic_vl.geometry import lorentz

SETTINGS = dict(
  source="world",
  path="",
  split="test",
  num_examples=None,
  min_radius=0.1,
  euclidean="cosine",
)
WORLD_DEFAULT_SCENES = 128
HIERARCAPS_LAYOUT = "a HierarCaps test CSV: id, captions (4 tiers joined by ' => '), image_url"


def entailment_pairs(chains):
  """(general texts, specific texts, labels) of every positive and negative
  pair of `chains` (lists of texts, most general first)."""
  general, specific, labels = [], [], []
  members = [set(chain) for chain in chains]
  for i, chain in enumerate(chains):
    for a, b in itertools.combinations(range(len(chain)), 2):
      general.append(chain[a])
      specific.append(chain[b])
      labels.append(True)
      for j, other in enumerate(chains):
        if j != i and b < len(other) and chain[a] not in members[j]:
          general.append(chain[a])
          specific.append(other[b])
          labels.append(False)
  return general, specific, np.asarray(labels)


def cone_ratio(general_emb, specific_emb, curv: float, min_radius: float) -> np.ndarray:
  """Exterior angle at each general point towards its specific point over
  the general point's half aperture; (P, D), (P, D) -> (P,)."""
  general_emb, specific_emb = jnp.asarray(general_emb), jnp.asarray(specific_emb)
  angle = lorentz.oxy_angle(general_emb, specific_emb, curv)
  aperture = lorentz.half_aperture(general_emb, curv, min_radius=min_radius)
  return np.asarray(angle / aperture, np.float64)


def cosine(a, b) -> np.ndarray:
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  return np.sum(a * b, axis=-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))


@registry.register(
  "entailment",
  settings=SETTINGS,
  description="entailment detection AUC-ROC / AP of caption pairs (source=world or hierarcaps)",
)
class EntailmentEvaluator:
  def __init__(self, name: str, settings, run_input, tokenizer=None):
    del tokenizer
    if settings.euclidean not in ("cosine", "refuse"):
      raise ValueError(f"entailment euclidean={settings.euclidean!r}; valid: cosine, refuse")
    if settings.source == "world":
      count = int(settings.num_examples or WORLD_DEFAULT_SCENES)
      seed = world_scenes.world_seed(run_input)
      self.chains = [
        world.caption_tiers(world.sample_scene(seed, str(settings.split), index))
        for index in range(count)
      ]
      self.label = "world"
    elif settings.source == "hierarcaps":
      path = str(settings.path)
      if not path:
        raise EvaluatorUnavailable("entailment source=hierarcaps needs path=<HierarCaps test CSV>")
      try:
        self.chains, _ = hierarcaps_csv.tier_chains(path, "", 0, settings.num_examples)
      except FileNotFoundError:
        raise EvaluatorUnavailable(
          f"entailment path={path!r} does not exist; expected {HIERARCAPS_LAYOUT}"
        ) from None
      self.label = name
    else:
      raise ValueError(f"entailment source={settings.source!r}; valid: world, hierarcaps")
    self.general, self.specific, self.labels = entailment_pairs(self.chains)
    if self.labels.all():
      raise EvaluatorUnavailable("entailment: no negative pair (every chain shares its texts)")
    self.min_radius = float(settings.min_radius)
    self.refuse_euclidean = settings.euclidean == "refuse"

  def __call__(self, predictor) -> dict[str, float]:
    geometry = predictor.geometry
    if geometry == "lorentz" and np.size(predictor.curv) != 1:
      geometry = "product"  # one curvature per factor: a product of hyperboloids
    if geometry not in ("lorentz", "euclidean") or (
      geometry == "euclidean" and self.refuse_euclidean
    ):
      raise EvaluatorUnavailable(
        f"entailment detection is defined for Lorentz models (cones) and Euclidean ones "
        f"(cosine, euclidean='cosine'); this model's geometry is {geometry!r}"
      )
    texts = sorted(set(self.general) | set(self.specific))
    row = {t: i for i, t in enumerate(texts)}
    embeddings = predictor.encode_texts(texts)
    general = embeddings[[row[t] for t in self.general]]
    specific = embeddings[[row[t] for t in self.specific]]
    prefix = f"entailment/{self.label}/"
    figures = {}
    if geometry == "lorentz":
      ratio = cone_ratio(general, specific, float(predictor.curv), self.min_radius)
      scores = -ratio
      figures[prefix + "positives_in_cone"] = float(np.mean(ratio[self.labels] <= 1))
      figures[prefix + "negatives_in_cone"] = float(np.mean(ratio[~self.labels] <= 1))
    else:
      scores = cosine(general, specific)
    figures[prefix + "auc_roc"] = ranked_labels.roc_auc(scores, self.labels)
    figures[prefix + "average_precision"] = ranked_labels.average_precision(scores, self.labels)
    figures[prefix + "num_positive"] = float(self.labels.sum())
    figures[prefix + "num_negative"] = float((~self.labels).sum())
    return figures
