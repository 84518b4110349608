"""Objectives: pure loss code, one module each, registered by name.

`get(config.objective)` returns the objective the config names; see
`registry` for how an objective registers and `base` for the contract.
"""

from hyperbolic_vl.objectives.registry import get, names, register, section

__all__ = ["get", "names", "register", "section"]
