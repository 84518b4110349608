"""The `config.evals` entries `python -m hyperbolic_vl.evaluate` builds from
its flags: the papers' suites (MERU's Table 2, PHyCLIP's and UNCHA's
tables) and one evaluator from `--eval=TYPE` with its shorthand flags
(`--dataset`, `--split`, `--images`, ...) and `--set=KEY=VALUE`, each
value read as the type of the setting's default; `describe_types` is
`--help_eval`'s text.
"""

from __future__ import annotations

import json
import os

from hyperbolic_vl.evaluators import registry
from hyperbolic_vl.evaluators.datasets import benchmarks


def meru_suite(data_dir: str, flickr_csv: str, flickr_images: str, **common) -> dict:
  """config.evals entries for MERU's Table 2: 20 zero-shot sets + 2 retrieval."""
  evals = {
    name: registry.entry("zero_shot", dataset=name, data_dir=data_dir, **common)
    for name in benchmarks.MERU_ZERO_SHOT_SUITE
  }
  evals["coco"] = registry.entry("retrieval", dataset="coco", data_dir=data_dir, **common)
  flickr = f"csv:{flickr_csv}" if flickr_csv else "flickr30k"
  evals["flickr30k"] = registry.entry(
    "retrieval", dataset=flickr, images=flickr_images, data_dir=data_dir, **common
  )
  return evals


def phyclip_suite(
  data_dir: str,
  flickr_csv: str,
  flickr_images: str,
  sugarcrepe_dir: str,
  coco_val2017: str,
  vl_checklist_dir: str,
  vl_checklist_images: str,
  **common,
) -> dict:
  """PHyCLIP's tables: MERU's zero-shot and retrieval sets (the release's
  eval configs list the same 20 + COCO + Flickr30K), HyCoCLIP's hierarchical
  metrics on ImageNet, SugarCrepe and VL-Checklist (Object Location / Size)."""
  evals = meru_suite(data_dir, flickr_csv, flickr_images, **common)
  evals["imagenet_hierarchy"] = registry.entry(
    "hierarchical_classification", dataset="imagenet", data_dir=data_dir, **common
  )
  evals["sugarcrepe"] = registry.entry(
    "sugarcrepe",
    path=sugarcrepe_dir,
    image_root=coco_val2017,
    batch_size=common["batch_size"],
    num_examples=common["num_examples"],
  )
  evals["vl_checklist"] = registry.entry(
    "vl_checklist",
    path=vl_checklist_dir,
    image_root=vl_checklist_images,
    batch_size=common["batch_size"],
  )
  return evals


def uncha_suite(
  data_dir: str,
  flickr_csv: str,
  flickr_images: str,
  voc2007_dir: str,
  coco_instances: str,
  coco_images: str,
  **common,
) -> dict:
  """UNCHA's tables: MERU's zero-shot and retrieval sets, HyCoCLIP's
  hierarchical metrics on ImageNet, and multi-label mAP on VOC 2007 and COCO
  (defined here: UNCHA released no code for it, see evaluators/multilabel.py)."""
  evals = meru_suite(data_dir, flickr_csv, flickr_images, **common)
  evals["imagenet_hierarchy"] = registry.entry(
    "hierarchical_classification", dataset="imagenet", data_dir=data_dir, **common
  )
  evals["voc2007_multilabel"] = registry.entry(
    "multilabel", dataset="voc2007", path=voc2007_dir, **common
  )
  evals["coco_multilabel"] = registry.entry(
    "multilabel", dataset="coco", path=coco_instances, image_root=coco_images, **common
  )
  return evals


def parse_value(key: str, text: str, default):
  """A --set value read as the type of the setting's default."""
  if isinstance(default, bool):
    if text.lower() in ("1", "true", "yes"):
      return True
    if text.lower() in ("0", "false", "no"):
      return False
    raise ValueError(f"{key}: expected true or false, got {text!r}")
  if default is None or isinstance(default, int):  # None: an optional int
    return None if text.lower() == "none" else int(text)
  if isinstance(default, float):
    return float(text)
  if isinstance(default, (tuple, list)):
    if text.startswith("["):
      return tuple(json.loads(text))
    return tuple(part.strip() for part in text.split(",") if part.strip())
  return text


def settings_from_assignments(type_name: str, assignments) -> dict:
  """{"key": value} from ["key=value", ...], checked against the type's settings."""
  defaults = registry.get(type_name).defaults()
  settings = {}
  for assignment in assignments:
    key, sep, text = assignment.partition("=")
    key = key.strip()
    if not sep or not key:
      raise ValueError(f"--set={assignment!r}: expected KEY=VALUE")
    if key not in defaults or key == "type":
      valid = sorted(k for k in defaults if k != "type")
      raise ValueError(f"--set: {key!r} is not a setting of {type_name!r}; valid: {valid}")
    settings[key] = parse_value(key, text, defaults[key])
  return settings


def shorthand_settings(type_name: str, shorthand: dict) -> dict:
  """Settings from the shorthand flags (see the module docstring), for the
  keys the type has. shorthand: dataset, split, images, data_dir, prompts,
  num_examples, batch_size; empty ones are left out."""
  defaults = registry.get(type_name).defaults()
  settings = {}

  def put(key, value, flag):
    if key not in defaults:
      raise ValueError(f"--{flag} does not apply to evaluator type {type_name!r}")
    settings[key] = value

  dataset = shorthand.get("dataset")
  if dataset:
    if "dataset" in defaults:
      settings["dataset"] = dataset
    elif "source" in defaults:
      if dataset == "world":
        settings["source"] = "world"
      elif dataset.startswith("csv:") and len(dataset) > len("csv:"):
        settings.update(source="hierarcaps", path=dataset[len("csv:") :])
      else:
        raise ValueError(f"--eval={type_name} takes --dataset=world or csv:FILE")
    else:
      raise ValueError(f"--dataset does not apply to evaluator type {type_name!r}")
  if shorthand.get("split"):
    put("split", shorthand["split"], "split")
  if shorthand.get("images"):
    put("images" if "images" in defaults else "image_root", shorthand["images"], "images")
  if shorthand.get("data_dir") and "data_dir" in defaults:
    settings["data_dir"] = shorthand["data_dir"]  # a TFDS directory means nothing to the others
  if shorthand.get("prompts"):
    put("prompts", tuple(shorthand["prompts"]), "prompt")
  for key in ("num_examples", "batch_size"):
    if shorthand.get(key) is not None and key in defaults:
      settings[key] = shorthand[key]
  return settings


def evaluator_name(type_name: str, settings: dict) -> str:
  """The stem of the evaluator's dataset, or its type (suffixed by the stem
  of the file it reads), so that two datasets' figures and files never mix."""

  def stem(path: str) -> str:
    return os.path.splitext(os.path.basename(path.rstrip("/")))[0]

  if settings.get("dataset"):
    return stem(str(settings["dataset"]).split(":", 1)[-1]) or type_name
  if settings.get("path"):
    return f"{type_name}_{stem(str(settings['path']))}"
  return type_name


def one_evaluator(type_name: str, assignments=(), name: str | None = None, **shorthand) -> dict:
  """{name: complete config.evals entry} for one evaluator of `type_name`."""
  settings = shorthand_settings(type_name, shorthand)
  settings.update(settings_from_assignments(type_name, assignments))
  return {name or evaluator_name(type_name, settings): registry.entry(type_name, **settings)}


def describe_types(type_names) -> str:
  lines = []
  for type_name in type_names:
    evaluator_type = registry.get(type_name)
    lines.append(f"{type_name}: {evaluator_type.description}")
    for key, value in evaluator_type.defaults().items():
      if key != "type":
        lines.append(f"    {key} = {value!r}")
  return "\n".join(lines)
