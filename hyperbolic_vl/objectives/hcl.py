"""HCL: Hyperbolic Contrastive Learning beyond objects (Ge et al., ICLR'23).

Image tower only (models/hcl.py): a ViT + MoCo-v2 MLP head g; a momentum copy
(params m, aux) gives the keys, m <- mu m + (1 - mu) theta before each step.
Defaults follow the authors' released training code; the paper's readings
are options.

Object branch (MoCo-v2, Euclidean InfoNCE on the hypersphere), two augmented
views x1, x2 of one object crop:
  q_a = g(x_a)/|g(x_a)|,  k_a = g_m(x_a)/|g_m(x_a)|
  L(q, k, Q) = -log exp(q.k/tau) / (exp(q.k/tau) + sum_n exp(q.Q_n/tau))
  object_loss="symmetric" (released): mean over the 2b rows of
      L(q_1, k_2, Q_2) and L(q_2, k_1, Q_1), Q_a a queue of earlier k_a
  object_loss="paper": L(q_1, k_2, Q_2) only (the paper's formula)
After the step the global batch's keys, all-gathered in device order, are
enqueued at the pointer, so the queues are the same for any number of devices.

Scene branch (hyperbolic): a scene region u (the union box of 2-5 boxes
drawn from the image, the object's box added when not among them; or, with
input.data.sampling="whole_scene", the whole image sometimes) and an object
v inside it are positives:
  z = proj(exp_0^c(s g(x))),  c = 1 / r^2                  (Poincare ball)
      proj: back to norm (1 - 1e-3) r when beyond it (released; ball_clip
      "tangent" clips the tangent at r - eps instead, see to_ball)
  L_hyp = CE over [-d_D(z_u, z_v), -d_D(z_u, N_n)] / tau
with z_u from the base encoder and z_v from the momentum encoder, and
negatives N:
  hyp_negatives="queue" (released): a queue of earlier z_v (queue_size
      entries, initialised as unit vectors, inside the ball for r > 1)
  hyp_negatives="batch": the global batch's other objects
Optionally (default) the gradient of z_u is scaled by the inverse Poincare
metric (1 - c|z|^2)^2 / 4 (RSGD, `poincare.scale_grad_by_inverse_metric`).

  L = L_euc + lambda L_hyp        (r 4.5, lambda 0.1, eps 1e-5; lambda 0 = MoCo)
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp
from flax import nnx

from hyperbolic_vl.geometry import poincare, safe
from hyperbolic_vl.geometry.poincare import to_ball
from hyperbolic_vl.objectives import base, registry
from hyperbolic_vl.objectives import clip as clip_lib
from hyperbolic_vl.objectives import settings as settings_lib


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


def enqueue(queue: jax.Array, pointer: jax.Array, keys: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Writes the global batch's keys at the pointer (MoCo's ring buffer)."""
  if queue.shape[0] % keys.shape[0]:
    raise ValueError(
      f"queue_size {queue.shape[0]} must be a multiple of the global batch {keys.shape[0]}"
    )
  queue = jax.lax.dynamic_update_slice(
    queue, keys.astype(queue.dtype), (pointer, jnp.zeros_like(pointer))
  )
  return queue, (pointer + keys.shape[0]) % queue.shape[0]


def moco_logits(q: jax.Array, k: jax.Array, queue: jax.Array, tau: float) -> jax.Array:
  """(b, 1 + K) logits [q.k, q.Q_n] / tau; the positive is column 0."""
  positive = jnp.sum(q * k, axis=-1, keepdims=True)
  negative = jnp.matmul(q, queue.T, precision=jax.lax.Precision.HIGHEST)
  return jnp.concatenate([positive, negative], axis=1) / tau


@dataclasses.dataclass(frozen=True)
class HclSettings(settings_lib.ObjectiveSettings):
  """HCL: MoCo-v2 object branch plus the Poincare-ball scene-object branch."""

  name: ClassVar[str] = "hcl"
  temperature: float = 0.2  # MoCo-v2 tau
  momentum: float = 0.999  # key-encoder EMA
  queue_size: int = 65536  # MoCo queue
  radius: float = 4.5  # ball radius r
  hyp_weight: float = 0.1  # lambda of the hyperbolic term
  eps: float = 1e-5  # tangent clip margin, used only with ball_clip="tangent"
  # "point": project z to (1 - 1e-3) r after the exp map (released code);
  # "tangent": clip the tangent norm at r - eps before it (|z| <= 0.76 r).
  ball_clip: str = "point"
  riemannian_grad: bool = True
  # Fixed scale s before the exp map. 1 (released): the head's raw output
  # goes into the map. Other values are an option found in neither the paper
  # nor the released code (see geometry.poincare): ~1/sqrt(embed_dim) keeps
  # initial tangent norms ~1 < r, points far from the ball's edge.
  hyp_input_scale: float = 1.0
  # Negatives of a scene region u: "queue" (released) a queue_size queue of
  # earlier object keys on the ball; "batch" the global batch's other objects.
  hyp_negatives: str = "queue"
  # "symmetric" (released): both views are queries against the other's key,
  # each direction with its own queue; "paper": q(view1) against k(view2).
  object_loss: str = "symmetric"

  def __post_init__(self):
    settings_lib.check_choice(self, "ball_clip", ("point", "tangent"))
    settings_lib.check_choice(self, "hyp_negatives", ("queue", "batch"))
    settings_lib.check_choice(self, "object_loss", ("symmetric", "paper"))


@registry.register
class HclObjective(base.Objective):
  name = "hcl"
  geometry = "poincare"
  Settings = HclSettings

  # What the query encoder (trained) and the momentum key encoder (forward
  # only) read: view 1 -> query, view 2 -> key (and the other way round with
  # the symmetric object loss); the hyperbolic term's scene -> query, object -> key.
  @property
  def tower_inputs(self):
    symmetric = self.settings.object_loss == "symmetric"
    return (
      ("view1", "image"),
      *((("view2", "image"),) if symmetric else ()),
      *((("scene", "image"),) if self.settings.hyp_weight > 0 else ()),
    )

  @property
  def frozen_tower_inputs(self):
    symmetric = self.settings.object_loss == "symmetric"
    return (
      ("view2", "image"),
      *((("view1", "image"),) if symmetric else ()),
      *((("object", "image"),) if self.settings.hyp_weight > 0 else ()),
    )

  def check_model_config(self, model_config):
    name = dict(model_config).get("name", "two_towers")
    if name != "hcl":
      raise ValueError(
        f"objective 'hcl' needs model.name='hcl' (MoCo-v2's image model), got {name!r}"
      )

  def project_params(self, params, model):
    del model
    return params  # no learned scalars to clamp

  def init_aux(self, model, params, rng, context=base.EMPTY_CONTEXT):
    del context
    size, dim = self.settings.queue_size, model.embed_dim
    keys = jax.random.split(rng, 3)
    unit = lambda key: clip_lib.l2_normalize(jax.random.normal(key, (size, dim)))
    aux = {
      # Own buffers: the step donates its state.
      "momentum": jax.tree.map(lambda x: jnp.array(x, copy=True), params),
      # Earlier keys of view 2 (negatives of q_1), and of view 1 (of q_2).
      "queue": unit(keys[0]),
      "queue_ptr": jnp.zeros((), jnp.int32),
    }
    if self.settings.object_loss == "symmetric":
      aux["queue_view1"] = unit(keys[1])
      aux["queue_view1_ptr"] = jnp.zeros((), jnp.int32)
    if self.settings.hyp_weight > 0 and self.settings.hyp_negatives == "queue":
      # Earlier object points on the ball; unit vectors lie inside it (r > 1).
      aux["hyp_queue"] = unit(keys[2])
      aux["hyp_queue_ptr"] = jnp.zeros((), jnp.int32)
    return aux

  def _momentum_model(self, model, momentum_params):
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    nnx.replace_by_pure_dict(params, momentum_params)
    return nnx.merge(graphdef, params, rest)

  def loss(self, model, aux, batch, *, rng, axis_name, context=base.EMPTY_CONTEXT):
    del rng, context
    hp = self.settings
    tau, mu, radius = hp.temperature, hp.momentum, hp.radius
    curv = 1.0 / radius**2
    new_aux = dict(aux)

    # MoCo: the key encoder moves towards the current query encoder first.
    theta = jax.lax.stop_gradient(nnx.to_pure_dict(nnx.state(model, nnx.Param)))
    new_momentum = jax.tree.map(lambda m, t: mu * m + (1.0 - mu) * t, aux["momentum"], theta)
    new_aux["momentum"] = new_momentum
    key_model = self._momentum_model(model, new_momentum)
    key = lambda images: jax.lax.stop_gradient(clip_lib.l2_normalize(key_model(images)))

    # Object branch.
    q1 = clip_lib.l2_normalize(model(batch["view1"]))
    k2 = key(batch["view2"])
    logits = moco_logits(q1, k2, aux["queue"], tau)
    new_aux["queue"], new_aux["queue_ptr"] = enqueue(
      aux["queue"], aux["queue_ptr"], replicated_gather(k2, axis_name)
    )
    if hp.object_loss == "symmetric":
      q2 = clip_lib.l2_normalize(model(batch["view2"]))
      k1 = key(batch["view1"])
      logits = jnp.concatenate([logits, moco_logits(q2, k1, aux["queue_view1"], tau)], axis=0)
      new_aux["queue_view1"], new_aux["queue_view1_ptr"] = enqueue(
        aux["queue_view1"], aux["queue_view1_ptr"], replicated_gather(k1, axis_name)
      )
    loss_euc = base.cross_entropy(logits, jnp.zeros((logits.shape[0],), jnp.int32))
    metrics = {
      "loss/euc": loss_euc,
      "accuracy/euc": jnp.mean((jnp.argmax(logits, axis=1) == 0).astype(jnp.float32)),
    }
    total = loss_euc

    if hp.hyp_weight > 0:
      ball = lambda x, riemannian: to_ball(
        x, radius, hp.eps, riemannian, hp.hyp_input_scale, hp.ball_clip
      )
      z_scene = ball(model(batch["scene"]), hp.riemannian_grad)
      z_object = jax.lax.stop_gradient(ball(key_model(batch["object"]), False))
      if hp.hyp_negatives == "queue":
        positive = -poincare.dist(z_scene, z_object, curv)[:, None]
        negative = -poincare.pairwise_dist(z_scene, aux["hyp_queue"], curv)
        hyp_logits = jnp.concatenate([positive, negative], axis=1) / tau
        targets = jnp.zeros((z_scene.shape[0],), jnp.int32)
        new_aux["hyp_queue"], new_aux["hyp_queue_ptr"] = enqueue(
          aux["hyp_queue"], aux["hyp_queue_ptr"], replicated_gather(z_object, axis_name)
        )
      else:
        all_objects = base.gather_columns(z_object, axis_name)
        hyp_logits = -poincare.pairwise_dist(z_scene, all_objects, curv) / tau
        targets = base.local_targets(z_scene.shape[0], axis_name)
      loss_hyp = base.cross_entropy(hyp_logits, targets)
      total = total + hp.hyp_weight * loss_hyp
      metrics.update(
        {
          "loss/hyp": loss_hyp,
          "norm/scene": jnp.mean(safe.safe_norm(z_scene)) / radius,
          "norm/object": jnp.mean(safe.safe_norm(z_object)) / radius,
        }
      )
    return total, (metrics, new_aux)

  def scalar_metrics(self, model):
    return {}
