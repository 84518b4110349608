"""The collapse warning (training/geometry_health.CollapseWatch): each
symptom provoked on synthetic logged metrics is said once, in one line,
after PATIENCE logged steps in a row; the logged metrics of the session's
shared tiny runs and of the measured tiny runs as configured (the
package's reference runs, runs/reference_metrics/; docs/training.md#collapse-warning)
say nothing, and the measured collapsed run says what it should."""

import json
import os
import types

import pytest
import shared_runs
from paths import FIXTURES

from hyperbolic_vl.runs import reference_runs
from hyperbolic_vl.training.geometry_health import PATIENCE, CollapseWatch

MERU_MODEL = {"geometry": "lorentz", "curv_init": 1.0, "curv_clamp_factor": 10.0}


def healthy(step):
  return {
    "train/loss": 3.0,
    "train/curv": 1.2,
    "train/loss/entailment": 0.05,
    "train/aperture_saturated_fraction": 0.0,
    "train/mean_dist_origin/text": 1.0 + step / 100,
  }


def said(watch, records):
  out = []
  for record in records:
    out += watch.update(record)
  return out


@pytest.mark.parametrize(
  "symptom, change, expected",
  [
    (
      "curvature at its lower clamp",
      {"train/curv": 0.1 * (1 + 1e-7)},  # float32 rounding of the clamp
      "the curvature has sat at its lower clamp (0.1) for 5 logged steps",
    ),
    (
      "curvature at its upper clamp",
      {"train/curv": 10.0},
      "the curvature has sat at its upper clamp (10) for 5 logged steps",
    ),
    (
      "entailment ~0 with saturated apertures",
      {"train/loss/entailment": 2e-4, "train/aperture_saturated_fraction": 0.9},
      "the entailment loss has been ~0 (0.0002) for 5 logged steps while 90% of texts' cones",
    ),
    (
      "texts fallen onto the origin",
      # curvature-scaled sqrt(1.2) x 0.18 = 0.197 < asinh(0.2) = 0.1987
      {"train/mean_dist_origin/text": 0.18},
      "the texts' mean distance to the origin has been 0.18 (curvature-scaled 0.197 < 0.199",
    ),
  ],
)
def test_each_symptom_is_said_once_after_patience_logged_steps(symptom, change, expected):
  watch = CollapseWatch(MERU_MODEL)
  assert said(watch, [healthy(s) for s in range(10)]) == []
  # One logged step short of the patience: nothing yet.
  sick = [{**healthy(10), **change} for _ in range(PATIENCE - 1)]
  assert said(watch, sick) == [], symptom
  (line,) = watch.update({**healthy(10), **change})
  assert line.startswith("collapse: " + expected), line
  assert "\n" not in line and line.endswith("(docs/training.md#collapse-warning).")
  # Said once: it stays true for many more logged steps and is not repeated.
  assert said(watch, [{**healthy(10), **change}] * 20) == []


def test_a_symptom_that_does_not_persist_is_not_said():
  watch = CollapseWatch(MERU_MODEL)
  flicker = [healthy(s) if s % 3 else {**healthy(s), "train/curv": 10.0} for s in range(60)]
  assert said(watch, flicker) == []
  # Entailment ~0 with cones that are not half-spaces is a satisfied loss.
  satisfied = {**healthy(0), "train/loss/entailment": 0.0, "train/aperture_saturated_fraction": 0.1}
  assert said(watch, [satisfied] * 20) == []


def test_a_fixed_or_euclidean_curvature_is_never_at_a_clamp():
  for model in ({**MERU_MODEL, "learn_curv": False}, {"geometry": "euclidean"}):
    assert said(CollapseWatch(model), [{**healthy(0), "train/curv": 10.0}] * 20) == []
  # A product of spaces logs curv/min and curv/max: the max at the clamp counts.
  product = {"train/curv/min": 2.0, "train/curv/max": 10.0, "train/curv/mean": 5.0}
  assert len(said(CollapseWatch(MERU_MODEL), [product] * PATIENCE)) == 1


def metrics_of(path):
  with open(path) as f:
    return [r for r in map(json.loads, f) if any(k.startswith("train/") for k in r)]


@shared_runs.ON_ONE_WORKER
@pytest.mark.parametrize("name", sorted(shared_runs.CONFIGS))
def test_silent_on_the_shared_tiny_runs(name):
  workdir = shared_runs.trained_run(name)
  with open(os.path.join(workdir, "config.json")) as f:
    model = json.load(f)["model"]
  records = metrics_of(os.path.join(workdir, "metrics.jsonl"))
  assert records
  assert said(CollapseWatch(model), records) == []


MEASURED = os.path.join(FIXTURES, "collapse_runs")


def measured_path(run):
  """Each method's tiny run as configured ships with the package (its
  reference curves, runs/reference_runs.py); the runs made to collapse or
  changed otherwise are fixtures."""
  method = run.removesuffix("_tiny")
  if method in reference_runs.methods():
    return reference_runs.metrics_path(method)
  return os.path.join(MEASURED, f"{run}.jsonl")


def replay(run, model=MERU_MODEL):
  """(step, line) of every warning the watch says over a measured run."""
  watch, out = CollapseWatch(model), []
  records = metrics_of(measured_path(run))
  assert len(records) >= 2 * PATIENCE  # long enough for a symptom to count
  for record in records:
    out += [(record["step"], line) for line in watch.update(record)]
  return out


# The model settings the watch reads, from each run's config.json where they
# are not MERU's.
EUCLIDEAN = {"geometry": "euclidean"}
MODELS = {
  # ATMG's curvature is fixed at 0.1: with MERU's settings it would read as
  # sitting at the lower clamp.
  "atmg_tiny": {
    "geometry": "lorentz",
    "curv_init": 0.1,
    "curv_clamp_factor": 5.0,
    "learn_curv": False,
  },
  "clip_tiny": EUCLIDEAN,
  "radial_tiny": EUCLIDEAN,
  "hcl_tiny": EUCLIDEAN,  # HCL's own Poincare model; its config's geometry key is the default
}
# What the watch reads (training/geometry_health.CollapseWatch).
WATCHED = (
  "train/curv",
  "train/curv/min",
  "train/curv/max",
  "train/loss/entailment",
  "train/aperture_saturated_fraction",
  "train/mean_dist_origin/text",
)


@pytest.mark.parametrize(
  "run",
  [
    "meru_tiny",
    "hycoclip_tiny",
    "hysac_tiny",
    "phyclip_tiny",
    "uncha_tiny",
    "euclip_tiny",
    "meru_tiny_curv_clamp_1.1",
    "meru_tiny_learned_weight",
    "hmid_tiny",
    "atmg_tiny",
  ],
)
def test_silent_on_the_measured_tiny_runs_as_configured(run):
  # The clamp run is configs/meru.py's tiny run cut to 400 steps: with the
  # configured clamp (factor 10) its curvature is as free as the full run's.
  # The learned weight's run (objective.entail_weight_learned=True) ends
  # nearest a threshold: texts at scaled distance 0.223 against 0.199;
  # ATMG's come next (0.282, its fixed curvature 0.1).
  assert replay(run, MODELS.get(run, MERU_MODEL)) == []


@pytest.mark.parametrize("run", ["clip_tiny", "radial_tiny", "hcl_tiny"])
def test_the_measured_runs_it_cannot_read_log_none_of_its_metrics(run):
  # CLIP and Radial are Euclidean and HCL keeps its own Poincare norms
  # (train/norm/*): none logs a metric the watch reads, so it stays silent
  # by construction; a method that starts logging one must be measured.
  records = metrics_of(measured_path(run))
  assert not {key for record in records for key in record} & set(WATCHED)
  assert replay(run, MODELS[run]) == []


def test_the_measured_collapsed_runs_are_warned_about():
  # configs/meru.py with objective.entail_weight=50: texts on the origin,
  # entailment 0 and every cone a half-space from step 125 (logged every 25).
  lines = replay("meru_tiny_weight50")
  assert [step for step, _ in lines] == [225, 225]
  assert "the entailment loss has been ~0 (0)" in lines[0][1]
  assert "while 100% of texts' cones are at their widest" in lines[0][1]
  assert "the texts' mean distance to the origin has been" in lines[1][1]
  # model.curv_clamp_factor=1.1: the curvature's drift reaches 1/1.1 at
  # step 150 and stays; said at the fifth logged step there.
  ((step, line),) = replay("meru_tiny_curv_clamp_1.1", {**MERU_MODEL, "curv_clamp_factor": 1.1})
  assert step == 250 and "the curvature has sat at its lower clamp (0.909)" in line


def test_the_measured_collapse_is_an_event_row_and_a_summary_line(tmp_path):
  """The loop's log step (`_StepLoop.write_log`, its real writer, log and
  watch) replaying the measured entail_weight=50 run: each warning is a
  {"step", "event", "message"} row of metrics.jsonl at the step it fired,
  with no number but the step, and the end-of-run summary repeats
  both warnings with that step."""
  from hyperbolic_vl.runs import metrics_io
  from hyperbolic_vl.training import geometry_health, loop

  writer = metrics_io.MetricsWriter(str(tmp_path))
  step_loop = types.SimpleNamespace(
    writer=writer,
    log=metrics_io.TrainLog(writer, total_steps=1000, batch_size=128, step=0),
    collapse=CollapseWatch(MERU_MODEL),
    check_finite=lambda step: None,
    input_health=types.SimpleNamespace(window_metrics=dict),
    progress=types.SimpleNamespace(finish=lambda: None),
  )
  for record in metrics_of(measured_path("meru_tiny_weight50")):
    step_loop.step = record["step"]
    logged = {k: v for k, v in record.items() if k != "step"}
    loop._StepLoop.write_log(step_loop, logged, params_norm=1.0)
  writer.close()
  rows = metrics_io.read_metrics(str(tmp_path))
  events = [row for row in rows if "event" in row]
  assert [(row["step"], row["event"]) for row in events] == [(225, "collapse")] * 2
  assert events[0]["message"].startswith("collapse: the entailment loss has been ~0 (0)")
  assert events[1]["message"].startswith("collapse: the texts' mean distance to the origin")
  assert len(rows) == 40 + 2  # every logged step, and the two events among them
  # No number but the step: the curves' reader (plots.read_curves) skips them.
  assert all(
    {k for k, v in row.items() if isinstance(v, int | float)} == {"step"} for row in events
  )
  assert step_loop.collapse.summary() == [
    f"warning (first at step 225): {row['message']}" for row in events
  ]
  assert geometry_health.COLLAPSE_EVENT == "collapse"
  assert CollapseWatch(MERU_MODEL).summary() == []  # a healthy run's summary says nothing


@pytest.mark.slow
def test_a_run_whose_curvature_sits_at_its_clamp_logs_and_summarises_the_warning(tmp_path, capsys):
  """A 6-step tiny MERU run with curv_clamp_factor=1 (the clamp is c0
  itself, so the curvature sits at it from step 1), logged every step:
  the warning fires at the 5th logged step, is a metrics.jsonl event row
  there and a line of the end-of-run summary on stdout."""
  import tiny_runs

  from hyperbolic_vl.runs import metrics_io
  from hyperbolic_vl.training import loop

  config = tiny_runs.small_config(**{"model.curv_clamp_factor": 1.0, "log_training_steps": 1})
  loop.train_and_evaluate(config, str(tmp_path))
  out = capsys.readouterr().out
  (event,) = [r for r in metrics_io.read_metrics(str(tmp_path)) if "event" in r]
  assert (event["step"], event["event"]) == (PATIENCE, "collapse")
  assert event["message"].startswith("collapse: the curvature has sat at its lower clamp (1)")
  summary = f"warning (first at step {PATIENCE}): {event['message']}"
  assert summary in out.splitlines()
  # After the line that ends training, before the evaluation's figures.
  assert out.index("Trained to step 6") < out.index(summary) < out.index("Evaluation at step 6")
