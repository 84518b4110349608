"""Evaluators of `config.evals`: one module per type (world.py, hierarchy.py,
atmg_analysis.py, hcl.py, zero_shot.py, retrieval.py, linear_probe.py), each
registered once in registry.py; metrics/ computes figures from embeddings,
datasets/ reads evaluation data."""


class EvaluatorUnavailable(RuntimeError):
  """An evaluator cannot run on this run's data; the message says why."""
