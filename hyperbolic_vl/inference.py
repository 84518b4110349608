"""The public inference handle: `hyperbolic_vl.load(workdir or release name)`.

One way to embed data with any run (trained here or converted from a
release): the evaluation command, colabs and converters go through it.

    m = hyperbolic_vl.load("runs/meru")   # or a released model: load("meru_vit_l")
    image_emb = m.encode_images(images)   # (N, H, W, 3) uint8 or float in [0, 1]
    text_emb = m.encode_texts(["a dog", "a cat"])
    scores = m.similarity(image_emb, text_emb)   # (N, M), the objective's score
    safe_query = m.traverse_to_safe_text(text_emb)   # HySAC runs: hysac_bounds.json

It is a `predictor.Predictor` (see there for shapes and conventions) built
from the workdir's config.json and latest (or given) checkpoint, using every
local device.

The towers compute in float32 by default, whatever `model.dtype` the run
trained with: the paper configs train in bfloat16, and bfloat16 towers move
embeddings by about 1-2% (relative), enough to miss the released models'
figures; MERU's own evaluation runs in float32. `dtype="bfloat16"` trades
that for speed (docs/evaluation.md has its effect on a zero-shot figure).
"""

from __future__ import annotations

import os

from hyperbolic_vl import objectives as objectives_lib
from hyperbolic_vl.predictor import Predictor
from hyperbolic_vl.runs import loading


class LoadedModel(Predictor):
  """A run's model, params, tokenizer and scoring rule, restored from its workdir."""

  def __init__(
    self,
    workdir: str | os.PathLike,
    *,
    step: int | None = None,
    batch_size: int = 256,
    dtype: str = "float32",
    split_across_processes: bool = False,
  ):
    workdir = os.fspath(workdir)
    if not os.path.isdir(workdir):
      raise FileNotFoundError(f"workdir {workdir!r} does not exist")
    self.workdir = workdir
    self.dtype = dtype
    self.config, model_def, params, tokenizer = loading.restore_run_params(
      workdir, step, dtype=dtype
    )
    objective = objectives_lib.get(self.config.objective)
    template = objective.inference_aux_template(model_def.module)
    aux = loading.restore_run_aux(workdir, template, step) if template else None
    batch_stats = loading.restore_run_batch_stats(workdir, model_def.initial_batch_stats(), step)
    super().__init__(
      model_def,
      objective,
      params,
      batch_stats=batch_stats,
      aux=aux,
      tokenizer=tokenizer,
      image_size=int(self.config.input.image_size),
      batch_size=batch_size,
      split_across_processes=split_across_processes,
    )

  def safety_bounds(self) -> dict:
    """HySAC's radius bounds of this run: <workdir>/hysac_bounds.json (the
    converter writes the released one there), else the ones the
    `safety_bounds` or `safety_retrieval` evaluator wrote (<workdir>/eval/<name>/)."""
    from hyperbolic_vl.evaluators.metrics import safety

    return safety.find_bounds(self.workdir)

  def traverse_to_safe(self, embeddings, modality: str, *, bounds=None, alpha: float = 0.8):
    """Predictor.traverse_to_safe with this run's bounds by default."""
    return super().traverse_to_safe(
      embeddings, bounds if bounds is not None else self.safety_bounds(), modality, alpha=alpha
    )

  def traverse_to_safe_image(self, embeddings, **options):
    """The release's HySAC.traverse_to_safe_image: beyond the safe images' bound."""
    return self.traverse_to_safe(embeddings, "image", **options)

  def traverse_to_safe_text(self, embeddings, **options):
    """The release's HySAC.traverse_to_safe_text: beyond the safe texts' bound."""
    return self.traverse_to_safe(embeddings, "text", **options)


def load(
  workdir: str | os.PathLike,
  *,
  step: int | None = None,
  batch_size: int = 256,
  dtype: str = "float32",
  split_across_processes: bool = False,
  cache_dir: str | os.PathLike | None = None,
) -> LoadedModel:
  """The inference handle of `workdir` (see the module docstring), or of a
  released model by name ("meru_vit_l": downloaded, checked and converted
  into the cache `cache_dir` on first use, read from it after; an existing
  folder of that name is read instead; interop/pretrained.py);
  split_across_processes: each process embeds its slice of every call's rows
  (predictor.py), for a multi-process runtime."""
  from hyperbolic_vl.interop import pretrained

  return LoadedModel(
    pretrained.resolve_workdir(workdir, cache_dir=cache_dir),
    step=step,
    batch_size=batch_size,
    dtype=dtype,
    split_across_processes=split_across_processes,
  )
