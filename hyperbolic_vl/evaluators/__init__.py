"""Evaluators of `config.evals`: one module per type (world.py, hierarchy.py,
atmg_analysis.py, hcl.py, zero_shot.py, retrieval.py, linear_probe.py), each
registered once in registry.py; metrics/ computes figures from embeddings,
datasets/ reads evaluation data."""


class EvaluatorUnavailable(RuntimeError):
  """An evaluator cannot run on this run's data or model; the message says why."""


def require_single_space(predictor, what: str) -> None:
  """EvaluatorUnavailable, in one line, when the run's model is a product of
  Lorentz spaces (`model.factor_dim`, PHyCLIP) and `what` works in one."""
  num_factors = getattr(predictor, "num_factors", 0)
  if num_factors:
    raise EvaluatorUnavailable(
      f"{what} works in one Lorentz space; this run's model is a product of "
      f"{num_factors} spaces (model.factor_dim)"
    )
