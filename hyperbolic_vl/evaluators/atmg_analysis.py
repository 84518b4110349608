"""Evaluator type "atmg_analysis": ATMG's structure analyses (Ramasinghe et al., "Accept the Modality Gap",
CVPR 2024, Sec. 6.3 and 6.5), for any two-tower run (ATMG, MERU, CLIP):

  image-hierarchy accuracy  (Tables 3 / 9)   scene > region > object chains
  text-hierarchy accuracy   (Tables 4 / 10)  caption-tier chains, general first
  eigenvalue spectrum       (Fig. 7)         of the embeddings' covariance

Hierarchy accuracy (metrics/chain_order.py). A chain lists concepts most
general first. The paper
"arranged these objects/parts by their embedding proximity to the origin,
and assessed the accuracy of this ordering against the known hierarchical
structure (objects deeper in the hierarchy should be embedded further away
from ROOT, i.e. origin)", and reports depth-1 chains (parent -> child, one
pair) and depth-2 chains (three levels, right only when fully ordered).
With d[n, l] the distance to the origin of level l of chain n (l = 0 the
most general), every contiguous window of k + 1 levels is a depth-k chain:

  depth-k accuracy = mean over n, i of  prod_{j=i}^{i+k-1} [d[n, j] < d[n, j+1]]

so depth 1 is the accuracy over all adjacent pairs and depth L-1 ("chain")
the fraction of whole chains ordered; `pair/<a>_<b>` is one adjacent pair's
accuracy. Ties count as wrong: the hierarchy asks for a strict order.

Distance to the origin. Lorentz models (MERU, ATMG) embed points of the
hyperboloid of curvature -c by their space components x, and
d(O, x) = acosh(sqrt(c) x_time) / sqrt(c) = asinh(sqrt(c)|x|) / sqrt(c)
(`lorentz.dist_to_origin`, the run's own c). Euclidean models (CLIP) have no
origin in the paper's sense; as in the world evaluator, their "distance" is the norm
of the unnormalised projected feature.

Spectrum (metrics/spectrum.py). Eigenvalues of the sample covariance (1/(N-1)) sum_n (e_n - mean)
(e_n - mean)^T of the image and of the text embeddings (the space
components for Lorentz models, as the released code's
`encode_image(project=True)`), largest first, in float64. The paper reads
the height of the first few eigenvalues (MERU's are two orders of magnitude
above the rest: embeddings packed into a few directions); the figures also
give the first eigenvalue's share of the variance and the effective rank
exp(entropy of lambda / sum lambda) (Roy & Vetterli 2007), D for a
perfectly spread spectrum and 1 when one direction holds everything.

On the synthetic world each held-out scene gives one image chain (the
whole scene, a square region around its main object, the main object's tight
box, all rendered at the model's resolution) and one text chain (its four
caption tiers). A HierarCaps-format CSV gives text chains (and, with its
images, the image spectrum).
"""

from __future__ import annotations

import json
import os

import numpy as np

from hyperbolic_vl.data import synthetic_world as world
from hyperbolic_vl.evaluators import registry
from hyperbolic_vl.evaluators.datasets import hierarcaps_csv, world_scenes
from hyperbolic_vl.evaluators.metrics import chain_order, origin_distance, spectrum

TEXT_LEVELS = tuple(f"t{i + 1}" for i in range(world.NUM_TIERS))
SOURCES = ("world", "hierarcaps")
SETTINGS = dict(
  source="world",
  path="",
  image_root="",
  split="test",
  num_examples=None,
  region_fraction=0.5,
  num_eigenvalues=10,
  output_dir="",
)


def plot_spectra(spectra: dict, path: str, title: str) -> str:
  """Log-scale eigenvalue curves (Fig. 7) written as a PNG; returns its path."""
  # The object-oriented API (no pyplot): no global backend or figure state.
  from matplotlib.figure import Figure

  figure = Figure(figsize=(5, 3.5), dpi=120)
  axes = figure.add_subplot()
  for modality, values in spectra.items():
    values = np.asarray(values, np.float64)
    # Zero eigenvalues have no logarithm; they are left off the curve.
    positive = values > 0
    axes.plot(np.arange(1, len(values) + 1)[positive], values[positive], label=modality)
  axes.set_yscale("log")
  axes.set_xlabel("eigenvalue index")
  axes.set_ylabel("eigenvalue (log scale)")
  axes.set_title(title)
  axes.legend()
  figure.tight_layout()
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  figure.savefig(path)
  return path


def _encode_texts(predictor, tier_tokens: np.ndarray) -> np.ndarray:
  """(N, T, L) tokens -> (N, T, D); each distinct text is embedded once."""
  n, t, length = tier_tokens.shape
  unique, inverse = np.unique(tier_tokens.reshape(-1, length), axis=0, return_inverse=True)
  emb = predictor.encode_tokens(unique)
  return emb[inverse.reshape(-1)].reshape(n, t, -1)


@registry.register(
  "atmg_analysis",
  settings=SETTINGS,
  description="ATMG's image / text hierarchy accuracy and covariance eigenvalue spectrum (PNG)",
)
class AtmgAnalysisEvaluator:
  """Settings: source ("world" or "hierarcaps"), path / image_root (a
  HierarCaps-format CSV and, optionally, its images; default the run's
  input.data.eval_path / image_root), split, num_examples, region_fraction,
  num_eigenvalues (listed in the figures; the JSON has all), output_dir
  (the spectrum PNG + JSON; default <workdir>/eval/<name>, none without a
  workdir)."""

  def __init__(self, name: str, settings, run_input, tokenizer):
    self.name = name
    self.prefix = f"eval/{name}/"
    self.num_eigenvalues = int(settings.get("num_eigenvalues", 10))
    self.output_dir = str(settings.get("output_dir", "") or "")
    self.images = None  # (N, levels, S, S, 3) image chains, or (N, S, S, 3) spectrum only
    source = str(settings.get("source", "world"))
    image_size = int(run_input.image_size)
    num_examples = settings.get("num_examples", None)
    if source == "world":
      split = str(settings.get("split", "test"))
      if split == "train":
        raise ValueError("evaluate on the world's 'validation' or 'test' split")
      world_scenes.require_world_split(
        run_input, tokenizer, split=split, needed_by="source='world' (use source='hierarcaps')"
      )
      num = num_examples
      if num is None:
        num = run_input.data.get("num_eval", 1000)
      self.images, tiers = world_scenes.world_chains(
        world_scenes.world_seed(run_input),
        split,
        int(num),
        image_size,
        float(settings.get("region_fraction", 0.5)),
      )
    elif source == "hierarcaps":
      path, image_root = hierarcaps_csv.csv_and_images(
        settings, run_input, "a HierarCaps-format CSV"
      )
      tiers, self.images = hierarcaps_csv.tier_chains(path, image_root, image_size, num_examples)
    else:
      raise ValueError(f"source={source!r}; valid: {list(SOURCES)}")
    flat = [t for row in tiers for t in row]
    self.tier_tokens = np.asarray(tokenizer.encode(flat)).reshape(len(tiers), len(tiers[0]), -1)

  def __call__(self, predictor) -> dict[str, float]:
    geometry, curv = predictor.geometry, predictor.curv
    results, spectra = {}, {}
    if self.images is not None and self.images.ndim == 5:
      n, levels = self.images.shape[:2]
      emb = predictor.encode_images(self.images.reshape(n * levels, *self.images.shape[2:]))
      emb = emb.reshape(n, levels, -1)
      accuracy = chain_order.chain_order_accuracy(
        origin_distance.distance_to_origin(emb, geometry, curv), world_scenes.IMAGE_LEVELS
      )
      results.update({f"image_hierarchy/{k}": v for k, v in accuracy.items()})
      spectra["image"] = spectrum.covariance_spectrum(emb[:, 0])  # whole scenes
    elif self.images is not None:
      spectra["image"] = spectrum.covariance_spectrum(predictor.encode_images(self.images))
    text = _encode_texts(predictor, self.tier_tokens)
    accuracy = chain_order.chain_order_accuracy(
      origin_distance.distance_to_origin(text, geometry, curv), TEXT_LEVELS[: text.shape[1]]
    )
    results.update({f"text_hierarchy/{k}": v for k, v in accuracy.items()})
    # One text per image (its most specific caption), like a training pair.
    spectra["text"] = spectrum.covariance_spectrum(text[:, -1])
    for modality, values in spectra.items():
      for key, value in spectrum.spectrum_figures(values, self.num_eigenvalues).items():
        results[f"eigen/{modality}/{key}"] = value
    if self.output_dir:
      self._write_spectra(spectra)
    return {self.prefix + k: v for k, v in results.items()}

  def _write_spectra(self, spectra: dict) -> None:
    os.makedirs(self.output_dir, exist_ok=True)
    with open(os.path.join(self.output_dir, "eigenvalues.json"), "w") as f:
      json.dump({k: [float(x) for x in v] for k, v in spectra.items()}, f)
    try:
      path = plot_spectra(
        spectra,
        os.path.join(self.output_dir, "eigenvalues.png"),
        f"{self.name}: covariance eigenvalues",
      )
    except ImportError:  # matplotlib is the optional "plots" extra
      print(f"{self.name}: matplotlib not installed; eigenvalues.json only", flush=True)
      return
    print(f"{self.name}: eigenvalue plot written to {path}", flush=True)
