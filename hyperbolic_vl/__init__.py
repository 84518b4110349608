"""hyperbolic_vl: hyperbolic vision-language models in JAX/Flax.

`hyperbolic_vl.load(workdir)` returns an inference handle for a trained run
(see `hyperbolic_vl.inference`). Importing the package stays light: JAX,
Orbax and TensorFlow load only when a run is loaded.
"""


def load(workdir: str, step: int | None = None, batch_size: int = 256):
  """The trained run in `workdir`: encode_images, encode_texts, similarity."""
  # Deferred so that `import hyperbolic_vl` does not pull in the training stack.
  from hyperbolic_vl import inference

  return inference.load(workdir, step=step, batch_size=batch_size)
