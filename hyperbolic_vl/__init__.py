"""hyperbolic_vl: hyperbolic vision-language models in JAX/Flax."""
