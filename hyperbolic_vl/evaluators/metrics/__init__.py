"""Evaluation metrics on embeddings and score matrices (NumPy / JAX only): no
data reading, no model; each evaluator module feeds them."""
