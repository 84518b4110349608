"""A run's weights out of JAX: `python -m hyperbolic_vl.export`.

  python -m hyperbolic_vl.export --workdir=runs/meru_vit_s --format=meru \
      --output=meru_vit_s.pth
  python -m hyperbolic_vl.export --workdir=runs/openai_b32 --format=open_clip \
      --output=b32.pt
  python -m hyperbolic_vl.export --workdir=runs/any --format=safetensors \
      --output=any.safetensors

Formats:
  meru         MERU's `{"model": state_dict}` torch file, which MERU's own
               `CheckpointManager(model=model).load(path)` (a strict
               `load_state_dict` of `torch.load(path)["model"]`) reads:
               Lorentz (MERU, ATMG, HyCoCLIP) and Euclidean (MERU's CLIP
               baseline) two-tower ViT runs of MERU's architecture.
  open_clip    open_clip's bare state dict, for
               `open_clip.create_model(name, pretrained=FILE)`: Euclidean
               (CLIP) two-tower runs of OpenAI's ViT layout.
  safetensors  every param under its "/"-joined name (running statistics
               under "batch_stats/", inference state such as a stored root
               under "aux/"), for any run, and a JSON file beside it (same
               stem, `.json`; also in the file's metadata) holding the
               run's `model` config, image size, tokenizer and objective:
               what `read_safetensors` needs to rebuild the params.
  uncha        UNCHA's checkpoint layout (hyperbolic_vl/interop/uncha.py):
               MERU's `{"model": state_dict}` plus the three learned logit
               scales, for UNCHA runs of MERU's architecture (what
               `convert --source=uncha` reads).
  hysac        HySAC's `hysac_model.pth` (hyperbolic_vl/interop/hysac.py):
               PEFT-wrapped Hugging Face CLIP keys, the run's LoRA adapters
               kept as lora_A / lora_B (not merged), the run's
               hysac_bounds.json written beside the file.
  hac          HAC's `hac_vit_b_lora.pth` (hyperbolic_vl/interop/hac.py):
               `{"model": ...}` with PEFT-wrapped MERU towers, attention
               split into q/k/v/proj, the run's LoRA adapters kept as
               lora_A / lora_B (not merged).

The params are restored in float32 as every reader of a run restores them
(`loading.restore_run_params`), LoRA adapters merged into the base
weights (`_base_layout`; the written config then has none), and mapped
with the same tables the converters read releases with
(hyperbolic_vl/interop), so an export followed by a conversion gives the
run's params back exactly. Each file is written aside and renamed into
place. A run the format cannot hold, a missing workdir or an output that
cannot be written fails with one line (exit code 2) before anything is
written. The releases' torch files need the `interop` extra (torch);
safetensors needs the `safetensors` package only.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import tempfile
from collections.abc import Mapping
from typing import Any

from absl import app, flags

from hyperbolic_vl import errors

FORMATS = ("meru", "uncha", "open_clip", "safetensors", "hysac", "hac")
# Name prefixes of what a safetensors export holds beside the params.
EXTRA_GROUPS = ("batch_stats", "aux")
# The safetensors export's metadata "format"; the converter refuses such a
# file in one line (interop.common.OWN_SAFETENSORS_FORMAT, the same string).
SAFETENSORS_FORMAT = "hyperbolic_vl.export/safetensors/1"


class ExportError(errors.UserError, ValueError):
  """The run cannot be written in the format asked for."""


def define_flags() -> None:
  """The command line's flags, defined only when this module is the program."""
  errors.define_log_info_flag()
  flags.DEFINE_string("workdir", None, "Run directory (config.json + checkpoints).")
  flags.DEFINE_string("format", None, f"One of {', '.join(FORMATS)}.")
  flags.DEFINE_string("output", None, "File to write (its folder is created if needed).")
  flags.DEFINE_integer("step", None, "Checkpoint step to export (default: latest).")
  flags.DEFINE_bool("verbose", False, "Show the traceback of a workdir or format error.")


FLAGS = flags.FLAGS


def _base_layout(run_config, params: dict):
  """(config, params) of the base model: LoRA adapters folded into the
  kernels they adapt (`lora.merge_adapters`) and the config's adapters off,
  so every format holds plain base weights that compute what the adapted
  run computes. A run without adapters passes unchanged."""
  from hyperbolic_vl.models import lora

  if not lora.has_adapters(params):
    return run_config, params
  return lora.without_lora_config(run_config), lora.merge_adapters(params, run_config.model)


# -- which runs each format holds -------------------------------------------
def _unsupported(format_name: str, run_config) -> str | None:
  """Why `format_name` cannot hold the run of `run_config` (None: it can)."""
  from hyperbolic_vl.models import registry as models_registry
  from hyperbolic_vl.models import resnet, tower_options

  if format_name == "safetensors":
    return None
  model = run_config.model
  name = models_registry.model_name(model)
  if name != "two_towers":
    return f"model.name={name!r} (the format holds two-tower models, model.name='two_towers')"
  variant = str(model.get("image_variant", ""))
  if resnet.is_resnet_variant(variant) or variant.startswith("RN"):
    return f"model.image_variant={variant!r} is a ResNet (the format holds ViT image towers)"
  geometry = model.get("geometry", "lorentz")
  options = tower_options.tower_options(model)
  if format_name == "hysac":
    required = dict(image_ln_pre=True, image_patch_bias=False, image_position_embedding="learned")
    if geometry != "lorentz":
      return f"model.geometry={geometry!r} (HySAC's model is 'lorentz')"
  elif format_name == "uncha":
    required = dict(image_ln_pre=False, image_patch_bias=True, activation="gelu")
    scales = sorted(dict(model.get("extra_logit_scales") or {}))
    if geometry != "lorentz" or scales != ["global_local", "local"]:
      return (
        f"model.geometry={geometry!r} with model.extra_logit_scales={scales} (UNCHA's model is "
        "'lorentz' with the 'local' and 'global_local' scales: an objective 'uncha' run)"
      )
    if model.get("factor_dim", 0) or not model.get("learn_alphas", True):
      return "a product of spaces or fixed alphas (UNCHA's model has neither)"
  elif format_name == "hac":
    required = dict(image_ln_pre=False, image_patch_bias=True, activation="gelu")
    if geometry != "lorentz" or model.get("factor_dim", 0) or not model.get("learn_alphas", True):
      return "not a one-space Lorentz model with learned alphas (HAC's model is one)"
  elif format_name == "meru":
    required = dict(image_ln_pre=False, image_patch_bias=True, activation="gelu")
    if geometry not in ("lorentz", "euclidean"):
      return f"model.geometry={geometry!r} (MERU's models are 'lorentz' or 'euclidean')"
    if geometry == "lorentz" and not model.get("learn_alphas", True):
      return "model.learn_alphas=False (MERU's model stores learned alphas)"
    factor_dim = model.get("factor_dim", 0) or 0
    if factor_dim and not model.get("learn_curv", True):
      return (
        f"model.learn_curv=False with model.factor_dim={factor_dim} (PHyCLIP's release "
        "stores learned per-factor curvatures)"
      )
  else:
    required = dict(image_ln_pre=True, image_patch_bias=False, image_position_embedding="learned")
    if geometry != "euclidean":
      # Only a format that holds the run is offered: an OpenAI-layout
      # Lorentz run (configs/adapt_clip.py) fits neither torch format.
      other = (
        "try --format=meru"
        if _unsupported("meru", run_config) is None
        else "--format=safetensors holds every run"
      )
      return f"model.geometry={geometry!r} (open_clip's CLIP is 'euclidean'; {other})"
  for key, value in required.items():
    if options[key] != value:
      train = ""
      if format_name == "hysac":
        # The tiny HySAC config has MERU's towers; the release's are OpenAI's.
        train = (
          "; a run to export as HySAC's trains with the release's tower layout: "
          "--config.model.image_ln_pre=True --config.model.image_patch_bias=False "
          "--config.model.image_position_embedding=learned"
        )
      return (
        f"model.{key}={options[key]!r} (the format's towers have {key}={value!r}; "
        f"--format=safetensors holds every run{train})"
      )
  return None


def _torch():
  try:
    import torch  # optional dependency (interop extra)
  except ImportError as error:
    raise ExportError(
      "--format=meru, uncha, open_clip and hysac write torch files and need torch: "
      "pip install 'hyperbolic_vl[interop]' (or use --format=safetensors)"
    ) from error
  return torch


def _safetensors_save():
  try:
    from safetensors.numpy import save  # optional dependency (interop extra)
  except ImportError as error:
    raise ExportError(
      "--format=safetensors needs safetensors: pip install 'hyperbolic_vl[interop]'"
    ) from error
  return save


def _check_output(output: str, format_name: str) -> str:
  """The absolute output path, or a one-line error if it cannot be written
  (tried with a scratch file in its folder, or the nearest folder that
  exists when it is still to be created)."""
  path = os.path.abspath(output)
  if os.path.isdir(path):
    raise ExportError(f"--output={output} is a folder; name a file")
  if format_name == "safetensors" and path.endswith(".json"):
    raise ExportError(f"--output={output}: the config is written beside it as .json; name another")
  existing = os.path.dirname(path)
  while not os.path.exists(existing):
    existing = os.path.dirname(existing)
  if not os.path.isdir(existing):
    raise ExportError(f"--output={output}: {existing} is not a folder")
  try:
    descriptor, scratch = tempfile.mkstemp(prefix=".export_check.", dir=existing)
  except OSError as error:
    raise ExportError(f"--output={output}: cannot write in {existing} ({error.strerror})") from None
  os.close(descriptor)
  os.unlink(scratch)
  return path


def config_path_for(output: str) -> str:
  """Where a safetensors export's JSON config goes: beside it, same stem."""
  stem, extension = os.path.splitext(output)
  return (stem if extension == ".safetensors" else output) + ".json"


# -- restoring the run ----------------------------------------------------------
@dataclasses.dataclass
class RestoredRun:
  config: Any  # the run's config.json
  params: dict  # nested float32 numpy arrays, as the run holds them
  batch_stats: dict  # {} without batch norms
  aux: dict  # what inference needs beyond the params ({} mostly)
  vocab_size: int
  context_length: int


def restore(workdir: str, step: int | None = None, merge: bool = True) -> RestoredRun:
  """The run's params (float32, adapters merged unless `merge` is False),
  running statistics and inference aux, as `hyperbolic_vl.load` restores them."""
  import jax
  import numpy as np

  from hyperbolic_vl import objectives as objectives_lib
  from hyperbolic_vl.runs import loading

  run_config, model_def, params, tokenizer = loading.restore_run_params(
    workdir, step, dtype="float32"
  )
  on_host = lambda tree: jax.tree.map(np.asarray, jax.device_get(tree))
  if merge:
    run_config, params = _base_layout(run_config, jax.device_get(params))
  params = jax.tree.map(lambda x: np.asarray(x, np.float32), jax.device_get(params))
  batch_stats = loading.restore_run_batch_stats(workdir, model_def.initial_batch_stats(), step)
  template = objectives_lib.get(run_config.objective).inference_aux_template(model_def.module)
  aux = loading.restore_run_aux(workdir, template, step) if template else {}
  return RestoredRun(
    config=run_config,
    params=params,
    batch_stats=on_host(batch_stats),
    aux=on_host(aux),
    vocab_size=int(tokenizer.vocab_size),
    context_length=int(tokenizer.context_length),
  )


# -- the formats --------------------------------------------------------------
def _torch_file(torch, tensors: Mapping, wrap_in_model: bool) -> bytes:
  import numpy as np

  state_dict = {
    name: torch.from_numpy(np.array(value, order="C")) for name, value in tensors.items()
  }
  buffer = io.BytesIO()
  torch.save({"model": state_dict} if wrap_in_model else state_dict, buffer)
  return buffer.getvalue()


def model_summary(run: RestoredRun) -> dict:
  """The JSON config of a safetensors export: what rebuilds the model."""
  from hyperbolic_vl.runs import checkpointing

  config = checkpointing.json_config(run.config)
  tokenizer = dict(config["input"]["tokenizer"])
  tokenizer.update(vocab_size=run.vocab_size, context_length=run.context_length)
  return dict(
    format=SAFETENSORS_FORMAT,
    model=config["model"],
    image_size=int(config["input"]["image_size"]),
    tokenizer=tokenizer,
    objective=config["objective"],
  )


def _safetensors_tensors(run: RestoredRun) -> dict:
  import numpy as np

  from hyperbolic_vl.interop import common

  tensors = {name: np.asarray(value) for name, value in common.flatten(run.params).items()}
  clashes = sorted(name for name in tensors if name.split("/")[0] in EXTRA_GROUPS)
  if clashes:
    raise ExportError(f"params named like the file's groups {EXTRA_GROUPS}: {clashes[:3]}")
  for group in EXTRA_GROUPS:
    for name, value in common.flatten(getattr(run, group)).items():
      tensors[f"{group}/{name}"] = np.asarray(value)
  return tensors


def _release_tensors(format_name: str, run: RestoredRun) -> dict:
  """The release's state dict of the run's base-layout params (interop's
  tables, backwards)."""
  from hyperbolic_vl.interop import common, hac, hysac, meru, open_clip, uncha
  from hyperbolic_vl.models import tower_options

  model = run.config.model
  image_size = int(run.config.input.image_size)
  flat_params = common.flatten(run.params)
  try:
    if format_name == "hysac":
      return hysac.export(flat_params)
    if format_name == "hac":
      pixel_stats = tower_options.tower_options(model)["pixel_stats"]
      return hac.export(flat_params, pixel_stats=pixel_stats, image_size=image_size)
    if format_name == "open_clip":
      return open_clip.export(flat_params, image_size=image_size)
    fixed_curv = None
    if model.get("geometry", "lorentz") == "lorentz" and not model.get("learn_curv", True):
      fixed_curv = float(model.curv_init)
    return (uncha if format_name == "uncha" else meru).export(
      flat_params,
      pixel_stats=tower_options.tower_options(model)["pixel_stats"],
      image_size=image_size,
      fixed_curv=fixed_curv,
    )
  except common.ExportError as error:
    raise ExportError(f"--format={format_name} cannot hold this run: {error}") from None


def _without_training_only_params(run: RestoredRun) -> tuple[RestoredRun, list[str]]:
  """The run without the params that only shape the loss (the learned
  entailment weight of `objective.entail_weight_learned`): no release
  layout has a place for them and no embedding reads them, so they are left
  out with a note rather than refusing the run."""
  from hyperbolic_vl.objectives import entailment_weight

  if entailment_weight.PARAM not in run.params:
    return run, []
  params = {k: v for k, v in run.params.items() if k != entailment_weight.PARAM}
  value = float(run.params[entailment_weight.PARAM])
  note = (
    f"not in this format: {entailment_weight.PARAM} = {value:.4g} (the learned entailment "
    "weight's log factor; it weights the training loss only, no embedding reads it): dropped"
  )
  return dataclasses.replace(run, params=params), [note]


def _reader_notes(format_name: str, run: RestoredRun) -> list[str]:
  """What a user of the written file must know that the file cannot say."""
  from hyperbolic_vl.interop import common
  from hyperbolic_vl.models import tower_options

  notes = []
  options = tower_options.tower_options(run.config.model)
  if format_name == "open_clip":
    if options["activation"] == "quick_gelu":
      notes.append("QuickGELU towers: load into a '-quickgelu' model (e.g. ViT-B-32-quickgelu)")
    if options["pixel_stats"] != "openai":
      notes.append(f"normalise pixels with pixel_stats={options['pixel_stats']!r}")
  if run.aux and format_name != "safetensors":
    notes.append(f"not in this format: inference state {sorted(common.flatten(run.aux))}")
  return notes


def export_run(workdir: str, format_name: str, output: str, *, step: int | None = None) -> dict:
  """Writes the run in `workdir` to `output` in `format_name`; returns a
  summary (output, config file, tensor and param counts, notes for the
  reader). Raises ExportError / WorkdirError (one line) when it cannot,
  before writing anything."""
  if format_name not in FORMATS:
    raise ExportError(f"--format={format_name!r} is unknown; valid: {list(FORMATS)}")
  path = _check_output(output, format_name)
  if not os.path.isfile(os.path.join(workdir, "config.json")):
    raise errors.WorkdirError(f"--workdir={workdir}: no such run directory (no config.json)")
  from hyperbolic_vl import files
  from hyperbolic_vl.runs import checkpointing

  reason = _unsupported(format_name, checkpointing.load_run_config(workdir))
  if reason:
    raise ExportError(f"--format={format_name} cannot hold this run: {reason}")
  # The writing library is checked before the (long) restore.
  torch = _torch() if format_name != "safetensors" else None
  save_safetensors = _safetensors_save() if format_name == "safetensors" else None

  import numpy as np

  from hyperbolic_vl.interop import common

  # HySAC's and HAC's files keep their LoRA adapters apart (PEFT's lora_A / lora_B).
  run = restore(workdir, step, merge=format_name not in ("hysac", "hac"))
  dropped = []
  if format_name != "safetensors":
    run, dropped = _without_training_only_params(run)
  flat_params = common.flatten(run.params)
  config_path = None
  if format_name == "safetensors":
    tensors = _safetensors_tensors(run)
    config_text = json.dumps(model_summary(run), indent=2, sort_keys=True)
    data = save_safetensors(tensors, metadata={"format": SAFETENSORS_FORMAT, "config": config_text})
    config_path = config_path_for(path)
  else:
    tensors = _release_tensors(format_name, run)
    data = _torch_file(torch, tensors, wrap_in_model=format_name in ("meru", "uncha", "hac"))
  files.write_file_atomically(path, data)
  if format_name == "hysac":
    config_path = _write_hysac_bounds(workdir, path)
  if config_path and format_name == "safetensors":
    files.write_file_atomically(config_path, config_text + "\n")
  return dict(
    output=path,
    config=config_path,
    tensors=len(tensors),
    params=int(sum(np.size(value) for value in flat_params.values())),
    notes=dropped + _reader_notes(format_name, run),
  )


def _write_hysac_bounds(workdir: str, output: str) -> str | None:
  """The run's hysac_bounds.json (hyperbolic_vl.load finds it) copied beside
  the exported weights, as the release ships them; None when it has none."""
  from hyperbolic_vl import files
  from hyperbolic_vl.evaluators.metrics import safety

  try:
    bounds = safety.find_bounds(workdir)
  except FileNotFoundError:
    return None
  target = os.path.join(os.path.dirname(output), safety.BOUNDS_FILE)
  files.write_file_atomically(target, safety.bounds_json(bounds))
  return target


# -- reading a safetensors export back ---------------------------------------------
@dataclasses.dataclass
class Exported:
  config: dict  # the JSON config (model, image_size, tokenizer, objective)
  params: dict  # nested like the model's params
  batch_stats: dict
  aux: dict


def read_safetensors(path: str, config_path: str | None = None) -> Exported:
  """A safetensors export and its JSON config -> nested params (shaped by
  the model the config builds), running statistics and aux."""
  import ml_collections
  from safetensors.numpy import load_file

  from hyperbolic_vl import objectives as objectives_lib
  from hyperbolic_vl.interop import common
  from hyperbolic_vl.models import registry as models_registry

  with open(config_path or config_path_for(path)) as f:
    config = json.load(f)
  tensors = load_file(path)
  run_config = ml_collections.ConfigDict(
    dict(
      model=config["model"],
      input=dict(image_size=config["image_size"], tokenizer=config["tokenizer"]),
    )
  )
  model_def, template = models_registry.ModelDef.from_module(
    models_registry.abstract_model(run_config)
  )
  groups = {group: {} for group in ("params", *EXTRA_GROUPS)}
  for name, value in tensors.items():
    group, _, rest = name.partition("/")
    if group in EXTRA_GROUPS:
      groups[group][rest] = value
    else:
      groups["params"][name] = value
  aux_template = objectives_lib.get(config["objective"]).inference_aux_template(model_def.module)
  templates = dict(
    params=template, batch_stats=model_def.initial_batch_stats(), aux=aux_template or {}
  )
  nested = {}
  for group, flat in groups.items():
    expected = set(common.flat_param_shapes(templates[group]))
    if set(flat) != expected:
      missing, extra = sorted(expected - set(flat)), sorted(set(flat) - expected)
      raise ValueError(f"{path}: {group} do not fit the config: missing {missing}, extra {extra}")
    nested[group] = common.unflatten(flat, templates[group]) if flat else {}
  return Exported(config=config, **nested)


@errors.report_user_errors
def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  errors.quiet_library_info()
  for name in ("workdir", "format", "output"):
    if not FLAGS[name].value:
      raise ExportError(f"--{name} is required")
  summary = export_run(FLAGS.workdir, FLAGS.format, FLAGS.output, step=FLAGS.step)
  print(
    f"wrote {summary['output']}: {summary['params']:,} parameters in {summary['tensors']} tensors"
  )
  if summary["config"]:
    print(f"wrote {summary['config']}")
  for note in summary["notes"]:
    print(f"  note: {note}")


if __name__ == "__main__":
  define_flags()
  app.run(main)
