"""The public inference handle: `hyperbolic_vl.load(workdir)`.

One way to embed data with any run (trained here or converted from a
release): the evaluation command, colabs and converters go through it.

    m = hyperbolic_vl.load("runs/meru")
    image_emb = m.encode_images(images)   # (N, H, W, 3) uint8 or float in [0, 1]
    text_emb = m.encode_texts(["a dog", "a cat"])
    scores = m.similarity(image_emb, text_emb)   # (N, M), the objective's score

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
from hyperbolic_vl.runs import checkpointing


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
    self.config, model_def, params, tokenizer = checkpointing.restore_run_params(
      workdir, step, dtype=dtype
    )
    objective = objectives_lib.get(self.config.objective)
    template = objective.inference_aux_template(model_def.module)
    aux = checkpointing.restore_run_aux(workdir, template, step) if template else None
    batch_stats = checkpointing.restore_run_batch_stats(
      workdir, model_def.initial_batch_stats(), step
    )
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


def load(
  workdir: str | os.PathLike,
  *,
  step: int | None = None,
  batch_size: int = 256,
  dtype: str = "float32",
  split_across_processes: bool = False,
) -> LoadedModel:
  """The inference handle of `workdir` (see the module docstring);
  split_across_processes: each process embeds its slice of every call's rows
  (predictor.py), for a multi-process runtime."""
  return LoadedModel(
    workdir,
    step=step,
    batch_size=batch_size,
    dtype=dtype,
    split_across_processes=split_across_processes,
  )
