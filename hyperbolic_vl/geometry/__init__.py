"""Pure-functional hyperbolic geometry: Lorentz and Poincare models, and
products of Lorentz spaces."""

from hyperbolic_vl.geometry import lorentz, poincare, product, safe

__all__ = ["lorentz", "poincare", "product", "safe"]
