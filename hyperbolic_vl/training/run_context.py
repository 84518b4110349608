"""The frozen RunContext the trainer hands an objective (objectives/base.py):
the tokenizer and input settings, the teacher it asked for, and a sample of
its data source. Built once per run, before `init_aux`."""

from __future__ import annotations

import jax
from flax import nnx

from hyperbolic_vl.data import registry as data_registry
from hyperbolic_vl.models import registry as models_registry
from hyperbolic_vl.objectives import base as objectives_base
from hyperbolic_vl.runs import loading

# The fixed seed of RunContext.sample_batch: a batch that does not depend on
# the run's own seed, so init-time statistics are the same for every seed.
SAMPLE_BATCH_SEED = 12345


def _random_teacher(model_config, student, seed: int) -> objectives_base.Teacher:
  """A randomly initialised two-tower teacher the student's width (benchmarks)."""
  config = dict(model_config)
  config.setdefault("image_variant", student.image_tower.variant)
  config.setdefault("text_variant", "mu")
  config["embed_dim"] = student.embed_dim
  rng = jax.random.key(seed)
  module = models_registry.build(
    config,
    image_size=student.image_tower.image_size,
    vocab_size=student.text_tower.vocab_size,
    context_length=student.text_tower.context_length,
    rngs=nnx.Rngs(params=int(jax.random.randint(rng, (), 0, 2**30))),
  )
  print("RANDOM teacher (no teacher workdir); benchmark use only", flush=True)
  return objectives_base.Teacher(*models_registry.ModelDef.from_module(module))


def build(config, objective, tokenizer, student, *, workdir=None, resuming=False):
  """The frozen RunContext the objective gets at init_aux and loss time.

  `resuming`: the workdir's own checkpoint will replace the params and aux,
  so a teacher is rebuilt from the config kept in the workdir, not read
  from the teacher's own workdir (which may be gone).
  """
  teacher = None
  request = objective.teacher_request()
  if request is not None and request.workdir:
    teacher = loading.restore_teacher(request.workdir, run_workdir=workdir, resuming=resuming)
  elif request is not None:
    teacher = _random_teacher(request.random_model or {}, student, config.seed + 1)
  return objectives_base.RunContext(
    tokenizer=tokenizer,
    input_config=config.input,
    total_steps=int(config.total_steps),
    teacher=teacher,
    sample_batch=lambda: next(
      data_registry.make_train_iterator(
        config.input, tokenizer, seed=SAMPLE_BATCH_SEED, process_index=0, process_count=1
      )
    ),
  )


# ---------------------------------------------------------------------------
# The sharded loss and the step.
# ---------------------------------------------------------------------------
