"""UNCHA (CVPR 2026): HyCoCLIP with several boxes per image, a radius-based
uncertainty that weights the box-to-whole contrastive rows and calibrates
the part-whole entailment, three learned logit scales and an angle floor.

Each example is a whole image I with its caption T and up to N grounded
boxes (N = 5 as released): box crops I_b and phrases T_b, with a validity
mask (`box_mask`, from a source's `max_boxes`). All go through the model in
one step onto one hyperboloid of curvature -c. With d the Lorentz distance,
CE(rows -> columns) the softmax cross-entropy of the logits against the
gathered columns of the WHOLE global batch (invalid box slots masked out),
and m ranging over valid boxes, each with its parent image and caption,

  L_g  = 1/2 [CE(-s_g d(I, T)) + CE(-s_g d(T, I))]                  (rows: images)
  L_l  = 1/2 [CE(-s_l d(I_b, T_b)) + CE(-s_l d(T_b, I_b))]          (rows: boxes)
  L_gl = 1/2 [CE(w^I_m s_gl (-d(I_b, T_par))) + CE(w^T_m s_gl (-d(T_b, I_par)))]

where T_par / I_par repeat each whole caption / image once per valid box
(the box's own parent is its positive; its siblings' copies of the same
parent are negatives with the positive's logit, as released), s_g, s_l,
s_gl are three learned scales (`log_logit_scale`, `log_logit_scale_local`,
`log_logit_scale_global_local`, each clamped <= ln 100), and the row weight
w_m = clip(exp(-u_m / 2), 0.1, 10) with u_m = sg(softplus(-|x_m|)) the
box embedding's uncertainty (|.| the Euclidean norm of the space components;
u lies in (0, ln 2], so the clip never binds). With ext the exterior angle,
aper MERU's half aperture (K = 0.1) and the residual with its angle floor

  r(x, y; f) = relu(ext(x, y) - f aper(x)) + 0.1 ext(x, y),

the entailment terms are

  E_TI  = 1/2 mean_b r(T, I; 0.7)          E_box = 1/2 mean_m r(T_b, I_b; 0.7)
  rho^I_m = r(I_b, I_par; 1.2)             rho^T_m = r(T_b, T_par; 1.2)
  UC(rho, l) = 10 [mean_m (1/2 sg(rho_m) / (clip(e^l_m, 1e-6, 1e6) + 1e-6) + 1/2 l_m)
                   + H(softmax(l))],  H(p) = -sum p log(p + 1e-8),  l_m = softplus(-|x_m|)
  L_ent = E_TI + E_box + 1/2 (mean 1/2 rho^I + mean 1/2 rho^T) + UC(rho^I, l^I) + UC(rho^T, l^T)

and L = L_g + L_l + L_gl + 0.2 L_ent.

Reductions (`box_reduction`). The release takes every box mean and the
entropy's softmax over the valid boxes of ONE GPU's rows (192 images), and
DDP averages the GPUs' losses, so its loss depends on the device count.
"global" (the default) takes them over every valid box of the global batch,
so 1 device == N devices as for every objective here. "per_device" groups
the global batch's rows in consecutive blocks of `rows_per_device` rows
(0: the rows each device of this run holds) and averages each block's
means and entropy, which is the release's loss on any device count when
`rows_per_device` is the release's 192. In both, the contrastive columns are
the whole global batch, as released.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp
import optax

from hyperbolic_vl import errors
from hyperbolic_vl.geometry import lorentz, safe
from hyperbolic_vl.objectives import base, entailment_weight, meru, registry
from hyperbolic_vl.objectives import settings as settings_lib

# The model's logit scales besides `log_logit_scale` (s_g) and their inits
# (the release's 1/0.05 and 1/0.06): `model.extra_logit_scales` in the configs.
EXTRA_LOGIT_SCALES = {"local": 1 / 0.05, "global_local": 1 / 0.06}
# A masked column's logit: exp(-1e9 - max) is 0 in float32 and float64, and
# the gradient of a `where` never reaches the masked entry.
_MASKED_LOGIT = -1e9
LEVELS = ("box_text", "text", "box_image", "image")


def uncertainty(x: jax.Array) -> jax.Array:
  """softplus(-|x|), |x| the Euclidean norm of the space components: the
  release's uncertainty (larger near the origin), shape (n,)."""
  return jax.nn.softplus(-safe.safe_norm(x))


def floored_residual(
  general: jax.Array, specific: jax.Array, curv: jax.Array, aperture_factor: float, floor: float
) -> jax.Array:
  """relu(ext - f aper) + floor ext per pair, shape (n,) (the release's
  piecewise-continuous entailment residual)."""
  angle = lorentz.oxy_angle(general, specific, curv)
  aperture = lorentz.half_aperture(general, curv)
  return jax.nn.relu(angle - aperture_factor * aperture) + floor * angle


def row_cross_entropy(logits: jax.Array, targets: jax.Array) -> jax.Array:
  """Per-row softmax cross-entropy (n,)."""
  return optax.softmax_cross_entropy_with_integer_labels(logits, targets)


@dataclasses.dataclass(frozen=True)
class UnchaSettings(entailment_weight.EntailmentWeightSettings, settings_lib.ObjectiveSettings):
  """UNCHA: three contrastive terms plus lambda x (entailment + calibration)."""

  name: ClassVar[str] = "uncha"
  entail_weight: float = 0.2  # lambda (configs/train_uncha_vit_l.py)
  inter_modal_aperture: float = 0.7  # text -> image, phrase -> box
  intra_modal_aperture: float = 1.2  # box -> image, phrase -> caption
  angle_floor: float = 0.1  # the residual's + 0.1 ext
  calibration_weight: float = 10.0  # alpha of the calibration term
  uncertainty_temperature: float = 0.5  # w = exp(-0.5 u)
  temperature_clamp: tuple[float, float] = (0.1, 10.0)  # w's clip
  # "global": box means and entropy over the global batch (1 device == N);
  # "per_device": over blocks of rows_per_device rows (the release: 192).
  box_reduction: str = "global"
  rows_per_device: int = 0  # per_device's block; 0: each device's own rows

  def __post_init__(self):
    settings_lib.check_choice(self, "box_reduction", ("global", "per_device"))
    if self.rows_per_device < 0:
      raise ValueError(f"objective.rows_per_device must be >= 0, got {self.rows_per_device}")
    self.check_entailment_weight()


def _axis_size(axis_name) -> int:
  return 1 if axis_name is None else jax.lax.psum(1, axis_name)


@registry.register
class UnchaObjective(base.Objective):
  name = "uncha"
  geometry = "lorentz"
  Settings = UnchaSettings
  tower_inputs = (
    ("image", "image"),
    ("tokens", "text"),
    ("box_image", "image"),
    ("box_tokens", "text"),
  )

  def check_model_config(self, model_config):
    super().check_model_config(model_config)
    extra = dict(dict(model_config).get("extra_logit_scales") or {})
    missing = sorted(set(EXTRA_LOGIT_SCALES) - set(extra))
    if missing:
      raise ValueError(
        f"objective 'uncha' needs model.extra_logit_scales with {sorted(EXTRA_LOGIT_SCALES)} "
        f"(configs/uncha.py sets them); missing {missing}"
      )
    entailment_weight.check_model_config(self.settings, model_config)

  def init_aux(self, model, params, rng, context=base.EMPTY_CONTEXT):
    del model, params, rng, context
    return entailment_weight.init_aux(self.settings)

  def check_input_config(self, input_config):
    # The loss reads N box slots per row and their mask (`input.data.max_boxes`
    # = N of a grounded source); with none, the batch holds one box or none.
    data = dict(dict(input_config).get("data") or {})
    max_boxes = data.get("max_boxes")
    if not isinstance(max_boxes, int) or isinstance(max_boxes, bool) or max_boxes < 1:
      given = (
        f"input.data.max_boxes={max_boxes!r}"
        if "max_boxes" in data
        else f"input.data.name={data.get('name')!r} has no box slots"
      )
      raise errors.ConfigError(
        "objective 'uncha' needs box slots: a grounded source (world_boxes, grit, "
        f"coco_grounded) with input.data.max_boxes >= 1 (configs/uncha.py: 4, released: 5); "
        f"got {given}"
      )

  def fresh_params(self):
    # A run initialised from MERU or HyCoCLIP has no such scales.
    return (
      *(f"log_logit_scale_{name}" for name in EXTRA_LOGIT_SCALES),
      *entailment_weight.fresh_params(self.settings),
    )

  def scalar_metrics(self, model):
    metrics = super().scalar_metrics(model)
    for name in EXTRA_LOGIT_SCALES:
      metrics[f"logit_scale_{name}"] = model.extra_logit_scale(name)
    return metrics

  def embed(self, model, batch) -> dict[str, jax.Array]:
    """Whole images and every box slot through one image-tower call, captions
    and every phrase slot through one text-tower call; boxes (b N, D) in
    row-major (example, slot) order."""
    num_rows = batch["image"].shape[0]
    box_images = batch["box_image"]
    box_images = box_images.reshape(-1, *box_images.shape[2:])
    box_tokens = batch["box_tokens"].reshape(-1, batch["box_tokens"].shape[-1])
    images = model.encode_image(
      jnp.concatenate([batch["image"], box_images.astype(batch["image"].dtype)])
    )
    texts = model.encode_text(jnp.concatenate([batch["tokens"], box_tokens]))
    return {
      "image": images[:num_rows],
      "box_image": images[num_rows:],
      "text": texts[:num_rows],
      "box_text": texts[num_rows:],
    }

  def box_weights(self, mask: jax.Array, local_rows: int, axis_name) -> tuple[jax.Array, jax.Array]:
    """(weights, block_of_slot) of this device's box slots: a valid slot's
    weight is 1 / (its block's valid boxes x the number of blocks) times the
    device count, so that the step's pmean of sum(weight x value) is the mean
    over blocks of each block's mean; invalid slots weigh 0. block_of_slot
    (b N,) numbers each local slot's block in the global batch."""
    settings = self.settings
    num_devices = _axis_size(axis_name)
    global_rows = local_rows * num_devices
    if settings.box_reduction == "global":
      block = global_rows
    else:
      block = settings.rows_per_device or local_rows
      if global_rows % block:
        raise ValueError(
          f"objective.rows_per_device={block} must divide the global batch ({global_rows} rows)"
        )
    num_blocks = global_rows // block
    all_mask = base.gather_columns(mask, axis_name)  # (B, N)
    counts = all_mask.reshape(num_blocks, -1).sum(axis=1).astype(jnp.result_type(float))
    first_row = 0 if axis_name is None else jax.lax.axis_index(axis_name) * local_rows
    row_block = (first_row + jnp.arange(local_rows)) // block
    slot_block = jnp.repeat(row_block, mask.shape[1])
    per_slot = 1.0 / (jnp.maximum(counts[slot_block], 1.0) * num_blocks)
    return jnp.where(mask.reshape(-1), per_slot * num_devices, 0.0), slot_block

  def block_entropy(self, log_u: jax.Array, mask: jax.Array, local_rows: int, axis_name):
    """Mean over blocks of H(softmax(l) over the block's valid boxes), the same
    on every device (computed from the gathered l, whose transpose returns
    each device its share of the gradient)."""
    settings = self.settings
    global_rows = local_rows * _axis_size(axis_name)
    block = global_rows if settings.box_reduction == "global" else settings.rows_per_device
    block = block or local_rows
    all_log_u = base.gather_columns(log_u, axis_name).reshape(global_rows // block, -1)
    all_mask = base.gather_columns(mask.reshape(-1), axis_name).reshape(global_rows // block, -1)
    logits = jnp.where(all_mask, all_log_u, _MASKED_LOGIT)
    probs = jax.nn.softmax(logits, axis=-1)
    entropy = -jnp.sum(jnp.where(all_mask, probs * jnp.log(probs + 1e-8), 0.0), axis=-1)
    return entropy.mean()

  def loss(self, model, aux, batch, *, rng, axis_name, context=base.EMPTY_CONTEXT):
    del rng, context
    settings = self.settings
    curv = model.curv()
    emb = self.embed(model, batch)
    mask = batch["box_mask"].astype(bool)
    local_rows, slots = mask.shape
    flat_mask = mask.reshape(-1)
    weights, _ = self.box_weights(mask, local_rows, axis_name)
    # The step averages over devices; the whole-image terms are per-row means
    # over equal row counts, the box terms weighted sums (box_weights).
    box_mean = lambda values: jnp.sum(weights * values)
    scale_g = model.logit_scale()
    scale_l = model.extra_logit_scale("local")
    scale_gl = model.extra_logit_scale("global_local")

    gathered = {key: base.gather_columns(emb[key], axis_name) for key in emb}
    all_mask = base.gather_columns(flat_mask, axis_name)  # (B N,)
    row_targets = base.local_targets(local_rows, axis_name)
    slot_targets = base.local_targets(local_rows * slots, axis_name)
    masked = lambda logits: jnp.where(all_mask[None, :], logits, _MASKED_LOGIT)
    dist = lambda rows, columns: lorentz.pairwise_dist(rows, columns, curv)
    # Each whole image / caption once per slot, as released (T_par, I_par).
    parent = {key: jnp.repeat(gathered[key], slots, axis=0) for key in ("image", "text")}
    local_parent = {key: jnp.repeat(emb[key], slots, axis=0) for key in ("image", "text")}

    metrics = {}
    metrics["loss/contrastive/global"] = 0.5 * (
      base.cross_entropy(-scale_g * dist(emb["image"], gathered["text"]), row_targets)
      + base.cross_entropy(-scale_g * dist(emb["text"], gathered["image"]), row_targets)
    )
    metrics["loss/contrastive/local"] = 0.5 * box_mean(
      row_cross_entropy(
        masked(-scale_l * dist(emb["box_image"], gathered["box_text"])), slot_targets
      )
      + row_cross_entropy(
        masked(-scale_l * dist(emb["box_text"], gathered["box_image"])), slot_targets
      )
    )
    low, high = settings.temperature_clamp
    temperature = lambda x: jnp.clip(
      jnp.exp(-settings.uncertainty_temperature * jax.lax.stop_gradient(uncertainty(x))), low, high
    )
    metrics["loss/contrastive/global_local"] = 0.5 * box_mean(
      row_cross_entropy(
        masked(
          scale_gl
          * temperature(emb["box_image"])[:, None]
          * -dist(emb["box_image"], parent["text"])
        ),
        slot_targets,
      )
      + row_cross_entropy(
        masked(
          scale_gl * temperature(emb["box_text"])[:, None] * -dist(emb["box_text"], parent["image"])
        ),
        slot_targets,
      )
    )

    inter, intra, floor = (
      settings.inter_modal_aperture,
      settings.intra_modal_aperture,
      settings.angle_floor,
    )
    metrics["loss/entailment/text_image"] = (
      0.5 * floored_residual(emb["text"], emb["image"], curv, inter, floor).mean()
    )
    metrics["loss/entailment/box_text_box_image"] = 0.5 * box_mean(
      floored_residual(emb["box_text"], emb["box_image"], curv, inter, floor)
    )
    for label, box_key, whole_key in (
      ("box_image_image", "box_image", "image"),
      ("box_text_text", "box_text", "text"),
    ):
      residual = floored_residual(emb[box_key], local_parent[whole_key], curv, intra, floor)
      metrics[f"loss/entailment/{label}"] = box_mean(0.5 * residual)
      log_u = uncertainty(emb[box_key])
      u = jnp.clip(jnp.exp(log_u), 1e-6, 1e6)
      calibration = 0.5 * jax.lax.stop_gradient(residual) / (u + 1e-6) + 0.5 * log_u
      entropy = self.block_entropy(log_u, mask, local_rows, axis_name)
      metrics[f"loss/calibration/{label}"] = settings.calibration_weight * (
        box_mean(calibration) + entropy
      )
      metrics[f"uncertainty_entropy/{label}"] = entropy
    contrastive = (
      metrics["loss/contrastive/global"]
      + metrics["loss/contrastive/local"]
      + metrics["loss/contrastive/global_local"]
    )
    entail = (
      metrics["loss/entailment/text_image"]
      + metrics["loss/entailment/box_text_box_image"]
      + 0.5
      * (metrics["loss/entailment/box_image_image"] + metrics["loss/entailment/box_text_text"])
      + metrics["loss/calibration/box_image_image"]
      + metrics["loss/calibration/box_text_text"]
    )
    weighted, weight_metrics, aux = entailment_weight.weighted_entailment(
      settings, model, aux, entail
    )
    total = contrastive + weighted
    metrics.update(weight_metrics)
    metrics["loss/contrastive"] = contrastive
    metrics["loss/entailment"] = entail
    metrics["valid_boxes_per_image"] = flat_mask.sum() / local_rows
    metrics["exp_map_capped_fraction"] = meru.capped_fraction(
      jnp.concatenate([emb["image"], emb["box_image"]]),
      jnp.concatenate([emb["text"], emb["box_text"]]),
      curv,
    )
    origin = lambda x: lorentz.dist_to_origin(x, curv)
    metrics["mean_dist_origin/image"] = origin(emb["image"]).mean()
    metrics["mean_dist_origin/text"] = origin(emb["text"]).mean()
    metrics["mean_dist_origin/box_image"] = box_mean(origin(emb["box_image"]))
    metrics["mean_dist_origin/box_text"] = box_mean(origin(emb["box_text"]))
    return total, ({**metrics, **self.scalar_metrics(model)}, aux)

  def score(self, model, image_emb, text_emb):
    # As MERU and the release's evaluation: the Lorentzian inner product.
    return lorentz.pairwise_inner(image_emb, text_emb, model.curv())
