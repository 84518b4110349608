"""Public inference handle: embed images and texts with a trained run.

    import hyperbolic_vl
    m = hyperbolic_vl.load(workdir)
    img = m.encode_images(images)   # (N, H, W, 3) uint8 or float32 in [0, 1]
    txt = m.encode_texts(["a photo of a dog."])
    scores = m.similarity(img, txt)  # (N, M), higher = more similar

Lorentz models return the space components of points on the hyperboloid;
Euclidean models return the unnormalised projected features. `similarity`
is the run's own objective score (negative Lorentz distance for MERU/HMID,
cosine for CLIP, the angle rule for ATMG), so every caller ranks the way
training did.

The module is named `inference` (not `load`) because a submodule called
`load` would replace the `hyperbolic_vl.load` function on import.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import jax
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from hyperbolic_vl import objectives as objectives_lib
from hyperbolic_vl import train


class Model:
  """A restored run's two towers, jitted and sharded over the local devices."""

  def __init__(self, workdir: str, step: int | None = None, batch_size: int = 256):
    workdir = os.path.abspath(workdir)
    if not os.path.isdir(workdir):
      raise FileNotFoundError(f"workdir {workdir} does not exist")
    config, model_def, params, tokenizer = train.restore_params(workdir, step)
    self.config = config
    self.workdir = workdir
    self.objective = objectives_lib.get(config.objective)
    self._tokenizer = tokenizer
    self._model_def = model_def
    module = model_def.module
    self.geometry: str = module.geometry
    self.image_size: int = int(config.input.image_size)
    self.mesh = train.make_mesh(jax.local_device_count())
    self._data_sharding = NamedSharding(self.mesh, P("data"))
    self.params = jax.device_put(params, NamedSharding(self.mesh, P()))
    # Rows per call: a multiple of the device count so every device gets an
    # equal shard; the last batch is zero-padded and the padding dropped.
    devices = self.mesh.size
    self.batch_size = max(devices, (batch_size + devices - 1) // devices * devices)
    merge = model_def.merge
    objective = self.objective
    self._image_fn = jax.jit(lambda p, x: merge(p).encode_image(x))
    self._text_fn = jax.jit(lambda p, t: merge(p).encode_text(t))
    self._score_fn = jax.jit(lambda p, a, b: objective.score(merge(p), a, b))
    self.curv: float | None = (
      float(jax.jit(lambda p: merge(p).curv())(self.params)) if self.geometry == "lorentz" else None
    )

  def _batched(self, fn, array: np.ndarray) -> np.ndarray:
    outs = []
    for start in range(0, len(array), self.batch_size):
      chunk = array[start : start + self.batch_size]
      rows = len(chunk)
      if rows < self.batch_size:
        pad = np.zeros((self.batch_size - rows, *chunk.shape[1:]), chunk.dtype)
        chunk = np.concatenate([chunk, pad])
      out = fn(self.params, jax.device_put(chunk, self._data_sharding))
      outs.append(np.asarray(out, np.float32)[:rows])
    if not outs:
      raise ValueError("nothing to encode: got an empty batch")
    return np.concatenate(outs)

  def encode_images(self, images) -> np.ndarray:
    """(N, H, W, 3) uint8, or float in [0, 1], at `image_size` -> (N, D)."""
    images = np.asarray(images)
    if images.ndim != 4 or images.shape[1:] != (self.image_size, self.image_size, 3):
      raise ValueError(
        f"images must be (N, {self.image_size}, {self.image_size}, 3); got {images.shape}"
      )
    if images.dtype == np.uint8:
      images = images.astype(np.float32) * np.float32(1.0 / 255.0)
    else:
      images = images.astype(np.float32)
    return self._batched(self._image_fn, images)

  def tokenize(self, texts: Sequence[str]) -> np.ndarray:
    """list[str] -> (N, context_length) int32 token ids."""
    if isinstance(texts, str):
      raise TypeError("tokenize takes a list of strings, not one string")
    return np.asarray(self._tokenizer.encode(list(texts)), np.int32)

  def encode_texts(self, texts: Sequence[str]) -> np.ndarray:
    """list[str] -> (N, D)."""
    return self._batched(self._text_fn, self.tokenize(texts))

  def similarity(self, image_emb, text_emb) -> np.ndarray:
    """(N, D), (M, D) -> (N, M): the objective's score, higher = more similar."""
    return np.asarray(self._score_fn(self.params, np.asarray(image_emb), np.asarray(text_emb)))

  def __repr__(self) -> str:
    return (
      f"Model(workdir={self.workdir!r}, objective={self.config.objective.name!r}, "
      f"geometry={self.geometry!r}, image_size={self.image_size})"
    )


def load(workdir: str, step: int | None = None, batch_size: int = 256) -> Model:
  """The run in `workdir` (its config.json and latest, or `step`'s, checkpoint)."""
  return Model(workdir, step=step, batch_size=batch_size)
