"""Evaluation split across processes: two processes of one CPU device each
(`python -m hyperbolic_vl.evaluate --multihost`, JAX's distributed runtime
with gloo collectives) each embed half of every set and gather the halves;
their figures equal one process's, which embeds everything.

The embeddings are float32, computed per row by the same compiled functions
on batches of other sizes, so they may differ in the last bit (XLA:CPU may
block a matmul differently for another row count); the figures are
accuracies, recalls and ranking statistics of those embeddings, equal unless
two scores tie to within that rounding, hence the 1e-6 tolerance."""

import json
import os
import subprocess
import sys

import process_report
import pytest
from paths import HIERARCAPS_MINI, REPO
from test_multihost import free_port
from tiny_runs import small_config

from configs import meru as meru_config
from hyperbolic_vl.evaluators import registry
from hyperbolic_vl.training import loop


def launch(flags) -> subprocess.Popen:
  env = dict(
    os.environ,
    XLA_FLAGS="--xla_force_host_platform_device_count=1",
    JAX_PLATFORMS="cpu",
  )
  return subprocess.Popen(
    [sys.executable, "-m", "hyperbolic_vl.evaluate", *flags],
    cwd=str(REPO),
    env=env,
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
  )


def finish(*processes):
  outputs = [p.communicate(timeout=600) for p in processes]
  failed = [
    f"process {i} (exit {p.returncode}):\n{process_report.why_it_ended(err)}"
    for i, (p, (_, err)) in enumerate(zip(processes, outputs))
    if p.returncode != 0
  ]
  assert not failed, "\n\n".join(failed)
  return [out for out, _ in outputs]


@pytest.mark.slow  # three processes load a run and evaluate it
def test_two_processes_give_the_figures_of_one(tmp_path):
  config = small_config(meru_config.get_config, total_steps=2, ckpt_steps=100)
  # The world evaluator (images, captions and zero-shot classes: every
  # encode path) on 37 scenes, an odd count that splits unevenly; and
  # entailment detection over the HierarCaps mini tiers (texts only).
  config.evals = {
    "world": registry.entry("world", num_examples=37, batch_size=8),
    "entailment": registry.entry(
      "entailment", source="hierarcaps", path=str(HIERARCAPS_MINI / "hierarcaps_mini.csv")
    ),
  }
  workdir = str(tmp_path / "run")
  loop.train(config, workdir)
  common = [f"--workdir={workdir}", "--suite=config", "--batch_size=8"]
  one = launch([*common, f"--output={tmp_path / 'one.json'}"])
  address = f"127.0.0.1:{free_port()}"
  pair = [
    launch(
      [
        *common,
        "--multihost",
        f"--coordinator_address={address}",
        "--num_processes=2",
        f"--process_id={i}",
        f"--output={tmp_path / 'two.json'}",
        f"--results={tmp_path / 'results.jsonl'}",
      ]
    )
    for i in range(2)
  ]
  finish(one)
  lead, other = finish(*pair)
  # Process 0 alone reports and writes (gloo itself may still log its connections).
  assert "appended 1 row(s)" in lead and "appended" not in other and "entailment" not in other
  figures_one = json.loads((tmp_path / "one.json").read_text())["figures"]
  figures_two = json.loads((tmp_path / "two.json").read_text())["figures"]
  rows = (tmp_path / "results.jsonl").read_text().splitlines()
  assert len(rows) == 1
  assert figures_two.keys() == figures_one.keys()
  assert any(k.startswith("entailment/") for k in figures_one)
  assert any(k.startswith("world/") or "recall" in k for k in figures_one)
  timing = [k for k in figures_one if "per_sec" in k or k.endswith("_seconds")]
  for key in figures_one.keys() - set(timing):
    assert figures_two[key] == pytest.approx(figures_one[key], abs=1e-6), key
