"""Evaluators: world figures, retrieval, hierarchy and traversal metrics."""


class EvaluatorUnavailable(RuntimeError):
  """An evaluator cannot run on this run's data; the message says why."""
