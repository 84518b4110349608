"""hyperbolic_vl: hyperbolic vision-language models in JAX/Flax."""


def load(workdir, *, step=None, batch_size=256, dtype="float32", cache_dir=None):
  """Inference handle of a run's workdir (latest checkpoint, or `step`), or
  of a released model by name (`load("meru_vit_l")`: downloaded, checked and
  converted into the cache, $HYPERBOLIC_VL_CACHE or `cache_dir`, on first
  use; names in `hyperbolic_vl.interop.releases`):
  `encode_images`, `encode_texts`, `tokenize`, `similarity`, `geometry`,
  `curv`, `image_size`. The towers compute in `dtype` (float32 by default,
  whatever the run trained in; "bfloat16" for speed). See
  `hyperbolic_vl.inference`."""
  # Imported on use so that `import hyperbolic_vl` stays free of JAX.
  from hyperbolic_vl import inference

  return inference.load(workdir, step=step, batch_size=batch_size, dtype=dtype, cache_dir=cache_dir)


def list_pretrained():
  """The released models `load(NAME)` takes: name, title, paper, size (the
  image tower), where the file comes from and its license, one
  `interop.pretrained.ReleasedModel` each (`python -m hyperbolic_vl.convert
  --list` prints them)."""
  from hyperbolic_vl.interop import pretrained

  return pretrained.list_pretrained()
