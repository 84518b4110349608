"""ATMG's structure analyses (Ramasinghe et al., "Accept the Modality Gap",
CVPR 2024, Sec. 6.3 and 6.5), for any two-tower run (ATMG, MERU, CLIP):

  image-hierarchy accuracy  (Tables 3 / 9)   scene > region > object chains
  text-hierarchy accuracy   (Tables 4 / 10)  caption-tier chains, general first
  eigenvalue spectrum       (Fig. 7)         of the embeddings' covariance

Hierarchy accuracy. A chain lists concepts most general first. The paper
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
origin in the paper's sense; as in world_eval, their "distance" is the norm
of the unnormalised projected feature.

Spectrum. Eigenvalues of the sample covariance (1/(N-1)) sum_n (e_n - mean)
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

from hyperbolic_vl.data import hierarcaps, world
from hyperbolic_vl.evaluators import EvaluatorUnavailable
from hyperbolic_vl.geometry import lorentz

IMAGE_LEVELS = ("scene", "region", "object")
TEXT_LEVELS = tuple(f"t{i + 1}" for i in range(world.NUM_TIERS))
SOURCES = ("world", "hierarcaps")


# -- metrics --------------------------------------------------------------------
def distance_to_origin(emb, geometry: str, curv: float | None) -> np.ndarray:
  """(..., D) embeddings -> (...) float64 distances to the origin (see the module docstring)."""
  emb = np.asarray(emb)
  if geometry == "lorentz":
    if curv is None:
      raise ValueError("a Lorentz model needs its curvature")
    return np.asarray(lorentz.dist_to_origin(emb, curv), np.float64)
  return np.linalg.norm(np.asarray(emb, np.float64), axis=-1)


def chain_order_accuracy(distances, level_names) -> dict[str, float]:
  """Hierarchy accuracies of (N chains, L levels) distances, general first.

  {"depth<k>": k = 1 .. L-1, "chain": depth L-1, "pair/<a>_<b>": each
  adjacent pair, "mean_dist/<level>": mean distance per level}.
  """
  distances = np.asarray(distances)
  if distances.ndim != 2 or distances.shape[1] < 2:
    raise ValueError(f"distances must be (chains, levels >= 2), got {distances.shape}")
  levels = distances.shape[1]
  if len(level_names) != levels:
    raise ValueError(f"{len(level_names)} level names for {levels} levels")
  ordered = distances[:, 1:] > distances[:, :-1]  # (N, L-1): deeper = farther
  figures = {}
  for depth in range(1, levels):
    # Window i of `depth` pairs is right when all its pairs are.
    windows = np.stack([ordered[:, i : i + depth].all(1) for i in range(levels - depth)], 1)
    figures[f"depth{depth}"] = float(windows.mean())
  figures["chain"] = figures[f"depth{levels - 1}"]
  for i in range(levels - 1):
    figures[f"pair/{level_names[i]}_{level_names[i + 1]}"] = float(ordered[:, i].mean())
  for i, name in enumerate(level_names):
    figures[f"mean_dist/{name}"] = float(distances[:, i].mean())
  return figures


def covariance_spectrum(emb) -> np.ndarray:
  """(N, D) embeddings -> (D,) float64 eigenvalues of their sample covariance, descending."""
  emb = np.asarray(emb, np.float64)
  if emb.ndim != 2 or emb.shape[0] < 2:
    raise ValueError(f"need (N >= 2, D) embeddings, got {emb.shape}")
  centred = emb - emb.mean(0)
  covariance = centred.T @ centred / (emb.shape[0] - 1)
  # Symmetric PSD: eigvalsh; rounding can leave tiny negatives, which are 0.
  return np.maximum(np.linalg.eigvalsh(covariance)[::-1], 0.0)


def spectrum_figures(eigenvalues, num_listed: int) -> dict[str, float]:
  """The first `num_listed` eigenvalues, the first one's share of the
  variance, and the effective rank exp(H(lambda / sum lambda))."""
  eigenvalues = np.asarray(eigenvalues, np.float64)
  total = eigenvalues.sum()
  figures = {
    f"lambda_{i + 1:02d}": float(v) for i, v in enumerate(eigenvalues[: max(num_listed, 0)])
  }
  if total > 0:
    p = eigenvalues / total
    p = p[p > 0]  # 0 log 0 = 0
    figures["top1_share"] = float(eigenvalues[0] / total)
    figures["effective_rank"] = float(np.exp(-(p * np.log(p)).sum()))
  return figures


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


# -- chains on the synthetic world ----------------------------------------------
def region_box(object_box, fraction: float) -> tuple[float, float, float, float]:
  """A square window strictly between an object's (square) box and the scene.

  Its half side is r + fraction (0.5 - r) (r: the object's half side; 0 the
  object box, 1 the scene); it is centred on the object and shifted back
  inside the unit square, which keeps the object inside it because its half
  side exceeds r.
  """
  if not 0.0 < fraction < 1.0:
    raise ValueError(f"region_fraction must be in (0, 1), got {fraction}")
  x0, y0, x1, y1 = (float(v) for v in object_box)
  radius = 0.5 * max(x1 - x0, y1 - y0)
  half = radius + fraction * (0.5 - radius)
  cx = min(max(0.5 * (x0 + x1), half), 1.0 - half)
  cy = min(max(0.5 * (y0 + y1), half), 1.0 - half)
  return (cx - half, cy - half, cx + half, cy + half)


def world_chains(world_seed: int, split: str, num: int, image_size: int, fraction: float):
  """(images (N, 3, S, S, 3) uint8 scene/region/object, tiers: N lists of 4 texts)."""
  images = np.zeros((num, len(IMAGE_LEVELS), image_size, image_size, 3), np.uint8)
  tiers = []
  for index in range(num):
    scene = world.sample_scene(world_seed, split, index)
    box = scene.main.box
    images[index, 0] = world.render(scene, image_size)
    images[index, 1] = world.render(scene, image_size, crop=region_box(box, fraction))
    images[index, 2] = world.render(scene, image_size, crop=box)
    tiers.append(world.caption_tiers(scene))
  return images, tiers


# -- the evaluator ----------------------------------------------------------------
def _encode_texts(predictor, tier_tokens: np.ndarray) -> np.ndarray:
  """(N, T, L) tokens -> (N, T, D); each distinct text is embedded once."""
  n, t, length = tier_tokens.shape
  unique, inverse = np.unique(tier_tokens.reshape(-1, length), axis=0, return_inverse=True)
  emb = predictor.encode_tokens(unique)
  return emb[inverse.reshape(-1)].reshape(n, t, -1)


class AtmgAnalysisEvaluator:
  """Settings: source ("world" or "hierarcaps"), path / image_root (a
  HierarCaps-format CSV and, optionally, its images; default the run's
  input.data.eval_path / image_root), split, num_examples, region_fraction,
  num_eigenvalues (listed in the figures; the JSON has all), output_dir
  (the spectrum PNG + JSON; default <workdir>/eval/<name>, none without a
  workdir)."""

  def __init__(self, name: str, settings, run_config, tokenizer):
    self.name = name
    self.prefix = f"eval/{name}/"
    self.num_eigenvalues = int(settings.get("num_eigenvalues", 10))
    self.output_dir = str(settings.get("output_dir", "") or "")
    self.images = None  # (N, levels, S, S, 3) image chains, or (N, S, S, 3) spectrum only
    source = str(settings.get("source", "world"))
    data_config = run_config.input.data
    image_size = int(run_config.input.image_size)
    num_examples = settings.get("num_examples", None)
    if source == "world":
      if data_config.get("name", "") != "world":
        raise EvaluatorUnavailable(
          f"source='world' needs input.data.name='world'; this run trains on "
          f"{data_config.get('name', '')!r} (use source='hierarcaps' with a CSV)"
        )
      split = str(settings.get("split", "test"))
      if split == "train":
        raise ValueError("evaluate on the world's 'validation' or 'test' split")
      num = int(num_examples if num_examples is not None else data_config.get("num_eval", 1000))
      self.images, tiers = world_chains(
        int(data_config.get("world_seed", 0)),
        split,
        num,
        image_size,
        float(settings.get("region_fraction", 0.5)),
      )
    elif source == "hierarcaps":
      path = str(settings.get("path", "") or data_config.get("eval_path", ""))
      if not path:
        raise EvaluatorUnavailable("set path (a HierarCaps-format CSV) or input.data.eval_path")
      image_root = str(settings.get("image_root", "") or data_config.get("image_root", ""))
      split = hierarcaps.load_test(path, image_root or None)
      count = len(split) if num_examples is None else min(int(num_examples), len(split))
      if count < 2:
        raise EvaluatorUnavailable(f"fewer than 2 valid rows in {path}")
      split.tiers, split.image_paths = split.tiers[:count], split.image_paths[:count]
      tiers = split.tiers
      if image_root:
        self.images = hierarcaps.load_images(split, image_size)
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
      accuracy = chain_order_accuracy(distance_to_origin(emb, geometry, curv), IMAGE_LEVELS)
      results.update({f"image_hierarchy/{k}": v for k, v in accuracy.items()})
      spectra["image"] = covariance_spectrum(emb[:, 0])  # whole scenes
    elif self.images is not None:
      spectra["image"] = covariance_spectrum(predictor.encode_images(self.images))
    text = _encode_texts(predictor, self.tier_tokens)
    accuracy = chain_order_accuracy(
      distance_to_origin(text, geometry, curv), TEXT_LEVELS[: text.shape[1]]
    )
    results.update({f"text_hierarchy/{k}": v for k, v in accuracy.items()})
    # One text per image (its most specific caption), like a training pair.
    spectra["text"] = covariance_spectrum(text[:, -1])
    for modality, values in spectra.items():
      for key, value in spectrum_figures(values, self.num_eigenvalues).items():
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
