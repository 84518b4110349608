"""The public inference handle: `hyperbolic_vl.load(workdir)`.

One way to embed data with any run (trained here or converted from a
release): evaluators, colabs and converters all go through it.

    m = hyperbolic_vl.load("runs/meru")
    image_emb = m.encode_images(images)   # (N, H, W, 3) uint8 or float in [0, 1]
    text_emb = m.encode_texts(["a dog", "a cat"])
    scores = m.similarity(image_emb, text_emb)   # (N, M), the objective's score

Lorentz models return the space components of points on the hyperboloid
(MERU's `encode_image(project=True)`); Euclidean models return the
unnormalised projected features (the objective normalises when it scores).
Batches are padded to a multiple of the local device count and sharded over
all local devices; the params are replicated once.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from hyperbolic_vl import objectives as objectives_lib
from hyperbolic_vl import train

DATA_AXIS = "data"


class LoadedModel:
  """A run's model, params, tokenizer and scoring rule, ready to embed."""

  def __init__(self, workdir: str | os.PathLike, *, step: int | None = None, batch_size: int = 256):
    workdir = os.fspath(workdir)
    if not os.path.isdir(workdir):
      raise FileNotFoundError(f"workdir {workdir!r} does not exist")
    self.workdir = workdir
    self.config, self.model_def, params, self.tokenizer = train.restore_params(workdir, step)
    self.objective = objectives_lib.get(self.config.objective)
    self.batch_size = int(batch_size)
    devices = jax.local_devices()
    self._mesh = jax.sharding.Mesh(np.asarray(devices), (DATA_AXIS,))
    self._rows = NamedSharding(self._mesh, P(DATA_AXIS))
    self.params = jax.device_put(params, NamedSharding(self._mesh, P()))
    merge = self.model_def.merge
    module = self.model_def.module
    self.geometry: str = getattr(module, "geometry", "euclidean")
    self.image_size: int = int(self.config.input.image_size)
    self.curv: float | None = (
      float(jax.jit(lambda p: merge(p).curv())(self.params)) if self.geometry == "lorentz" else None
    )
    self._has_text = hasattr(module, "encode_text")
    self._encode_image = jax.jit(lambda p, x: merge(p).encode_image(x))
    self._encode_text = jax.jit(lambda p, t: merge(p).encode_text(t))
    self._score = jax.jit(lambda p, a, b: self.objective.score(merge(p), a, b))

  # -- inputs -----------------------------------------------------------------
  def _images_as_float(self, images) -> np.ndarray:
    images = np.asarray(images)
    if images.ndim != 4 or images.shape[1:] != (self.image_size, self.image_size, 3):
      raise ValueError(
        f"images must be (N, {self.image_size}, {self.image_size}, 3) at the model's "
        f"resolution, got {images.shape}"
      )
    if images.dtype == np.uint8:
      return images.astype(np.float32) / np.float32(255)
    if not np.issubdtype(images.dtype, np.floating):
      raise ValueError(f"images must be uint8 or float in [0, 1], got {images.dtype}")
    return images.astype(np.float32)

  def tokenize(self, texts: Sequence[str]) -> np.ndarray:
    """list[str] -> int32 (N, context_length), the run's own tokenizer."""
    if isinstance(texts, str):
      raise TypeError("tokenize takes a list of strings, not one string")
    return np.asarray(self.tokenizer.encode(list(texts)), np.int32)

  def _batched(self, fn, array: np.ndarray) -> np.ndarray:
    """fn over row batches sharded across local devices; padded rows dropped."""
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

  # -- embeddings and scores ----------------------------------------------------
  def encode_images(self, images) -> np.ndarray:
    """(N, H, W, 3) uint8, or float in [0, 1], at `image_size` -> (N, D) float32."""
    return self._batched(self._encode_image, self._images_as_float(images))

  def encode_texts(self, texts: Sequence[str]) -> np.ndarray:
    """list[str] -> (N, D) float32."""
    if not self._has_text:
      raise ValueError(
        f"the {self.config.objective.name} model of {self.workdir} has no text tower"
      )
    return self._batched(self._encode_text, self.tokenize(texts))

  def similarity(self, image_emb, text_emb) -> np.ndarray:
    """(N, D) images x (M, D) texts -> (N, M) float32: the objective's score
    (Lorentzian inner product for MERU, cosine for CLIP, ATMG's angles)."""
    return np.asarray(
      self._score(self.params, jnp.asarray(image_emb), jnp.asarray(text_emb)), np.float32
    )


def load(
  workdir: str | os.PathLike, *, step: int | None = None, batch_size: int = 256
) -> LoadedModel:
  """The inference handle of `workdir` (see the module docstring)."""
  return LoadedModel(workdir, step=step, batch_size=batch_size)
