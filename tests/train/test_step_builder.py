"""training/step_builder: the trainer and tools/aot compile one program.

The trainer's path (`setup.validate`, the first batch of its data, the
step compiled as `loop` compiles it) and tools/aot's (an abstract state and
batch, compiled for the host's CPU as a target, `cpu:2`) compile MERU's
tiny step; their optimised HLO is the same text once names and source
locations are taken out. One compile each (module-scoped)."""

import re

import pytest

from configs import meru as meru_config
from hyperbolic_vl import errors
from hyperbolic_vl.tools import aot, aot_targets
from hyperbolic_vl.training import compilation, loop, setup, sharding, step_builder

# The lines of the stack-frame tables XLA writes after the module's header.
_TABLE_HEADERS = {"FileNames", "FunctionNames", "FileLocations", "StackFrames"}


def program_text(hlo: str) -> str:
  """`hlo` modulo names: without the source-location tables and each
  instruction's metadata (the jax name stack, the file and line), and with
  every %name renamed by its first appearance (%v0, %v1, ...)."""
  lines = [
    line for line in hlo.splitlines() if line not in _TABLE_HEADERS and not re.match(r"\d+ ", line)
  ]
  text = re.sub(r", metadata=\{[^}]*\}", "", "\n".join(lines))
  names = {}
  return re.sub(r"%[\w.\-]+", lambda m: names.setdefault(m.group(0), f"%v{len(names)}"), text)


def tiny_config():
  config = meru_config.get_config("tiny")
  with config.unlocked():
    config.num_devices = 2
    config.input.batch_size = 8
  return config


@pytest.fixture(scope="module")
def both_programs(tmp_path_factory):
  """(the trainer's optimised HLO, tools/aot's) of the same config."""
  config = tiny_config()
  run = setup.validate(config, str(tmp_path_factory.mktemp("workdir")))
  batch = loop._to_global(next(run.train_iter), sharding.batch_sharding(run.mesh))
  trainer = compilation.compile_step(run.train_step.jitted, run.state, batch)
  tool = aot.compile_for(config, aot_targets.resolve("cpu:2"))
  return trainer.executable.as_text(), tool.compiled.executable.as_text()


def test_trainer_and_aot_compile_the_same_program(both_programs):
  trainer, tool = both_programs
  assert program_text(trainer) == program_text(tool)
  # What was compared is the whole step: its entry computation, the
  # gradient's dots and the 2-device mesh's all-reduces.
  assert "ENTRY" in program_text(trainer)
  assert re.search(r"\sdot\(", trainer) and re.search(r"\sall-reduce(-start)?\(", trainer)


def test_program_text_keeps_what_the_program_computes():
  """Names and metadata go; an operand, a constant or a shape stays."""
  hlo = (
    'HloModule m\n\nFileNames\n1 "a.py"\n\nENTRY %main.1 (p: f32[2]) -> f32[2] {\n'
    '  %p = f32[2]{0} parameter(0), metadata={op_name="x" stack_frame_id=1}\n'
    "  %c.7 = f32[] constant(2)\n"
    "  ROOT %m.2 = f32[2]{0} multiply(%p, %c.7)\n}\n"
  )
  renamed = hlo.replace("%c.7", "%two").replace('op_name="x"', 'op_name="y"')
  assert program_text(renamed) == program_text(hlo)
  assert "%v2 = f32[] constant(2)" in program_text(hlo)
  assert program_text(hlo.replace("constant(2)", "constant(3)")) != program_text(hlo)
  assert program_text(hlo.replace("f32[2]{0} multiply", "f16[2]{0} multiply")) != program_text(hlo)


def test_run_mesh_refuses_a_batch_it_cannot_split():
  config = tiny_config()
  with config.unlocked():
    config.input.batch_size = 7
  with pytest.raises(errors.ConfigError) as refused:
    step_builder.run_mesh(config, devices_named="chips of cpu:2")
  assert str(refused.value) == (
    "input.batch_size=7 must be divisible by the number of chips of cpu:2 (2)"
  )


def test_benchmark_config_runs_without_data_or_a_source_run():
  config = tiny_config()
  with config.unlocked():
    config.total_steps = 0  # sized in epochs
    config.init_from = None  # a recipe that starts from another run
  prepared = step_builder.benchmark_config(config, mask_ratio=0.5)
  assert prepared.total_steps == step_builder.PLACEHOLDER_TOTAL_STEPS
  assert prepared.init_from == ""
  assert prepared.model.image_token_drop == 0.5
  # The caller's config is left as it was.
  assert config.total_steps == 0 and config.init_from is None
  assert config.model.get("image_token_drop", 0.0) != 0.5
