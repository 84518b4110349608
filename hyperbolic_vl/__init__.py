"""hyperbolic_vl: hyperbolic vision-language models in JAX/Flax."""


def load(workdir, *, step=None, batch_size=256, dtype="float32"):
  """Inference handle of a run's workdir (latest checkpoint, or `step`):
  `encode_images`, `encode_texts`, `tokenize`, `similarity`, `geometry`,
  `curv`, `image_size`. The towers compute in `dtype` (float32 by default,
  whatever the run trained in; "bfloat16" for speed). See
  `hyperbolic_vl.inference`."""
  # Imported on use so that `import hyperbolic_vl` stays free of JAX.
  from hyperbolic_vl import inference

  return inference.load(workdir, step=step, batch_size=batch_size, dtype=dtype)
