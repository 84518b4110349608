"""Converts a released checkpoint into a normal run directory.

The result is what training writes (`config.json` + an Orbax checkpoint),
holding params only, at step 0, so every reader of a run accepts it:
`--config.init_from=OUT` (fine-tuning), `objective.teacher_workdir=OUT`
(HMID-Net), `evaluate --workdir=OUT` and the loaders built on
`loading.restore_run_params`. It is not a resumable training state (no optimizer
state): start a new run from it with init_from.

Nothing is written unless the conversion succeeds: the run is assembled in
a sibling temporary directory and renamed into place at the end.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile

import jax
import jax.numpy as jnp
import ml_collections
import orbax.checkpoint as ocp
from flax import nnx

from hyperbolic_vl.interop import common, hac, hf_clip, hysac, meru, open_clip, uncha
from hyperbolic_vl.models import registry as models_registry
from hyperbolic_vl.models import tower_options
from hyperbolic_vl.runs import checkpointing

SOURCES = ("meru", "uncha", "open_clip", "hf_clip", "hysac", "hac")

# Every released model of this family uses CLIP's byte-level BPE tokenizer.
RELEASE_TOKENIZER = dict(name="clip_bpe", vocab_size=49408)


def target_param_shapes(config: ml_collections.ConfigDict) -> tuple[dict, dict]:
  """(nested abstract params, flat {name: shape}) of the config's model."""
  module = models_registry.abstract_model(config)
  params = nnx.to_pure_dict(nnx.state(module, nnx.Param))
  return params, common.flat_param_shapes(params)


def convert_state_dict(
  source_kind: str,
  tensors: dict,
  config: ml_collections.ConfigDict,
  *,
  ignore: tuple[str, ...] = (),
) -> tuple[dict, list[str]]:
  """(nested float32 params for `config`'s model, ignored source names)."""
  if source_kind not in SOURCES:
    raise common.ConversionError(f"--source={source_kind!r}; valid: {SOURCES}")
  template, shapes = target_param_shapes(config)
  options = tower_options.tower_options(config.model)
  if source_kind == "meru":
    fixed_curv = None
    if config.model.get("geometry") == "lorentz" and not config.model.get("learn_curv", True):
      fixed_curv = float(config.model.curv_init)
    conversion = meru.convert(
      tensors,
      shapes,
      pixel_stats=options["pixel_stats"],
      fixed_curv=fixed_curv,
      extra_ignored=ignore,
    )
  elif source_kind == "uncha":
    flat, ignored = uncha.convert(
      tensors, shapes, pixel_stats=options["pixel_stats"], extra_ignored=ignore
    )
    return common.unflatten(flat, template), ignored
  elif source_kind == "open_clip":
    conversion = open_clip.convert(
      tensors, shapes, image_size=config.input.image_size, extra_ignored=ignore
    )
  elif source_kind == "hysac":
    # Adapters kept when the config has LoRA (configs/hysac.py:vit_l14),
    # merged into the base weights when it has none.
    conversion = hysac.convert(tensors, shapes, extra_ignored=ignore)
  elif source_kind == "hac":
    # As HySAC: adapters kept for configs/hac.py, merged for a config without LoRA.
    conversion = hac.convert(
      tensors, shapes, pixel_stats=options["pixel_stats"], extra_ignored=ignore
    )
  else:
    conversion = hf_clip.convert(tensors, shapes, extra_ignored=ignore)
  flat, ignored = conversion.finish()
  return common.unflatten(flat, template), ignored


def write_workdir(
  params: dict,
  config: ml_collections.ConfigDict,
  workdir: str,
  *,
  batch_stats: dict | None = None,
  aux: dict | None = None,
) -> None:
  """Writes config.json + a checkpoint at step 0 holding the params, and
  where given a ResNet tower's running statistics (`batch_stats`) and the
  objective's state (`aux`, dtypes kept), atomically."""
  workdir = os.path.abspath(workdir)
  if os.path.exists(workdir) and os.listdir(workdir):
    raise FileExistsError(f"{workdir} exists and is not empty; choose a new --workdir")
  parent = os.path.dirname(workdir)
  os.makedirs(parent, exist_ok=True)
  staging = tempfile.mkdtemp(prefix=f".{os.path.basename(workdir)}.", dir=parent)
  try:
    with open(os.path.join(staging, "config.json"), "w") as f:
      json.dump(checkpointing.json_config(config), f, indent=2, sort_keys=True)
    manager = ocp.CheckpointManager(
      os.path.join(staging, "checkpoints"), options=ocp.CheckpointManagerOptions(create=True)
    )
    state = {"params": jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), params)}
    if batch_stats:
      state["batch_stats"] = jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), batch_stats)
    if aux:
      state["aux"] = jax.tree.map(jnp.asarray, aux)
    manager.save(
      0, args=ocp.args.Composite(state=ocp.args.StandardSave(state), data=ocp.args.JsonSave({}))
    )
    manager.wait_until_finished()
    manager.close()
    if os.path.exists(workdir):
      os.rmdir(workdir)  # empty, checked above
    os.rename(staging, workdir)
  except BaseException:
    shutil.rmtree(staging, ignore_errors=True)
    raise


def release_config(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """The config as saved with the converted weights: CLIP's tokenizer, no
  init_from (the weights are in the run itself)."""
  config = ml_collections.ConfigDict(config.to_dict())
  config.input.tokenizer.update(RELEASE_TOKENIZER)
  config.init_from = ""
  return config


def convert_checkpoint(
  source_kind: str,
  checkpoint: str,
  config: ml_collections.ConfigDict,
  workdir: str,
  *,
  ignore: tuple[str, ...] = (),
  bounds: str = "",
) -> dict:
  """Reads, converts and writes; returns a summary (counts, ignored names).
  `bounds`: HySAC's hysac_bounds.json, checked and written into the run."""
  tensors = common.load_state_dict(checkpoint)
  config = release_config(config)
  params, ignored = convert_state_dict(source_kind, tensors, config, ignore=ignore)
  bounds_text = None
  if bounds:
    from hyperbolic_vl.evaluators.metrics import safety

    bounds_text = safety.bounds_json(safety.read_bounds(bounds))
  write_workdir(params, config, workdir)
  if bounds_text is not None:
    with open(os.path.join(workdir, safety.BOUNDS_FILE), "w") as f:
      f.write(bounds_text)
  return dict(
    workdir=os.path.abspath(workdir),
    source_tensors=len(tensors),
    params=int(sum(x.size for x in jax.tree.leaves(params))),
    ignored=ignored,
  )
