"""Value tests for the transformer pieces and the image/text towers."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from model_refs import build, fast_compile_jit, module_jit

from hyperbolic_vl.models import lora, text, transformer, vit

VOCAB_SIZE = 49408
CONTEXT_LENGTH = 77


def count_params(module: nnx.Module) -> int:
  return sum(math.prod(leaf.shape) for leaf in jax.tree.leaves(nnx.state(module, nnx.Param)))


def block_param_count(width: int, mlp_dim: int) -> int:
  norms = 2 * 2 * width
  attention = (width * 3 * width + 3 * width) + (width * width + width)
  mlp = (width * mlp_dim + mlp_dim) + (mlp_dim * width + width)
  return norms + attention + mlp


def vit_param_count(width, depth, mlp_dim, patch_size) -> int:
  patch_embed = patch_size * patch_size * 3 * width + width
  cls_token = width
  final_norm = 2 * width
  return patch_embed + cls_token + depth * block_param_count(width, mlp_dim) + final_norm


def text_param_count(width, depth, vocab_size, context_length) -> int:
  return (
    vocab_size * width
    + context_length * width
    + depth * block_param_count(width, 4 * width)
    + 2 * width
  )


# Published counts of timm's vit_{small,base,large}_patch16_224 without the
# head (they include the 197 x D position table, frozen and absent here) and
# of CLIP's text tower (L12 W512, vocab 49408, context 77).
STANDARD_VIT_COUNTS = {"S/16": 21_665_664, "B/16": 85_798_656, "L/16": 303_301_632}
ROUND_VIT_COUNTS = {"S/16": 22e6, "B/16": 86e6, "L/16": 304e6}


@pytest.mark.parametrize("variant", ["S/16", "B/16", "L/16"])
def test_vit_parameter_counts(variant):
  model = nnx.eval_shape(lambda: vit.VisionTransformer(variant, 224, rngs=nnx.Rngs(0)))
  got = count_params(model)
  config = vit.decode_variant(variant)
  expected = vit_param_count(
    config["width"], config["depth"], config["mlp_dim"], config["patch_size"]
  )
  print(f"ViT-{variant} @224: {got:,} parameters ({got / 1e6:.2f}M)")
  assert got == expected
  assert abs(got / STANDARD_VIT_COUNTS[variant] - 1) < 0.02
  assert abs(got / ROUND_VIT_COUNTS[variant] - 1) < 0.02
  assert model.num_patches == 196 and model.patch_size == 16
  assert model.width == config["width"]


def test_text_parameter_count():
  model = nnx.eval_shape(
    lambda: text.TextTransformer("base", VOCAB_SIZE, CONTEXT_LENGTH, rngs=nnx.Rngs(0))
  )
  got = count_params(model)
  expected = text_param_count(512, 12, VOCAB_SIZE, CONTEXT_LENGTH)
  token_embedding = math.prod(model.token_embedding.embedding.shape)
  print(f"text base: {got:,} parameters ({got / 1e6:.2f}M), token embedding {token_embedding:,}")
  assert got == expected
  assert abs(got / 63e6 - 1) < 0.02
  assert token_embedding == VOCAB_SIZE * 512
  assert abs(token_embedding / 25.3e6 - 1) < 0.02
  assert model.width == 512


def test_position_embedding_is_not_state(mu_vit):
  model = mu_vit
  table_shapes = {
    (1 + model.num_patches, model.width),
    (model.num_patches, model.width),
    (1, 1 + model.num_patches, model.width),
  }
  # Not a parameter, and not any other kind of nnx variable either.
  for leaf in jax.tree.leaves(nnx.state(model)):
    assert leaf.shape not in table_shapes
  assert count_params(model) == vit_param_count(64, 2, 128, 8)
  # Gradients cannot reach it, and the model uses exactly the numpy table.
  np.testing.assert_array_equal(
    model.position_embedding(), vit.sincos_2d_position_embedding(model.width, model.grid_size)
  )


def test_sincos_position_embedding_values():
  table = vit.sincos_2d_position_embedding(8, 2)
  assert table.shape == (5, 8) and table.dtype == np.float32
  np.testing.assert_array_equal(table[0], np.zeros(8))
  # width 8 -> 2 frequencies per (sin|cos, axis): omega = [1, 1/100].
  # Patch t is at (row, col) = divmod(t, 2); channels are
  # [sin(r), sin(r/100), cos(r), cos(r/100), sin(c), sin(c/100), cos(c),
  # cos(c/100)] (MERU/MoCo-v3 layout: torch.meshgrid "ij" puts the row first).
  s1, s01, c1, c01 = np.sin(1), np.sin(0.01), np.cos(1), np.cos(0.01)
  expected = np.array(
    [
      [0, 0, 1, 1, 0, 0, 1, 1],  # (0, 0)
      [0, 0, 1, 1, s1, s01, c1, c01],  # (0, 1)
      [s1, s01, c1, c01, 0, 0, 1, 1],  # (1, 0)
      [s1, s01, c1, c01, s1, s01, c1, c01],  # (1, 1)
    ]
  )
  np.testing.assert_allclose(table[1:], expected, atol=1e-7)


def test_decode_variant():
  assert vit.decode_variant("B/16") == dict(
    width=768, depth=12, heads=12, mlp_dim=3072, patch_size=16
  )
  assert vit.decode_variant("mu/8")["patch_size"] == 8
  with pytest.raises(ValueError, match="valid sizes"):
    vit.decode_variant("H/14")
  with pytest.raises(ValueError):
    vit.decode_variant("B")


# Jitted: one compile per shape instead of one per op.
_keep_indices = jax.jit(vit.random_keep_indices, static_argnums=(1, 2, 3))


def test_random_keep_indices():
  keep = _keep_indices(jax.random.key(0), 16, 50, 0.5)
  assert keep.shape == (16, 25) and keep.dtype == jnp.int32
  keep = np.asarray(keep)
  assert np.all(np.diff(keep, axis=1) > 0)  # sorted and unique
  assert keep.min() >= 0 and keep.max() < 50
  assert len({tuple(row) for row in keep}) == 16  # independent per example
  abstract = jax.eval_shape(
    lambda key: vit.random_keep_indices(key, 2, 196, 0.75), jax.random.key(0)
  )
  assert abstract.shape == (2, 49)


_jitted_apply = module_jit(lambda model, *inputs, **kwargs: model(*inputs, **kwargs))


def apply(model, *inputs, **kwargs):
  """Jitted forward (one compile instead of op-by-op eager dispatch), as
  NumPy: indexing a jax.Array outside jit compiles too."""
  return jax.device_get(_jitted_apply(model, *inputs, **kwargs))


# Built under jit: one (fast) compile instead of one per initialiser shape.
@pytest.fixture(scope="module")
def mu_vit():
  return build(lambda: vit.VisionTransformer("mu/8", 32, rngs=nnx.Rngs(0)))


@pytest.fixture(scope="module")
def mu_text():
  return build(lambda: text.TextTransformer("mu", TEXT_VOCAB, TOKENS_LENGTH, rngs=nnx.Rngs(0)))


@jax.jit
def _image_draw(key):
  return jax.random.uniform(key, (2, 32, 32, 3))


def _images(batch=2):
  """NumPy copies of one compiled draw (the batch-1 images are its first row)."""
  return np.asarray(_image_draw(jax.random.key(1)))[:batch]


def test_vit_keep_all_equals_none_and_masked_is_finite(mu_vit):
  model = mu_vit
  images = _images()
  full = apply(model, images)
  assert full.shape == (2, 64) and full.dtype == jnp.float32
  all_in_order = np.tile(np.arange(model.num_patches, dtype=np.int32), (2, 1))
  np.testing.assert_allclose(
    apply(model, images, keep_indices=all_in_order), full, atol=1e-5, rtol=1e-5
  )
  keep = _keep_indices(jax.random.key(2), 2, model.num_patches, 0.5)
  masked = apply(model, images, keep_indices=keep)
  assert masked.shape == (2, 64)
  assert np.all(np.isfinite(masked))
  assert not np.allclose(masked, full, atol=1e-3)


def test_vit_kept_patches_keep_their_positions(mu_vit):
  # Dropping patches changes the output only through attention: a model
  # whose CLS sees only patch 5 must match whether patch 5 is passed alone
  # or the image is otherwise different outside patch 5.
  model = mu_vit
  images = _images(batch=1)
  other = images.copy()
  other[:, :, 16:] = 0.3  # patch 5 = rows 8:16, cols 8:16
  keep = np.array([[5]], np.int32)
  alone = apply(model, images, keep_indices=keep)
  np.testing.assert_allclose(apply(model, other, keep_indices=keep), alone, atol=1e-6)
  # Same pixels at a different position give a different feature.
  shifted = np.roll(images, 8, axis=2)  # patch 5's content moves to patch 6
  assert not np.allclose(
    apply(model, shifted, keep_indices=np.array([[6]], np.int32)), alone, atol=1e-4
  )


TOKENS_LENGTH = 16
TEXT_VOCAB = 100
EOT = TEXT_VOCAB - 1


def _tokens():
  return np.array(
    [
      [3, 17, 42, 8, 5, EOT] + [0] * 10,
      [12, 7, EOT] + [0] * 13,
    ],
    np.int32,
  )


def test_text_pools_at_eot_causally(mu_text):
  model = mu_text
  tokens = _tokens()
  out = apply(model, tokens)
  assert out.shape == (2, 64) and out.dtype == jnp.float32
  # Anything after EOT (smaller than EOT, so argmax is unchanged) is
  # invisible to the EOT position under the causal mask.
  after = tokens.copy()
  after[0, 6:], after[1, 3:] = np.arange(1, 11), 50
  np.testing.assert_allclose(apply(model, after), out, atol=1e-6)
  # A token before EOT changes the feature of that row only.
  before = tokens.copy()
  before[0, 2] = 43
  changed = apply(model, before)
  assert not np.allclose(changed[0], out[0], atol=1e-4)
  np.testing.assert_allclose(changed[1], out[1], atol=1e-6)


def test_text_accepts_shorter_inputs(mu_text):
  # Padding after EOT does not matter, so truncating it does not either. The
  # identity is checked in float64: in float32 the two lengths run matrix
  # products blocked differently, so the sums are reordered by a CPU-specific
  # amount (1.4e-6 on an AMD EPYC, 0 on a Xeon); in float64 the same
  # reordering is ~1e-15 of the features' scale.
  with jax.enable_x64(True):
    # Built abstractly, with mu_text's weights in float64 (no second init).
    model = nnx.eval_shape(
      lambda: text.TextTransformer(
        "mu",
        TEXT_VOCAB,
        TOKENS_LENGTH,
        dtype=jnp.float64,
        param_dtype=jnp.float64,
        rngs=nnx.Rngs(0),
      )
    )
    nnx.update(model, jax.tree.map(lambda x: np.asarray(x, np.float64), nnx.state(mu_text)))
    tokens = _tokens()
    full, truncated = apply(model, tokens), apply(model, tokens[:, :8])
    assert full.dtype == jnp.float64
    np.testing.assert_allclose(truncated, full, rtol=0, atol=1e-12 * float(np.abs(full).max()))
  with pytest.raises(ValueError, match="context length"):
    mu_text(np.zeros((1, TOKENS_LENGTH + 1), np.int32))


def _reference_attention(x, qkv_kernel, qkv_bias, out_kernel, out_bias, heads, allowed):
  x = np.asarray(x, np.float64)
  batch, length, width = x.shape
  qkv = x @ np.asarray(qkv_kernel) + np.asarray(qkv_bias)
  qkv = qkv.reshape(batch, length, 3, heads, width // heads)
  q, k, v = (qkv[:, :, i].transpose(0, 2, 1, 3) for i in range(3))
  logits = q @ k.transpose(0, 1, 3, 2) / math.sqrt(width // heads)
  logits = np.where(allowed, logits, -np.inf)
  probs = np.exp(logits - logits.max(-1, keepdims=True))
  probs /= probs.sum(-1, keepdims=True)
  out = (probs @ v).transpose(0, 2, 1, 3).reshape(batch, length, width)
  return out @ np.asarray(out_kernel) + np.asarray(out_bias)


@pytest.mark.parametrize("causal", [False, True])
def test_attention_matches_reference(causal):
  # Built in one compiled call (eagerly each initialiser and draw compiles
  # on its own).
  def make():
    attention = transformer.MultiHeadSelfAttention(32, 4, causal=causal, rngs=nnx.Rngs(0))
    # Non-zero biases so that their placement is checked too.
    attention.qkv.bias[...] = jax.random.normal(jax.random.key(5), (96,))
    attention.out.bias[...] = jax.random.normal(jax.random.key(6), (32,))
    return attention

  attention = build(make)
  x = np.random.default_rng(1).normal(size=(2, 7, 32)).astype(np.float32)
  padding = np.array([[True] * 7, [True] * 5 + [False] * 2])
  allowed = np.broadcast_to(np.asarray(padding)[:, None, None, :], (2, 4, 7, 7))
  if causal:
    allowed = allowed & np.tril(np.ones((7, 7), bool))
  expected = _reference_attention(
    x,
    attention.qkv.kernel[...],
    attention.qkv.bias[...],
    attention.out.kernel[...],
    attention.out.bias[...],
    4,
    allowed,
  )
  masked = apply(attention, x, mask=padding)
  np.testing.assert_allclose(masked, expected, atol=1e-5, rtol=1e-5)
  # A padding mask equals dropping the padded keys.
  np.testing.assert_allclose(masked[1, :5], apply(attention, x[1:, :5])[0], atol=1e-5, rtol=1e-5)


def test_mlp_exact_gelu_and_layer_norm_epsilon(mu_vit):
  mlp = build(lambda: transformer.MlpBlock(8, 16, rngs=nnx.Rngs(0)))
  x = 3 * np.random.default_rng(1).normal(size=(4, 8)).astype(np.float32)
  hidden = np.asarray(x) @ np.asarray(mlp.fc1.kernel[...]) + np.asarray(mlp.fc1.bias[...])
  erf = np.vectorize(math.erf)
  exact_gelu = 0.5 * hidden * (1 + erf(hidden / math.sqrt(2)))
  expected = exact_gelu @ np.asarray(mlp.fc2.kernel[...]) + np.asarray(mlp.fc2.bias[...])
  np.testing.assert_allclose(apply(mlp, x), expected, atol=1e-5, rtol=1e-5)

  block = mu_vit.encoder.blocks[0]
  assert block.norm1.epsilon == block.norm2.epsilon == 1e-5
  assert mu_vit.norm.epsilon == 1e-5
  # CLIP/PyTorch-style init: LN ones / zeros, zero biases, small kernels.
  np.testing.assert_array_equal(block.norm1.scale[...], np.ones(64))
  np.testing.assert_array_equal(block.attn.qkv.bias[...], np.zeros(192))
  assert abs(float(np.std(np.asarray(block.mlp.fc1.kernel[...]))) - 0.02) < 0.002


def _relative_error(a, b):
  a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
  return np.linalg.norm(a - b) / np.linalg.norm(b)


def test_bfloat16_compute_close_to_float32(mu_vit, mu_text):
  images = _images()
  vit32 = mu_vit
  # Abstract construction (no init compute), then the float32 weights.
  vit16 = nnx.eval_shape(
    lambda: vit.VisionTransformer("mu/8", 32, dtype=jnp.bfloat16, rngs=nnx.Rngs(1))
  )
  nnx.update(vit16, nnx.state(vit32, nnx.Param))
  image_out = apply(vit16, images)
  assert image_out.dtype == jnp.float32
  assert np.all(np.isfinite(image_out))
  assert _relative_error(image_out, apply(vit32, images)) < 5e-2

  text32 = mu_text
  text16 = nnx.eval_shape(
    lambda: text.TextTransformer(
      "mu", TEXT_VOCAB, TOKENS_LENGTH, dtype=jnp.bfloat16, rngs=nnx.Rngs(1)
    )
  )
  nnx.update(text16, nnx.state(text32, nnx.Param))
  text_out = apply(text16, _tokens())
  assert np.all(np.isfinite(text_out))
  assert _relative_error(text_out, apply(text32, _tokens())) < 5e-2

  for model in (vit16, text16):
    dtypes = {leaf.dtype for leaf in jax.tree.leaves(nnx.state(model, nnx.Param))}
    assert dtypes == {jnp.dtype(jnp.float32)}


def _conv_tower_reference(tower, images, keep_indices=None):
  """The tower as written before the patch embedding became a matmul: the
  conv on the pixels, position embedding added, kept tokens gathered."""
  pixels = vit.normalized_pixels(images, tower.pixel_mean, tower.pixel_std, tower.dtype)
  batch = images.shape[0]
  tokens = tower.patch_embed(pixels).reshape(batch, tower.num_patches, tower.width)
  position = tower.position_embedding()
  tokens = tokens + jnp.asarray(position[1:], tower.dtype)
  if keep_indices is not None:
    tokens = jnp.take_along_axis(tokens, keep_indices[:, :, None], axis=1)
  cls = tower.cls_token[...][0] + jnp.asarray(position[:1], tower.dtype)
  tokens = jnp.concatenate([jnp.broadcast_to(cls, (batch, 1, tower.width)), tokens], axis=1)
  if tower.ln_pre is not None:
    tokens = tower.ln_pre(tokens)
  return tower.norm(tower.encoder(tokens)[:, 0])


@pytest.mark.parametrize("layout", ["meru", "openai"])
def test_matmul_patch_embedding_equals_the_conv_float64(layout):
  """embed_patches (reshape + one matrix product on the conv's own params)
  is the conv, in float64 to rounding: whole images and kept subsets, with
  and without the patch bias (OpenAI CLIP's layout has none)."""
  options = {} if layout == "meru" else dict(patch_bias=False, ln_pre=True)
  with jax.enable_x64(True):
    make = lambda: vit.VisionTransformer(
      "mu/8",
      32,
      dtype=jnp.float64,
      param_dtype=jnp.float64,
      rngs=nnx.Rngs(params=0),
      **options,
    )
    assert (nnx.eval_shape(make).patch_embed.bias is None) == (layout == "openai")

    # The tower's init, both paths and both references as ONE (fast) jitted
    # computation: run eagerly, every op of the tower is its own XLA compile
    # (~190 of them).
    @fast_compile_jit
    def both_paths():
      tower = make()
      images = jax.random.uniform(jax.random.key(1), (3, 32, 32, 3), jnp.float64)
      keep = vit.random_keep_indices(jax.random.key(2), 3, tower.num_patches, 0.5)
      pixels = vit.normalized_pixels(images, tower.pixel_mean, tower.pixel_std, tower.dtype)
      conv = tower.patch_embed(pixels).reshape(3, tower.num_patches, tower.width)
      matmul = tower.embed_patches(lora.patches(pixels, tower.patch_size))
      towers = [
        (tower(images, keep_indices=k), _conv_tower_reference(tower, images, k))
        for k in (None, keep)
      ]
      return conv, matmul, towers

    conv, matmul, towers = jax.device_get(both_paths())
    np.testing.assert_allclose(matmul, conv, rtol=0, atol=1e-13 * float(np.abs(conv).max()))
    for got, expected in towers:
      np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)
