"""Pure-functional hyperbolic geometry: Lorentz and Poincare models."""

from hyperbolic_vl.geometry import lorentz, poincare, safe

__all__ = ["lorentz", "poincare", "safe"]
