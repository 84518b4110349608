"""Every documented `python -m hyperbolic_vl.<module>` command runs as written.

tests/test_docs.py collects the commands of README.md and docs/**/*.md
(`documented_commands`) and checks their flags and config keys against the
code. Here each one runs, with its documented flags, after one shrinking
rule applied to every command alike; nothing else is added or changed, so a
documented flag or key combination that fails as written fails here.

The shrinking rule:

(a) Model size. `--config=FILE[:ARGS]` is kept as written (its variant and
    arguments choose the data source, tokenizer, schedule and evaluators the
    documented overrides refer to, e.g. `evals.imagenet.data_dir` exists only
    for a paper variant). The towers are shrunk by keys instead: a ViT's
    `model.image_variant` becomes "mu/<its patch size>" (a ResNet's "RN-mu"),
    an explicit `model.image_num_heads` becomes 2 (mu's), and
    `model.text_variant` becomes "mu"; a benchmark's random teacher
    (`objective.teacher_model`) is shrunk alike.
(b) Data. A path a command reads is pointed at a few examples of the same
    format (tests/fixtures/documented_data.py) written at that path, and a
    checkpoint that `convert` reads is a release-format file of the shapes
    its (shrunk) config asks for. `$HIERARCAPS` is the HierarCaps sample of
    tests/fixtures. Two placeholders of the docs get values: `tfds:NAME` the
    fixture TFDS dataset noise2048, `clip_teacher_radius=R` 1.0 (its default).
(c) Paths. Each command runs in its own folder (with `configs/` linked in):
    relative paths land there, and an absolute path `/P` becomes that folder's
    `P`. A run a command reads (`--workdir` of evaluate, export and plot,
    `init_from`, `teacher_workdir`) is linked to the folder of
    the documented command that writes it (the nearest above it in the same
    file, else the first), which runs first; where the docs name no command
    writing it, `RUN_STAND_INS` names a documented run of the same shapes.
(d) Length and batch. Of `--config.*`, only `total_steps` (to 2; also when 0,
    i.e. sized in epochs), `input.batch_size` (to 8) and `input.image_size`
    (to 32, rounded up to a multiple of the ViT's patch: 42 for /14) where
    larger, and each evaluator's `evals.<name>.num_examples` (to 64) where
    larger or unset (the whole set); of tools.step_throughput's flags,
    `--steps` (to 2) and `--warmup` (to 1) where larger. A documented value
    of one of these keys is replaced in place, the others are appended.
(a) and (d) apply to every command with `--config=` (main, convert,
tools.step_throughput); no other key or flag is ever set.

Each command must exit 0 with no traceback, and leave what it is for: a
trained run's metrics.jsonl reaches step 2 with finite losses, a conversion
its config and checkpoint, an export its file, an evaluation its --output /
--results / --table / --plot files (safety_bounds its bounds file), a plot
its PNGs.

Commands identical after shrinking, up to the run folder they write, run once
(a reader of either folder reads that run). Each command is a subprocess
(`python -m`, as documented): every program defines its absl flags into the
one global FLAGS, so two of them cannot be run in one interpreter. Under
pytest-xdist a command and the runs it reads are run once per session, by
whichever worker asks first (a file lock; results cached as JSON), so a run
read by many commands trains once.

A command that cannot run on a CPU-only machine is listed in
CANNOT_RUN_HERE with the reason, and a test keeps that list to commands still
in the docs.
"""

from __future__ import annotations

import dataclasses
import fcntl
import functools
import importlib.util
import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import documented_data as data
import pytest
from paths import REPO

# The parser of tests/test_docs.py, imported rather than copied (tests/ is
# not a package, so by its path).
_spec = importlib.util.spec_from_file_location("_docs_checks", REPO / "tests" / "test_docs.py")
docs_checks = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(docs_checks)

# (d): the values the rule sets.
STEPS, BATCH, IMAGE_SIZE, EVAL_EXAMPLES = 2, 8, 32, 64
TOOL_STEPS, TOOL_WARMUP = 2, 1
# (b): placeholders of the docs, by the value that stands for them.
PLACEHOLDERS = {"tfds:NAME": "tfds:noise2048", "R": "1.0"}
HIERARCAPS = "hierarcaps"  # $HIERARCAPS, a folder in the command's own folder

# (b): documented path -> the builder of its fixture (a path inside a
# documented folder, e.g. $HIERARCAPS/images, is served by the folder's).
DATA_FIXTURES = {
  "/data/captions.csv": data.captions_csv,
  "/data/images": data.image_folder,
  "/data/redcaps/shard-{000000..000099}.tar": data.tar_shards,
  "/data/grit/processed/{00000..01023}.tar": data.grit_shards,
  "/data/grit/{00000..01023}.tar": data.grit_shards,
  "/data/coco/annotations/instances_train2017.json": data.coco_instances,
  "/data/coco/annotations/captions_train2017.json": data.coco_captions,
  "/data/coco/train2017": data.coco_image_folder,
  "/data/instances_train2017.json": data.coco_instances,
  "/data/train2017": data.coco_image_folder,
  "/data/visu/train/visu_train.json": data.visu_split,
  "/data/visu/test/visu_test.json": data.visu_split,
  "/data/coco": data.visu_coco,
  "/data/visu/unsafe_images": data.visu_unsafe_images,
  "hierarcaps_train.csv": data.hierarcaps_train_csv,
  HIERARCAPS: data.hierarcaps_folder,
  "hierarcaps_test.csv": data.hierarcaps_test_csv,
  "flickr30k_test.csv": data.captions_csv,
  "/data/flickr30k/images": data.image_folder,
  "FILE.csv": data.captions_csv,
  "DIR": data.images_and_tfds_noise,
  "/data/tfds": data.tfds_folder,
  "sugar-crepe/data": data.sugarcrepe_data,
  "/data/coco/val2017": data.sugarcrepe_images,
  "VL-CheckList": data.vl_checklist_checkout,
  "/data/vl_checklist_images": data.vl_checklist_images,
  "/data/VOCdevkit/VOC2007": data.voc2007,
  "/data/coco/annotations/instances_val2014.json": data.coco_instances,
  "/data/coco/val2014": data.coco_image_folder,
  "/data/imagenet/val": data.imagenet_folder,
  "/data/VQA": data.vqa_folders,
}

# (c): runs the docs read but no documented command writes -> a documented
# run of the same shapes after shrinking.
RUN_STAND_INS = {
  # "any run": the README's Quick start run.
  "RUN": "workdirs/meru_tiny",
  "runs/any": "workdirs/meru_tiny",
  # A converted MERU release of MERU's layout (vit_s and vit_l shrink alike).
  "runs/meru_vit_s": "runs/meru_vit_l",
  # A paper-scale MERU run: meru.py:vit_b and :vit_l shrink to one model.
  "runs/meru_b": "/runs/meru_l",
  # The tiny CLIP run of configs/clip.py.
  "workdirs/clip_tiny": "runs/clip",
  # HyCoCLIP's released CLIP ViT-B/16 (a download): a trained configs/clip.py:vit_b
  # run has its shapes, as HAC's recipe starts from it.
  "runs/clip_vit_b_grit": "/runs/clip_b",
}

# The documented command (as test_docs tokenizes it, joined) -> why it
# cannot run on this CPU-only machine.
CANNOT_RUN_HERE = {
  "hyperbolic_vl.tools.step_throughput --config=configs/meru.py:vit_b "
  "--config.input.batch_size=256 --steps=10 --attention=cudnn "
  "--config.model.activation=gelu_tanh": (
    "asks for cuDNN's fused attention, which needs an NVIDIA GPU (on a CPU the request "
    "is one ConfigError line: tests/models/test_transformer_options.py)"
  ),
  "hyperbolic_vl.main --multihost --coordinator_address=HOST:PORT --num_processes=2 "
  "--process_id=0 --config=configs/meru.py --workdir=runs/meru_2proc": (
    "one process of a two-process run (--multihost); two processes of it run in "
    "tests/integration/test_multihost.py"
  ),
  "hyperbolic_vl.evaluate --multihost --coordinator_address=127.0.0.1:PORT --num_processes=2 "
  "--process_id=I --workdir=RUN --suite=config --output=eval.json": (
    "one process of a two-process evaluation (--multihost); two processes of it run in "
    "tests/integration/test_multihost_evaluation.py"
  ),
  "hyperbolic_vl.evaluate --workdir=RUN --eval=hierarchical_classification --dataset=imagenet "
  "--tfds_data_dir=/data/tfds --output=RUN/hier.json": (
    "TFDS ImageNet (imagenet2012, validation split): the command has nothing else to evaluate"
  ),
  # Released models by name (docs/interop.md): tests/interop/test_pretrained.py
  # runs these paths against a release it serves on 127.0.0.1.
  "hyperbolic_vl.convert --pretrained=meru_vit_l": "downloads MERU's release (network)",
  "hyperbolic_vl.convert --pretrained=meru_vit_l --workdir=runs/meru_vit_l": (
    "downloads MERU's release (network)"
  ),
  "hyperbolic_vl.convert --pretrained=meru_vit_l --checkpoint=meru_vit_l.pth": (
    "converts MERU's released ViT-L file itself (no --config to shrink)"
  ),
  "hyperbolic_vl.convert --pretrained=clip_vit_b_grit --workdir=runs/clip_vit_b_grit": (
    "downloads HyCoCLIP's CLIP release (network)"
  ),
  "hyperbolic_vl.convert --pretrained=hac_vit_b_lora --workdir=runs/hac_vit_b_lora": (
    "downloads HAC's release (network)"
  ),
  "hyperbolic_vl.convert --pretrained=hac_vit_b_lora --checkpoint=hac_vit_b_lora.pth "
  "--workdir=runs/hac_vit_b_lora": (
    "converts HAC's released file itself (no --config to shrink); the same file by "
    "--source=hac --config=configs/hac.py:vit_b runs below it in docs/methods/hac.md"
  ),
  # plot --compare reads runs that no documented command writes under these
  # names; tests/plots/test_compare_curves.py runs the command on two runs.
  "hyperbolic_vl.plot --compare=workdirs/meru_tiny,workdirs/clip_tiny": (
    "compares two runs of which only the first is written by a documented command"
  ),
  "hyperbolic_vl.plot --compare=runs/meru_tiny,runs/meru_tiny_weight50 "
  "--output_dir=docs/gallery/collapse": (
    "compares two runs that no documented command writes under these names"
  ),
  "hyperbolic_vl.plot --compare=runs/meru_tiny,runs/meru_tiny_learned_weight "
  "--output_dir=docs/gallery/entail_weight": (
    "compares the learned-weight run with runs/meru_tiny, which no documented command writes"
  ),
}

# Programs whose --workdir is a run they read (main and convert write theirs).
READERS = ("hyperbolic_vl.evaluate", "hyperbolic_vl.export", "hyperbolic_vl.plot")
WRITERS = ("hyperbolic_vl.main", "hyperbolic_vl.convert")
RUN_KEYS = ("--config.init_from", "--config.objective.teacher_workdir")


def flag(arg: str) -> tuple[str, str | None]:
  name, sep, value = arg.partition("=")
  return name, (value if sep else None)


def values(args: list[str], name: str) -> list[str]:
  return [value for arg in args for n, value in [flag(arg)] if n == name and value is not None]


def path_of(value: str) -> str:
  """The path inside a flag value: `--set=path=P`, `csv:P`, `folder:P`."""
  value = value.rpartition("=")[2] if "=" in value else value
  for prefix in ("csv:", "folder:"):
    value = value.removeprefix(prefix)
  return value


# -- (a) and (d): the config keys -------------------------------------------------
def effective(config, documented: dict[str, str], key: str):
  if f"--config.{key}" in documented:
    return documented[f"--config.{key}"]
  node = config
  for part in key.split("."):
    node = node[part]
  return node


def small_variant(variant: str) -> str:
  """Rule (a)'s image tower: a ViT becomes mu at its patch size, a ResNet RN-mu."""
  return "RN-mu" if variant.startswith("RN") else "mu/" + variant.split("/")[1]


def rule_overrides(config_spec: str, documented: dict[str, str]) -> dict[str, str]:
  """The `--config.KEY` values rule (a) and (d) set for this config."""
  config = docs_checks.load_config(config_spec)
  rule = {}
  model = config.get("model")
  if model is not None:
    variant = str(effective(config, documented, "model.image_variant"))
    small = small_variant(variant)
    if variant != small:
      rule["model.image_variant"] = small
    if effective(config, documented, "model.image_num_heads") not in (None, "None"):
      rule["model.image_num_heads"] = "2"
    if "text_variant" in model and effective(config, documented, "model.text_variant") != "mu":
      rule["model.text_variant"] = "mu"
  # A benchmark's random teacher (HMID-Net's `objective.teacher_model`) is a
  # model too: shrunk alike.
  teacher = (config.get("objective") or {}).get("teacher_model")
  if teacher is not None:
    key = "objective.teacher_model.image_variant"
    teacher_variant = str(effective(config, documented, key))
    small = small_variant(teacher_variant)
    if teacher_variant != small:
      rule[key] = small
    key = "objective.teacher_model.text_variant"
    if "text_variant" in teacher and effective(config, documented, key) != "mu":
      rule[key] = "mu"
  # A ViT's image size is a multiple of its patch (ViT/14: 42 px).
  variant = rule.get("model.image_variant", variant if model is not None else "")
  patch = int(variant.split("/")[1]) if "/" in variant else 1
  image_size = math.ceil(IMAGE_SIZE / patch) * patch
  for key, limit in (("input.batch_size", BATCH), ("input.image_size", image_size)):
    if int(effective(config, documented, key)) > limit:
      rule[key] = str(limit)
  if "total_steps" in config:
    steps = int(effective(config, documented, "total_steps"))
    if steps == 0 or steps > STEPS:
      rule["total_steps"] = str(STEPS)
  # A command that replaces the evaluators (`--config.evals={}`) has none of
  # the config's left to shrink.
  evals = {} if "--config.evals" in documented else (config.get("evals") or {})
  for name, entry in evals.items():
    if "num_examples" not in entry:
      continue
    key = f"evals.{name}.num_examples"
    count = effective(config, documented, key)
    if count in (None, "None") or int(count) > EVAL_EXAMPLES:  # None: the whole set
      rule[key] = str(EVAL_EXAMPLES)
  return rule


def shrink(tokens: list[str]) -> tuple[str, list[str]]:
  """(program, args) after the rule: placeholders and $HIERARCAPS filled
  (b), config keys and step counts shrunk (a, d); paths stay as documented
  here and are mapped into the command's folder when it runs (c)."""
  program, *args = tokens
  args = [arg.replace("$HIERARCAPS", HIERARCAPS) for arg in args]
  filled = []
  for arg in args:
    name, value = flag(arg)
    if value in PLACEHOLDERS:
      arg = f"{name}={PLACEHOLDERS[value]}"
    filled.append(arg)
  args = filled
  rule: dict[str, str] = {}
  documented = dict(flag(arg) for arg in args)
  spec = documented.get("--config")
  if spec is not None:
    rule = {f"--config.{k}": v for k, v in rule_overrides(spec, documented).items()}
  if program == "hyperbolic_vl.tools.step_throughput":
    for name, limit in (("--steps", TOOL_STEPS), ("--warmup", TOOL_WARMUP)):
      if name in documented and int(documented[name]) > limit:
        rule[name] = str(limit)
  shrunk = [
    f"{flag(arg)[0]}={rule.pop(flag(arg)[0])}" if flag(arg)[0] in rule else arg for arg in args
  ]
  return program, shrunk + [f"{name}={value}" for name, value in rule.items()]


# -- the commands, deduplicated and ordered ------------------------------------------
@dataclasses.dataclass(eq=False)  # compared and hashed by identity
class Command:
  wheres: list[str]  # file:line of each documented command it stands for
  program: str
  args: list[str]  # after shrinking; paths as documented
  writes: list[str]  # the run folders its documented commands write (main, convert)
  producers: dict[str, Command] = dataclasses.field(default_factory=dict)  # read run -> writer

  @property
  def slug(self) -> str:
    return re.sub(r"\W+", "_", self.wheres[0])

  @property
  def reads(self) -> list[str]:
    runs = [v for name in RUN_KEYS for v in values(self.args, name)]
    if self.program in READERS:
      runs += values(self.args, "--workdir")
    return runs

  def __repr__(self) -> str:
    return f"{self.wheres[0]}: {self.program} {' '.join(self.args)}"


def documented_hyperbolic_vl_commands() -> list[tuple[str, list[str]]]:
  return [(w, t) for w, t in docs_checks.documented_commands() if t[0].startswith("hyperbolic_vl.")]


def joined(tokens: list[str]) -> str:
  return " ".join(tokens)


def dedupe_key(program: str, args: list[str]) -> tuple:
  kept = [a for a in args if not (program in WRITERS and flag(a)[0] == "--workdir")]
  return (program, tuple(sorted(kept)))


def line_of(where: str) -> tuple[str, int]:
  file, _, line = where.rpartition(":")
  return file, int(line)


def writer_of(run: str, reader_where: str, commands: list[Command], seen=()) -> Command:
  """The command that writes the run `run` read at `reader_where`: the
  nearest above it in the same file, else the first; else a stand-in's."""
  writers = [
    (c, w) for c in commands for w, out in zip(c.wheres, c.writes, strict=True) if out == run
  ]
  if not writers:
    assert run in RUN_STAND_INS and run not in seen, f"{reader_where}: no command writes {run}"
    return writer_of(RUN_STAND_INS[run], reader_where, commands, (*seen, run))
  file, line = line_of(reader_where)
  above = [(line_of(w)[1], c) for c, w in writers if line_of(w)[0] == file and line_of(w)[1] < line]
  if above:
    return max(above, key=lambda pair: pair[0])[1]
  return writers[0][0]


@functools.cache
def all_commands() -> tuple[Command, ...]:
  """The documented commands to run, deduplicated, each with its writers,
  ordered so that a command comes after the runs it reads."""
  by_key: dict[tuple, Command] = {}
  for where, tokens in documented_hyperbolic_vl_commands():
    if joined(tokens) in CANNOT_RUN_HERE:
      continue
    program, args = shrink(tokens)
    # A writer's command that names no run (`convert --list`) writes none.
    workdirs = values(args, "--workdir") if program in WRITERS else []
    written = workdirs[0] if workdirs else ""
    key = dedupe_key(program, args)
    if key in by_key:
      by_key[key].wheres.append(where)
      by_key[key].writes.append(written)
    else:
      by_key[key] = Command([where], program, args, [written])
  commands = list(by_key.values())
  for command in commands:
    for run in command.reads:
      command.producers[run] = writer_of(run, command.wheres[0], commands)
  depth = functools.cache(lambda c: 1 + max((depth(p) for p in c.producers.values()), default=0))
  return tuple(sorted(commands, key=depth))


# -- running one --------------------------------------------------------------------
def session_folder() -> Path:
  return Path(os.environ["HVL_TEST_SESSION_DIR"]) / "documented_commands"


def folder_of(command: Command) -> Path:
  return session_folder() / command.slug


def run_folder(command: Command) -> Path:
  """Where the command's run goes (its first documented --workdir)."""
  return folder_of(command) / command.writes[0].lstrip("/")


def in_folder(arg: str, folder: Path) -> str:
  """(c): an absolute path `/P` in a flag value becomes `folder/P`."""
  return re.sub(r"(?<=[=:])/(?=[\w.-])", str(folder) + "/", arg)


def config_of(args: list[str]):
  """The config a command's --config flags give (fixture checkpoints' shapes)."""
  documented = dict(flag(arg) for arg in args)
  config = docs_checks.load_config(documented["--config"])
  config = type(config)(config.to_dict())
  for name, value in documented.items():
    if not name.startswith("--config."):
      continue
    *parents, leaf = name.removeprefix("--config.").split(".")
    node = config
    for part in parents:
      node = node[part]
    current = node[leaf]
    if isinstance(current, bool):
      node[leaf] = value.lower() in ("1", "true")
    elif isinstance(current, int | float):
      node[leaf] = type(current)(value)
    elif current is None:
      node[leaf] = int(value) if value.lstrip("-").isdigit() else value
    else:
      node[leaf] = value
  return config


def provide(command: Command, folder: Path) -> None:
  """(b) and (c): the command's data, checkpoints and the runs it reads,
  at the paths it names, inside `folder`."""
  (folder / "configs").symlink_to(REPO / "configs")
  for run, writer in command.producers.items():
    link = folder / run.lstrip("/")
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(run_folder(writer))
  for arg in command.args:
    name, value = flag(arg)
    if value is None:
      continue
    path = path_of(value)
    if command.program == "hyperbolic_vl.convert" and name == "--checkpoint":
      documented = dict(flag(a) for a in command.args)
      bounds = documented.get("--bounds")
      data.release_checkpoint(
        documented["--source"],
        config_of(command.args),
        folder / path.lstrip("/"),
        bounds=folder / bounds.lstrip("/") if bounds else None,
      )
      continue
    fixture = DATA_FIXTURES.get(path)
    if fixture is None:
      inside = [key for key in DATA_FIXTURES if path.startswith(key + "/")]
      if not inside:
        continue
      path = max(inside, key=len)
      fixture = DATA_FIXTURES[path]
    target = folder / path.lstrip("/")
    if not target.exists():
      fixture(target)


def user_environment() -> dict[str, str]:
  """The environment of a user's shell on this machine: the package on the
  path, and one CPU device (the session's 8 virtual devices, conftest.py,
  are for the sharding tests; compiling each step for 8 costs more)."""
  flags = re.sub(r"--xla_force_host_platform_device_count=\d+", "", os.environ.get("XLA_FLAGS", ""))
  path = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
  return dict(os.environ, XLA_FLAGS=flags.strip(), PYTHONPATH=path)


@dataclasses.dataclass
class Outcome:
  returncode: int
  output: str
  folder: str
  failed_writer: str = ""  # a run it reads was not written


def outcome(command: Command) -> Outcome:
  """The command's run, once per session whichever worker asks first."""
  folder = folder_of(command)
  folder.parent.mkdir(parents=True, exist_ok=True)
  record = folder.parent / f"{folder.name}.json"
  with open(folder.parent / f"{folder.name}.lock", "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
    if record.exists():
      return Outcome(**json.loads(record.read_text()))
    failed = [w for w in command.producers.values() if outcome(w).returncode != 0]
    if failed:
      result = Outcome(-1, "", str(folder), failed_writer=repr(failed[0]))
    else:
      shutil.rmtree(folder, ignore_errors=True)  # a worker that died half-way
      folder.mkdir()
      provide(command, folder)
      env = user_environment()
      argv = [in_folder(arg, folder) for arg in command.args]
      done = subprocess.run(
        [sys.executable, "-m", command.program, *argv],
        cwd=folder,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=900,
      )
      result = Outcome(done.returncode, done.stdout, str(folder))
    record.write_text(json.dumps(dataclasses.asdict(result)))
    return result


# -- what each kind of command leaves -----------------------------------------------
def check_results(command: Command, folder: Path, output: str) -> None:
  documented = dict(flag(arg) for arg in command.args)
  at = lambda value: folder / value.lstrip("/")  # noqa: E731 (rule (c): /P is folder/P)
  if command.program == "hyperbolic_vl.main":
    records = [json.loads(line) for line in (run_folder(command) / "metrics.jsonl").open()]
    losses = [r["train/loss"] for r in records if "train/loss" in r]
    assert max(r["step"] for r in records) == STEPS, records[-1]
    assert losses and all(math.isfinite(loss) for loss in losses), losses
  elif command.program == "hyperbolic_vl.convert" and "--list" in documented:
    # The release table, one name a line: every release listed.
    from hyperbolic_vl.interop import releases

    listed = {line.split()[0] for line in output.splitlines() if line.strip()}
    assert set(releases.RELEASES) <= listed, sorted(set(releases.RELEASES) - listed)
  elif command.program == "hyperbolic_vl.convert":
    run = run_folder(command)
    assert (run / "config.json").is_file() and any((run / "checkpoints").iterdir())
  elif command.program == "hyperbolic_vl.export":
    assert at(documented["--output"]).stat().st_size > 0
  elif command.program == "hyperbolic_vl.plot":
    output = documented.get("--output_dir")
    pictures = at(output) if output else at(documented["--workdir"]) / "plots"
    assert list(pictures.glob("*.png")), f"no PNG in {pictures}"
  elif command.program == "hyperbolic_vl.evaluate":
    for name in ("--output", "--results", "--table", "--plot"):
      if name in documented:
        assert at(documented[name]).stat().st_size > 0, f"{name} not written"
    if "--output" in documented:
      assert json.loads(at(documented["--output"]).read_text()), "no figures"
    if documented.get("--eval") == "safety_bounds":
      bounds = at(documented["--workdir"]) / "eval" / "safety_bounds" / "hysac_bounds.json"
      assert bounds.is_file(), f"no {bounds}"


COMMANDS = all_commands()


def _installed(module: str) -> bool:
  try:
    return importlib.util.find_spec(module) is not None
  except ModuleNotFoundError:  # its parent package (jax_plugins) is absent
    return False


AOT_BACKENDS_INSTALLED = _installed("libtpu") and _installed("jax_plugins.xla_cuda12")


@pytest.mark.slow
@pytest.mark.parametrize("command", COMMANDS, ids=[c.wheres[0] for c in COMMANDS])
def test_documented_command_runs_as_written(command):
  if command.program == "hyperbolic_vl.tools.aot" and not AOT_BACKENDS_INSTALLED:
    # .ci/run installs the aot extra after the slow tier (README block 2
    # leaves it out); without it the tool's refusal is its one line.
    pytest.skip("the aot extra (libtpu, the CUDA plugin) is not installed")
  result = outcome(command)
  where = ", ".join(command.wheres)
  assert not result.failed_writer, f"{where}: the run it reads failed: {result.failed_writer}"
  tail = result.output[-4000:]
  assert result.returncode == 0, f"{where}: {command!r}\nexit {result.returncode}\n{tail}"
  assert "Traceback" not in result.output, f"{where}: {command!r}\n{tail}"
  check_results(command, Path(result.folder), result.output)


# -- the lists stay true to the docs ------------------------------------------------
def test_every_documented_command_is_run_or_says_why_not():
  documented = documented_hyperbolic_vl_commands()
  ran = {where for command in COMMANDS for where in command.wheres}
  excused = {where for where, tokens in documented if joined(tokens) in CANNOT_RUN_HERE}
  assert ran | excused == {where for where, _ in documented}
  stale = set(CANNOT_RUN_HERE) - {joined(tokens) for _, tokens in documented}
  assert not stale, f"CANNOT_RUN_HERE names commands no longer in the docs: {sorted(stale)}"


def test_every_fixture_and_stand_in_is_still_named_by_the_docs():
  """No entry of DATA_FIXTURES or RUN_STAND_INS outlives the command that
  needed it: each is a path some documented command names (a fixture
  folder also counts when a path inside it is named)."""
  named = {
    path_of(value)
    for _, tokens in documented_hyperbolic_vl_commands()
    for arg in shrink(tokens)[1]
    for value in [flag(arg)[1]]
    if value is not None
  }
  read_runs = {run for command in COMMANDS for run in command.reads}
  unused = [
    path for path in DATA_FIXTURES if not any(p == path or p.startswith(path + "/") for p in named)
  ]
  unused += [run for run in RUN_STAND_INS if run not in read_runs | set(RUN_STAND_INS.values())]
  assert not unused, f"paths no documented command names: {unused}"
