"""TRANSITIONAL (issue 17): train.py still imports `world_eval.format_results`;
it lives in registry.py now. Delete this file once train.py uses
`registry.format_results`."""

from hyperbolic_vl.evaluators.registry import format_results

__all__ = ["format_results"]
