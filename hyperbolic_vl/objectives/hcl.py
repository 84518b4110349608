"""HCL: Hyperbolic Contrastive Learning beyond objects (Ge et al., ICLR'23).

Image tower only: a ViT + MoCo-v2 MLP head g; a momentum copy (params m,
aux) gives the keys, m <- mu m + (1 - mu) theta before each step (MoCo).

Object branch (MoCo-v2, Euclidean InfoNCE on the hypersphere), two augmented
views x1, x2 of one object crop:
  q = g(x1)/|g(x1)|,  k = g_m(x2)/|g_m(x2)|
  L_euc = -log exp(q.k/tau) / (exp(q.k/tau) + sum_n exp(q.k_n/tau))
with k_n the queue (keys of earlier steps). After the step the global
batch's keys, all-gathered in device order, are enqueued at the pointer, so
the queue is the same for any number of devices.

Scene branch (hyperbolic): a scene region u (the union of an object's box and
1-5 other boxes, or the whole image) and an object v inside it are positives;
the objects of the other rows (other scenes, hence not in u) are negatives:
  z = proj(exp_0^c(s g(x))),  c = 1 / r^2                  (Poincare ball)
      proj: back to norm (1 - 1e-3) r when beyond it (released; ball_clip
      "tangent" clips the tangent at r - eps instead, see to_ball)
  L_hyp = CE over -d_D(z_u, z_v') / tau, v' over the global batch's objects
with z_u from the base encoder and z_v from the momentum encoder. Optionally
(default) the gradient of z_u is scaled by the inverse Poincare metric
(1 - c|z|^2)^2 / 4 (RSGD, `poincare.scale_grad_by_inverse_metric`).

  L = L_euc + lambda L_hyp        (r 4.5, lambda 0.1, eps 1e-5; lambda 0 = MoCo)
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from hyperbolic_vl.data import coco_boxes, pipeline
from hyperbolic_vl.geometry import poincare, safe
from hyperbolic_vl.geometry.poincare import to_ball
from hyperbolic_vl.models import two_towers
from hyperbolic_vl.models.vit import VisionTransformer
from hyperbolic_vl.objectives import base
from hyperbolic_vl.objectives import clip as clip_lib
from hyperbolic_vl.objectives import settings as settings_lib


class HclModel(nnx.Module):
  """ViT image tower + MoCo-v2 projection head (Linear-ReLU-Linear)."""

  geometry = "poincare"

  def __init__(
    self,
    *,
    image_variant: str,
    image_size: int,
    embed_dim: int,
    head_dim: int,
    dtype: str = "float32",
    rngs: nnx.Rngs,
  ):
    tower_dtype = two_towers.compute_dtype(dtype)
    self.feature_dtype = two_towers.feature_dtype(tower_dtype)
    self.image_tower = VisionTransformer(
      image_variant, image_size, dtype=tower_dtype, param_dtype=self.feature_dtype, rngs=rngs
    )
    width = self.image_tower.width
    head = dict(dtype=self.feature_dtype, param_dtype=self.feature_dtype, rngs=rngs)
    self.head_hidden = nnx.Linear(width, head_dim, **head)
    self.head_out = nnx.Linear(head_dim, embed_dim, **head)
    self.embed_dim = embed_dim

  def features(self, images: jax.Array) -> jax.Array:
    """Backbone features (linear probes read these), float32 (B, width)."""
    return self.image_tower(images).astype(self.feature_dtype)

  def __call__(self, images: jax.Array) -> jax.Array:
    """Head output g(x) in float32 (B, embed_dim), before any normalisation."""
    return self.head_out(jax.nn.relu(self.head_hidden(self.features(images))))


def replicated_gather(x: jax.Array, axis_name: str | None) -> jax.Array:
  """(b, ...) local rows -> (B, ...) in device order, typed as replicated.

  all_gather's result counts as device-varying for shard_map's replication
  check, but the queue (aux, out_spec P()) must be provably identical on
  every device: place the local rows in a zero (B, ...) array and psum,
  which adds exact zeros, so the values equal all_gather's.
  """
  if axis_name is None:
    return x
  size = jax.lax.axis_size(axis_name)
  full = jnp.zeros((x.shape[0] * size,) + x.shape[1:], x.dtype)
  start = jax.lax.axis_index(axis_name) * x.shape[0]
  full = jax.lax.dynamic_update_slice_in_dim(full, x, start, axis=0)
  return jax.lax.psum(full, axis_name)


class HclObjective(base.Objective):
  name = "hcl"
  geometry = "poincare"
  Settings = settings_lib.HclSettings

  def _get(self, key, default):
    return self.config.get(key, default)

  def build_model(self, config, *, vocab_size, context_length, rngs):
    del vocab_size, context_length
    m = config.model
    return HclModel(
      image_variant=m.image_variant,
      image_size=config.input.image_size,
      embed_dim=m.embed_dim,
      head_dim=m.get("head_dim", 2048),
      dtype=m.get("dtype", "float32"),
      rngs=rngs,
    )

  def project_params(self, params, model):
    del model
    return params  # no learned scalars to clamp

  def init_aux(self, model, params, rng):
    queue = jax.random.normal(rng, (int(self._get("queue_size", 4096)), model.embed_dim))
    return {
      "momentum": jax.tree.map(
        lambda x: jnp.array(x, copy=True), params
      ),  # own buffers: the step donates state
      "queue": clip_lib.l2_normalize(queue),
      "queue_ptr": jnp.zeros((), jnp.int32),
    }

  def _momentum_model(self, model, momentum_params):
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    nnx.replace_by_pure_dict(params, momentum_params)
    return nnx.merge(graphdef, params, rest)

  def loss(self, model, aux, batch, *, rng, axis_name):
    del rng
    tau = float(self._get("temperature", 0.2))
    mu = float(self._get("momentum", 0.999))
    radius = float(self._get("radius", 4.5))
    eps = float(self._get("eps", 1e-5))
    weight = float(self._get("hyp_weight", 0.1))
    c = 1.0 / radius**2

    # MoCo: the key encoder moves towards the current query encoder first.
    theta = jax.lax.stop_gradient(nnx.to_pure_dict(nnx.state(model, nnx.Param)))
    new_momentum = jax.tree.map(lambda m, t: mu * m + (1.0 - mu) * t, aux["momentum"], theta)
    key_model = self._momentum_model(model, new_momentum)

    # Object branch.
    q = clip_lib.l2_normalize(model(batch["view1"]))
    k = jax.lax.stop_gradient(clip_lib.l2_normalize(key_model(batch["view2"])))
    positive = jnp.sum(q * k, axis=-1, keepdims=True)
    negative = jnp.matmul(q, aux["queue"].T, precision=jax.lax.Precision.HIGHEST)
    logits = jnp.concatenate([positive, negative], axis=1) / tau
    loss_euc = base.cross_entropy(logits, jnp.zeros((q.shape[0],), jnp.int32))

    metrics = {"loss/euc": loss_euc}
    total = loss_euc
    if weight > 0:
      scale = float(self._get("hyp_input_scale", 1.0))
      ball_clip = str(self._get("ball_clip", "point"))
      z_scene = to_ball(
        model(batch["scene"]),
        radius,
        eps,
        bool(self._get("riemannian_grad", True)),
        scale,
        ball_clip,
      )
      z_object = jax.lax.stop_gradient(
        to_ball(key_model(batch["object"]), radius, eps, False, scale, ball_clip)
      )
      all_objects = base.gather_columns(z_object, axis_name)
      hyp_logits = -poincare.pairwise_dist(z_scene, all_objects, c) / tau
      loss_hyp = base.cross_entropy(hyp_logits, base.local_targets(q.shape[0], axis_name))
      total = total + weight * loss_hyp
      metrics.update(
        {
          "loss/hyp": loss_hyp,
          "norm/scene": jnp.mean(safe.safe_norm(z_scene)) / radius,
          "norm/object": jnp.mean(safe.safe_norm(z_object)) / radius,
        }
      )

    # Enqueue the global batch's keys in device order: identical everywhere.
    keys = replicated_gather(k, axis_name)
    queue_size = aux["queue"].shape[0]
    if queue_size % keys.shape[0]:
      raise ValueError(
        f"queue_size {queue_size} must be a multiple of the global batch {keys.shape[0]}"
      )
    queue = jax.lax.dynamic_update_slice(
      aux["queue"],
      keys.astype(aux["queue"].dtype),
      (aux["queue_ptr"], jnp.zeros_like(aux["queue_ptr"])),
    )
    new_aux = {
      "momentum": new_momentum,
      "queue": queue,
      "queue_ptr": (aux["queue_ptr"] + keys.shape[0]) % queue_size,
    }
    metrics["accuracy/euc"] = jnp.mean((jnp.argmax(logits, axis=1) == 0).astype(jnp.float32))
    return total, (metrics, new_aux)

  def scalar_metrics(self, model):
    return {}

  # -- hooks used by train.py --------------------------------------------------
  def make_train_iterator(self, config, tokenizer):
    del tokenizer
    data = config.input.data
    if data.name == "world":
      provider = coco_boxes.WorldBoxes(
        int(data.get("world_seed", 0)), "train", int(data.get("num_train", 100_000))
      )
    elif data.name == "coco_boxes":
      provider = coco_boxes.CocoBoxes(data.path, data.image_root)
    else:
      raise ValueError(f"HCL reads data.name 'world' or 'coco_boxes', got {data.name!r}")
    return HclIterator(
      provider,
      batch_size=config.input.batch_size,
      image_size=config.input.image_size,
      seed=config.seed,
      min_box_area=float(self._get("min_box_area", 0.0)),
      process_index=jax.process_index(),
      process_count=jax.process_count(),
    )


# ---------------------------------------------------------------------------
# Training examples.
# ---------------------------------------------------------------------------
def _jitter_expand(rng, box, scale=(1.0, 1.4), jitter=0.1):
  """Slightly expanded, jittered object window (normalised xyxy, clipped to [0,1])."""
  x0, y0, x1, y1 = box
  w, h = (x1 - x0) * rng.uniform(*scale), (y1 - y0) * rng.uniform(*scale)
  cx = (x0 + x1) / 2 + rng.uniform(-jitter, jitter) * w
  cy = (y0 + y1) / 2 + rng.uniform(-jitter, jitter) * h
  return np.clip([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], 0.0, 1.0)


def _sub_crop(rng, window, scale=(0.2, 1.0)):
  """MoCo's random resized crop (scale 0.2-1, aspect 3/4-4/3) inside `window`."""
  x0, y0, x1, y1 = window
  crop = pipeline.random_resized_crop_box(rng, scale=scale)  # within the unit square
  return np.asarray(
    [
      x0 + crop[0] * (x1 - x0),
      y0 + crop[1] * (y1 - y0),
      x0 + crop[2] * (x1 - x0),
      y0 + crop[3] * (y1 - y0),
    ]
  )


@dataclasses.dataclass
class HclIterator:
  """Batches: view1, view2 (object views), scene (region u), object (v in u).

  Example p of the stream uses scene index perm_epoch(p) and a generator
  seeded by (seed, p), so get_state/set_state (the position) replay exactly.
  Process i of n renders only rows [i b, (i + 1) b) of each global batch
  (b = batch_size / n): the processes' batches concatenate to the
  single-process batch, and no example enters the MoCo queue twice.
  """

  provider: object
  batch_size: int
  image_size: int
  seed: int
  min_box_area: float = 0.0
  whole_image_probability: float = 0.25
  position: int = 0
  process_index: int = 0
  process_count: int = 1

  def __post_init__(self):
    if self.batch_size % self.process_count or not 0 <= self.process_index < self.process_count:
      raise ValueError(
        f"batch_size {self.batch_size} must split evenly over {self.process_count} processes "
        f"(process_index {self.process_index})"
      )

  def __iter__(self):
    return self

  def _example(self, p: int):
    n = len(self.provider)
    epoch, offset = divmod(p, n)
    index = (
      int(np.random.default_rng((self.seed, epoch)).permutation(n)[offset])
      if n < 10**6
      else int(np.random.default_rng((self.seed, p)).integers(n))
    )
    rng = np.random.default_rng((self.seed, p, 0x68636C))
    boxes = self.provider.boxes(index)
    areas = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
    keep = np.flatnonzero(areas > self.min_box_area)
    if keep.size == 0:
      keep = np.arange(len(boxes))
    obj = int(rng.choice(keep))
    window = _jitter_expand(rng, boxes[obj])
    size = self.image_size
    view1 = self.provider.render(index, _sub_crop(rng, window), size)
    view2 = self.provider.render(index, _sub_crop(rng, window), size)
    others = [i for i in range(len(boxes)) if i != obj]
    if not others or rng.uniform() < self.whole_image_probability:
      region = np.array([0.0, 0.0, 1.0, 1.0])
    else:
      chosen = rng.choice(others, size=min(len(others), int(rng.integers(1, 6))), replace=False)
      region = np.concatenate(
        [boxes[[obj, *chosen]][:, :2].min(0), boxes[[obj, *chosen]][:, 2:].max(0)]
      )
    return (
      view1,
      view2,
      self.provider.render(index, region, size),
      self.provider.render(index, boxes[obj], size),
    )

  def __next__(self):
    local = self.batch_size // self.process_count
    first = self.position + self.process_index * local
    rows = [self._example(p) for p in range(first, first + local)]
    self.position += self.batch_size
    # uint8 to the device; the image tower scales to [0, 1] there.
    stack = lambda i: np.stack([r[i] for r in rows]).astype(np.uint8, copy=False)
    return {"view1": stack(0), "view2": stack(1), "scene": stack(2), "object": stack(3)}

  def get_state(self) -> dict:
    return {"position": int(self.position)}

  def set_state(self, state: dict) -> None:
    self.position = int(state["position"])
