"""The `Predictor`: what every evaluator receives to embed and score.

A model's params plus its objective's rules (scores, prompt ensembling, the
hierarchy root) behind one interface: embed images, embed texts, build
class embeddings, score. Evaluators see only this, so no evaluator reaches
into an objective. `hyperbolic_vl.load(workdir)` returns one (inference.py).

Lorentz models return the space components of points on the hyperboloid
(MERU's `encode_image(project=True)`); Euclidean models return the
unnormalised projected features (the objective normalises when it scores).
Batches are padded to a multiple of the device count and sharded over the
devices; the params are replicated once per Predictor.

Split across processes (`split_across_processes=True` in a multi-process
JAX runtime): every `encode_*` call embeds only this process's contiguous
slice of the rows, on this process's devices, and the slices are gathered
(`process_allgather`), so every process returns the whole (N, D) array and
computes the same figures from it, for 1/P of the embedding work each. All
processes must then make the same calls with the same rows, which
evaluators do: they read the same files in the same order.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from PIL import Image

from hyperbolic_vl.evaluators.datasets import images as image_files

DATA_AXIS = "data"


class Predictor:
  """A model's params plus its objective's scoring rules, ready to embed.

  model_def: the run's `models.registry.ModelDef`; objective: its objective (scores,
  prompt ensembling, the hierarchy root); aux: the objective's auxiliary
  state (e.g. a learned root); tokenizer: the run's tokenizer; batch_stats:
  the running statistics of a model with batch norms (a ResNet tower),
  which embeds with them (evaluation mode). `self.params` then holds params
  and statistics as one dict (`ModelDef.variables`), which
  `model_def.merge` takes alone.
  """

  def __init__(
    self,
    model_def,
    objective,
    params,
    *,
    tokenizer,
    image_size: int,
    aux: dict | None = None,
    batch_stats: dict | None = None,
    batch_size: int = 256,
    devices: Sequence[jax.Device] | None = None,
    compiled: dict | None = None,
    split_across_processes: bool = False,
  ):
    self.model_def = model_def
    # Off on one process whatever was asked: nothing to split, nothing changes.
    self.split_across_processes = bool(split_across_processes) and jax.process_count() > 1
    self.objective = objective
    self.tokenizer = tokenizer
    self.image_size = int(image_size)
    self.batch_size = int(batch_size)
    # A multi-process run's replicated params span every host's devices;
    # evaluation runs on this process's devices from its own copy.
    if model_def.has_batch_stats:
      params = model_def.variables(params, batch_stats)
    params = jax.tree.map(_local_copy, params)
    aux = jax.tree.map(_local_copy, aux if aux is not None else {})
    devices = list(devices) if devices is not None else jax.local_devices()
    self._mesh = jax.sharding.Mesh(np.asarray(devices), (DATA_AXIS,))
    self._rows = NamedSharding(self._mesh, P(DATA_AXIS))
    self.params = jax.device_put(params, NamedSharding(self._mesh, P()))
    self.aux = jax.device_put(aux, NamedSharding(self._mesh, P()))
    module = model_def.module
    self.geometry: str = getattr(module, "geometry", "euclidean")
    self.has_text_tower: bool = module.has_text_tower
    # Compiled functions depend only on (model_def, objective): a training
    # run passes one dict to every Predictor it builds so nothing recompiles.
    self._fns = compiled if compiled is not None else {}
    if not self._fns:
      self._fns.update(compile_functions(model_def, objective))
    # c of a Lorentz model; a (K,) array of per-factor curvatures for a
    # product of K Lorentz spaces (model.factor_dim, PHyCLIP); None otherwise.
    self.curv: float | np.ndarray | None = None
    if self.geometry == "lorentz":
      curv = np.asarray(self._fns["curv"](self.params), np.float64)
      self.curv = float(curv) if curv.ndim == 0 else curv

  @property
  def num_factors(self) -> int:
    """K for a product of Lorentz spaces, 0 for one space or a Euclidean model."""
    return 0 if self.curv is None or np.ndim(self.curv) == 0 else len(self.curv)

  # -- inputs -----------------------------------------------------------------
  def images_as_float(self, images) -> np.ndarray:
    """(N, H, W, 3) uint8 or float in [0, 1], any H and W -> float32 at the
    model's resolution; another size is brought to it as the run's own
    evaluation images are (`to_resolution`)."""
    images = np.asarray(images)
    if images.ndim != 4 or images.shape[-1] != 3 or 0 in images.shape[1:3]:
      raise ValueError(f"images must be (N, H, W, 3) RGB, got shape {images.shape}")
    if images.dtype == np.uint8:
      return to_resolution(images, self.image_size).astype(np.float32) / np.float32(255)
    if not np.issubdtype(images.dtype, np.floating):
      raise ValueError(f"images must be uint8 or float in [0, 1], got {images.dtype}")
    images = images.astype(np.float32)
    # Checked, not clipped: 0-255 floats (a forgotten / 255) or NaN pixels
    # would embed without complaint and give meaningless scores.
    if images.size and not np.isfinite(images).all():
      rows = np.flatnonzero(~np.isfinite(images).reshape(len(images), -1).all(axis=1))
      raise ValueError(f"images hold NaN or infinite values (rows {rows[:5].tolist()})")
    if images.size and (images.min() < 0 or images.max() > 1):
      raise ValueError(
        f"float images must lie in [0, 1], got values in [{images.min():g}, {images.max():g}]"
        " (uint8 images are scaled by 1/255 here; float ones are not)"
      )
    return to_resolution(images, self.image_size)

  def tokenize(self, texts: Sequence[str]) -> np.ndarray:
    """list[str] -> int32 (N, context_length), the run's own tokenizer."""
    if isinstance(texts, str):
      raise TypeError("tokenize takes a list of strings, not one string")
    return np.asarray(self.tokenizer.encode(list(texts)), np.int32)

  def _batched(self, fn, array: np.ndarray) -> np.ndarray:
    """fn over the rows, this process's slice only when split across
    processes (then gathered from every process, in row order)."""
    if not self.split_across_processes:
      return self._batched_local(fn, array)
    return self._split_and_gather(fn, array)

  def _split_and_gather(self, fn, array: np.ndarray) -> np.ndarray:
    if len(array) == 0:
      raise ValueError("nothing to encode: empty input")
    count, index = jax.process_count(), jax.process_index()
    per_process, starts, sizes = process_slices(len(array), count)
    mine = array[starts[index] : starts[index] + sizes[index]]
    # Equal shapes on every process for the gather: the slice is padded with
    # copies of the last row (a process past the end embeds only padding).
    padding = np.repeat(array[-1:], per_process - len(mine), axis=0)
    local = self._batched_local(fn, np.concatenate([mine, padding]))
    gathered = np.asarray(multihost_utils.process_allgather(local))  # (P, per_process, D)
    return np.concatenate([gathered[p, : sizes[p]] for p in range(count)])

  def _batched_local(self, fn, array: np.ndarray) -> np.ndarray:
    """fn over row batches sharded across the devices; padded rows dropped."""
    num_devices = self._mesh.size
    step = max(num_devices, self.batch_size - self.batch_size % num_devices)
    outputs = []
    for start in range(0, len(array), step):
      chunk = array[start : start + step]
      pad = (-len(chunk)) % num_devices
      if pad:
        chunk = np.concatenate([chunk, np.repeat(chunk[-1:], pad, axis=0)])
      out = fn(self.params, jax.device_put(chunk, self._rows))
      outputs.append(np.asarray(out, np.float32)[: len(chunk) - pad])
    if not outputs:
      raise ValueError("nothing to encode: empty input")
    return np.concatenate(outputs)

  # -- embeddings ---------------------------------------------------------------
  def encode_images(self, images) -> np.ndarray:
    """(N, H, W, 3) uint8, or float in [0, 1], of any size -> (N, D) float32
    (another size than `image_size` is resized: `to_resolution`)."""
    return self._batched(self._fns["image"], self.images_as_float(images))

  def encode_pixel_values(self, pixels) -> np.ndarray:
    """(N, S, S, 3) float pixels of any range, given to the model as they are.

    For a released evaluation that feeds the model values outside [0, 1]
    (PHyCLIP's VL-Checklist normalises to [-1, 1] before the model's own
    normalisation); `encode_images` refuses those, as they are otherwise a bug.
    """
    pixels = np.asarray(pixels, np.float32)
    if pixels.ndim != 4 or pixels.shape[1:] != (self.image_size, self.image_size, 3):
      raise ValueError(
        f"pixels must be (N, {self.image_size}, {self.image_size}, 3), got {pixels.shape}"
      )
    if pixels.size and not np.isfinite(pixels).all():
      raise ValueError("pixels hold NaN or infinite values")
    return self._batched(self._fns["image"], pixels)

  def _require_text(self):
    if not self.has_text_tower:
      raise ValueError(f"the {type(self.model_def.module).__name__} model has no text tower")

  def encode_tokens(self, tokens) -> np.ndarray:
    """(N, L) token ids -> (N, D) float32."""
    self._require_text()
    return self._batched(self._fns["text"], np.asarray(tokens, np.int32))

  def encode_texts(self, texts: Sequence[str]) -> np.ndarray:
    """list[str] -> (N, D) float32."""
    return self.encode_tokens(self.tokenize(texts))

  def class_embeddings_from_tokens(self, prompt_tokens) -> np.ndarray:
    """(C, P, L) prompt token ids -> the objective's class embeddings:
    (C, D), or (C, P, D) for objectives that score every prompt (ATMG)."""
    self._require_text()
    prompt_tokens = np.asarray(prompt_tokens, np.int32)
    classes, per_class, length = prompt_tokens.shape
    tangents = self._batched(self._fns["text_tangent"], prompt_tokens.reshape(-1, length))
    return np.asarray(
      self._fns["classes"](self.params, jnp.asarray(tangents.reshape(classes, per_class, -1))),
      np.float32,
    )

  def class_embeddings(self, classnames: Sequence[str], templates: Sequence[str]) -> np.ndarray:
    """Zero-shot classifier: every template filled with every class name,
    ensembled by the objective's rule (tangent mean then lift for Lorentz
    models, normalised mean for CLIP, all prompts kept for ATMG)."""
    prompts = [template.format(name) for name in classnames for template in templates]
    tokens = self.tokenize(prompts)
    return self.class_embeddings_from_tokens(
      tokens.reshape(len(classnames), len(templates), tokens.shape[-1])
    )

  # -- scores -------------------------------------------------------------------
  def similarity(self, image_emb, text_emb) -> np.ndarray:
    """(N, D) images x (M, D) texts -> (N, M) float32, higher = better: the
    objective's score (Lorentzian inner product for MERU, cosine for CLIP,
    ATMG's angles); (M, P, D) prompt ensembles are accepted for ATMG."""
    return np.asarray(
      self._fns["score"](self.params, jnp.asarray(image_emb), jnp.asarray(text_emb)), np.float32
    )

  def paired_similarity(self, image_emb, text_emb, chunk_size: int = 256) -> np.ndarray:
    """(N, D) images x (N, D) texts -> (N,) the score of each image with its
    own text row (the diagonal of `similarity`, in chunks so no N x N matrix
    is built)."""
    image_emb, text_emb = np.asarray(image_emb), np.asarray(text_emb)
    if len(image_emb) != len(text_emb):
      raise ValueError(f"{len(image_emb)} images paired with {len(text_emb)} texts")
    return np.concatenate(
      [
        np.diagonal(
          self.similarity(
            image_emb[start : start + chunk_size], text_emb[start : start + chunk_size]
          )
        )
        for start in range(0, len(image_emb), chunk_size)
      ]
    )

  def similarity_text_to_image(self, image_emb, text_emb) -> np.ndarray:
    """(N, M) scores for ranking images per text; equals `similarity` except
    for objectives whose released evaluation ranks that direction otherwise."""
    return np.asarray(
      self._fns["score_t2i"](self.params, jnp.asarray(image_emb), jnp.asarray(text_emb)),
      np.float32,
    )

  def traverse_to_safe(self, embeddings, bounds, modality: str, *, alpha: float = 0.8):
    """HySAC's traversal to safety (hyperbolic_vl/evaluators/metrics/safety.py): (N, D)
    embeddings beyond the safe radius of their modality ("image": the safe
    images' up_95 bound V, "text": the safe texts' S), moved back to it, as
    the release's traverse_to_safe_{image,text}; `bounds` in the release's
    hysac_bounds.json layout (a dict). (N, D) float32."""
    from hyperbolic_vl.evaluators.metrics import safety  # pylint: disable=g-import-not-at-top

    if self.geometry != "lorentz":
      raise ValueError("traversal to safety needs a Lorentz model")
    letters = {"image": "V", "text": "S"}
    if modality not in letters:
      raise ValueError(f"modality must be 'image' or 'text', got {modality!r}")
    bounds = safety.check_bounds(bounds)
    embeddings = np.asarray(embeddings)
    squeeze = embeddings.ndim == 1
    moved = safety.traverse(
      np.atleast_2d(embeddings), bounds[letters[modality]]["up_95"], self.curv, alpha=alpha
    )
    moved = moved.astype(np.float32)
    return moved[0] if squeeze else moved

  def root_embedding(self) -> np.ndarray | None:
    """The objective's hierarchy root ((D,) for Euclidean Radial Embeddings),
    or None when the root is the origin."""
    root = self._fns["root"](self.params, self.aux)
    return None if root is None else np.asarray(root, np.float32)


def to_resolution(images: np.ndarray, size: int) -> np.ndarray:
  """(N, H, W, 3) uint8 or float images -> (N, size, size, 3) as `evaluate`
  prepares a benchmark's images for classification (`images.resize_image`,
  mode "crop": the centred square, resized bicubic). Images already at
  `size` are returned as they are. Float images are resized channel by
  channel in float (no rounding to uint8) and clipped to [0, 1], where
  bicubic overshoots at edges."""
  if images.shape[1:3] == (size, size):
    return images
  if images.dtype == np.uint8:
    return np.stack([image_files.resize_image(image, size, "crop") for image in images])
  square = image_files.centre_square(images.shape[2], images.shape[1])
  out = np.empty((len(images), size, size, 3), np.float32)
  for index, image in enumerate(images):
    for channel in range(3):
      picture = Image.fromarray(np.ascontiguousarray(image[..., channel], np.float32))
      out[index, ..., channel] = np.asarray(
        picture.crop(square).resize((size, size), Image.Resampling.BICUBIC)
      )
  return np.clip(out, 0.0, 1.0)


def process_slices(num_rows: int, num_processes: int) -> tuple[int, list[int], list[int]]:
  """(rows per process, each process's first row, each one's row count):
  contiguous slices in process order, ceil(num_rows / num_processes) rows
  each but the last ones, which may be shorter or empty."""
  per_process = -(-num_rows // num_processes)
  starts = [min(p * per_process, num_rows) for p in range(num_processes)]
  sizes = [min(per_process, num_rows - start) for start in starts]
  return per_process, starts, sizes


def _local_copy(x):
  if isinstance(x, jax.Array) and not x.is_fully_addressable:
    return x.addressable_data(0)
  return x


def compile_functions(model_def, objective) -> dict:
  merge = model_def.merge
  fns = dict(
    image=jax.jit(lambda p, x: merge(p).encode_image(x)),
    curv=jax.jit(lambda p: merge(p).curv()),
    score=jax.jit(lambda p, a, b: objective.score(merge(p), a, b)),
    score_t2i=jax.jit(lambda p, a, b: objective.score_text_to_image(merge(p), a, b)),
  )
  if model_def.module.has_text_tower:
    fns.update(
      text=jax.jit(lambda p, t: merge(p).encode_text(t)),
      text_tangent=jax.jit(lambda p, t: merge(p).text_tangent(t)),
      classes=jax.jit(lambda p, t: objective.class_embedding(merge(p), t)),
    )
  fns["root"] = lambda p, aux: objective.root_embedding(merge(p), aux)
  return fns


def for_run_state(model_def, objective, state, tokenizer, config, compiled: dict) -> Predictor:
  """A Predictor over a training run's current params and aux, on this
  process's devices (as many as the run's mesh uses)."""
  num_devices = config.get("num_devices") or jax.device_count()
  return Predictor(
    model_def,
    objective,
    state["params"],
    aux=state["aux"],
    batch_stats=state.get("batch_stats"),
    tokenizer=tokenizer,
    image_size=int(config.input.image_size),
    devices=jax.local_devices()[:num_devices],
    compiled=compiled,
  )
