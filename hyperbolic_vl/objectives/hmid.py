"""HMID-Net: masked-image student + frozen teacher, distilled in hyperbolic space.

Student: MERU two towers (config.model); a random subset of its image patches
(`mask_ratio`, default 0.5) is dropped before the ViT runs, so the image tower
costs about (1 - mask_ratio) of a full pass. Teacher: a frozen two-tower
model restored from another run of this codebase (`teacher_workdir`); it sees
the full image. x_S/y_S: student text/image embeddings, x_T/y_T: teacher
text/image embeddings lifted onto the STUDENT's hyperboloid (curvature c of
the student), s = exp(log_logit_scale) of the student.

  L_HCL = 1/2 [CE(-s d(y_S, x_S)) + CE(-s d(x_S, y_S))]          (MERU, eq. 7)
  L_I->T = CE_j(-s d(y_S_i, x_T_j))                               (eq. 8)
  L_T->I = CE_j(-s d(x_S_i, y_T_j))                               (eq. 9)
  L_DL  = 1/2 (L_I->T + L_T->I)  "feature interaction distillation" (eq. 10)
  L_EL  = mean_i max(0, ext(x_S_i, y_S_i) - aper(x_S_i))          (eq. 11-13)
  L     = L_HCL + lambda_dist L_DL + lambda_ent L_EL              (eq. 14)

Every CE is over local rows against the all-gathered global batch of the
other side (student or teacher columns), as in MERU.

Teacher lifting. A Lorentz teacher's tangent features v_T (its projection
scaled by its own alpha, i.e. log_map0 of its own embedding at its own
curvature) are lifted with the student's curvature: exp_map0(v_T, c_S). The
distances in eq. 8-9 are then measured in one space, and the student's
curvature gets the gradient of both terms. A Euclidean (CLIP) teacher's
features carry no hyperbolic scale; they are L2-normalised (CLIP compares
directions only) and given the fixed tangent norm `clip_teacher_radius`
before exp_map0(., c_S). A fixed scale, rather than the student's alpha, keeps
the teacher's targets independent of any student parameter but the
curvature. Teacher features are wrapped in stop_gradient; the teacher
params live in `aux` (never in the optimised params), so they get neither a
gradient nor optimizer state.

Teacher of another embedding width (e.g. a converted OpenCLIP ViT-L/14,
768-d, for a 512-d student). The paper is silent; with
`teacher_width_map="orthogonal"` (the default) the teacher's tangent features
t (E_T) are mapped to the student's width E_S by a FIXED matrix M (E_T, E_S)
drawn once from `width_map_seed` (QR of a Gaussian), before the CLIP
normalisation or the Lorentz lift:
  E_T < E_S: M has orthonormal rows, t -> t M is an isometry (inner products,
    norms and so the teacher's own distances are kept exactly; the teacher
    lives on a totally geodesic E_T-dim slice of the student's hyperboloid);
  E_T > E_S: M has orthonormal columns scaled by sqrt(E_T / E_S): a random
    projection (Johnson-Lindenstrauss) that keeps norms in expectation and
    inner products up to O(1/sqrt(E_S)) relative distortion.
Equal widths use no map. A fixed map rather than a learned one (a linear
adapter trained with the student) keeps the teacher's targets independent
of the student's parameters, as the fixed `clip_teacher_radius` does: a map
trained jointly could rotate and shrink the targets toward wherever the
student already is, weakening the distillation term instead of the student
learning. The map lives in `aux` (checkpointed, never optimised);
`teacher_width_map=""` refuses mismatched widths instead.

Mask randomness. The per-example key is fold_in(fold_in(step_rng, salt),
batch["index"][i]) with the global example index, so the mask of an example
does not depend on how the batch is split across devices (1-device and
8-device runs draw identical masks) and changes every step.

Unmasked tuning. The objective never sees the step number, so it keeps its
own step counter in `aux["step"]` (checkpointed with the train state,
advanced by the loss, frozen on a skipped non-finite step like all of aux).
The student is masked while aux["step"] < total_steps - unmasked_tuning_steps
and sees full images afterwards (a lax.cond between the two encoders).
`objective.total_steps` is linked to the top-level `total_steps` in
configs/hmid.py by a FieldReference, so --config.total_steps=N moves both.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from hyperbolic_vl import errors
from hyperbolic_vl.geometry import lorentz
from hyperbolic_vl.models import vit
from hyperbolic_vl.objectives import base, entailment_weight, meru, registry
from hyperbolic_vl.objectives import clip as clip_lib
from hyperbolic_vl.objectives import settings as settings_lib

# Folded into the step rng before the example index, so the mask stream is
# independent of any other randomness derived from the same step rng.
_MASK_SALT = 0x4D41534B  # "MASK"


def width_map(teacher_dim: int, student_dim: int, seed: int) -> np.ndarray:
  """(teacher_dim, student_dim) fixed map: an isometry when the teacher is
  narrower, a norm-preserving (in expectation) random projection when wider."""
  rng = np.random.default_rng(seed)
  tall, short = max(teacher_dim, student_dim), min(teacher_dim, student_dim)
  q, r = np.linalg.qr(rng.standard_normal((tall, short)))
  q *= np.sign(np.diag(r))  # a Haar-distributed frame, not QR's sign convention
  if teacher_dim < student_dim:
    return q.T.astype(np.float32)  # orthonormal rows
  return (q * np.sqrt(teacher_dim / student_dim)).astype(np.float32)


def example_keep_indices(
  rng: jax.Array, index: jax.Array, num_patches: int, mask_ratio: float
) -> jax.Array:
  """(b,) global example indices -> (b, K) kept patch indices, one key per example."""
  base_key = jax.random.fold_in(rng, _MASK_SALT)

  def one(i):
    key = jax.random.fold_in(base_key, i.astype(jnp.uint32))
    return vit.random_keep_indices(key, 1, num_patches, mask_ratio)[0]

  return jax.vmap(one)(jnp.asarray(index))


@dataclasses.dataclass(frozen=True)
class HmidSettings(meru.MeruSettings):
  """HMID-Net: MERU on a masked student plus teacher distillation (eq. 14)."""

  name: ClassVar[str] = "hmid"
  teacher_workdir: str = ""
  mask_ratio: float = 0.5
  distill_weight: float = 1.0  # lambda_distillation, eq. 14
  # FLIP's unmasked tuning: the last this many steps see full images.
  unmasked_tuning_steps: int = 0
  total_steps: int = 0  # the run's total, for unmasked_tuning_steps
  # Tangent norm given to a Euclidean (CLIP) teacher's unit features before
  # they are lifted onto the student's hyperboloid (HMID-Net is silent).
  clip_teacher_radius: float = 1.0
  # Teacher of another embedding width: "orthogonal" maps it by a fixed
  # isometry (narrower teacher) or random projection (wider); "" refuses.
  teacher_width_map: str = "orthogonal"
  width_map_seed: int = 0
  # Benchmarks only: without teacher_workdir, a random teacher of this size.
  allow_random_teacher: bool = False
  teacher_model: dict = dataclasses.field(default_factory=dict)

  def __post_init__(self):
    super().__post_init__()
    settings_lib.check_choice(self, "teacher_width_map", ("orthogonal", ""))
    if not 0.0 <= self.mask_ratio < 1.0:
      raise ValueError(f"objective.mask_ratio={self.mask_ratio}; must be in [0, 1)")


@registry.register
class HmidObjective(meru.MeruObjective):
  """MERU's losses on a masked student plus distillation from a frozen teacher."""

  name = "hmid"
  geometry = "lorentz"
  Settings = HmidSettings

  def check_model_config(self, model_config):
    super().check_model_config(model_config)
    if dict(model_config).get("image_token_drop", 0.0):
      raise errors.ConfigError(
        "HMID-Net masks its student itself (objective.mask_ratio, "
        "objective.unmasked_tuning_steps); set model.image_token_drop=0"
      )

  def teacher_request(self) -> base.TeacherRequest:
    """The MERU/CLIP run to distil from (`teacher_workdir`), or a random
    teacher of `teacher_model`'s size when `allow_random_teacher` (benchmarks)."""
    if self.settings.teacher_workdir:
      return base.TeacherRequest(workdir=self.settings.teacher_workdir)
    if self.settings.allow_random_teacher:
      return base.TeacherRequest(random_model=dict(self.settings.teacher_model))
    raise ValueError(
      "HMID-Net needs objective.teacher_workdir (a workdir of a MERU/CLIP run of this "
      "codebase, e.g. python -m hyperbolic_vl.main --config=configs/meru.py "
      "--workdir=/tmp/teacher)"
    )

  def init_aux(self, model, params, rng, context=base.EMPTY_CONTEXT):
    del params, rng
    if context.teacher is None:
      raise ValueError("HMID-Net's init_aux needs the teacher in its RunContext (teacher_request)")
    teacher_def, teacher_params = context.teacher.model_def, context.teacher.params
    teacher = teacher_def.module
    if teacher.text_tower.vocab_size != model.text_tower.vocab_size:
      raise ValueError(
        f"teacher and student must share a tokenizer (vocab sizes {teacher.text_tower.vocab_size}"
        f" vs {model.text_tower.vocab_size}); a converted release uses clip_bpe: set "
        "--config.input.tokenizer.name=clip_bpe --config.input.tokenizer.vocab_size=49408"
      )
    aux = {"teacher_params": teacher_params}
    if teacher.embed_dim != model.embed_dim:
      if self.settings.teacher_width_map != "orthogonal":
        raise ValueError(
          f"teacher embed_dim {teacher.embed_dim} != student embed_dim {model.embed_dim} and "
          f"objective.teacher_width_map={self.settings.teacher_width_map!r}; valid: 'orthogonal' (a "
          "fixed isometry / random projection between the widths) or equal widths"
        )
      aux["teacher_width_map"] = jnp.asarray(
        width_map(teacher.embed_dim, model.embed_dim, self.settings.width_map_seed)
      )
    if self.settings.unmasked_tuning_steps > 0:
      aux["step"] = jnp.asarray(0, jnp.int32)
    return {**aux, **entailment_weight.init_aux(self.settings)}

  def teacher_embeddings(self, aux, batch, student, teacher_def) -> tuple[jax.Array, jax.Array]:
    """Teacher (image, text) embeddings on the student's hyperboloid, no gradient."""
    teacher_params = jax.lax.stop_gradient(aux["teacher_params"])
    teacher = teacher_def.merge(teacher_params)
    images = batch["image"]
    size = teacher.image_tower.image_size
    if images.shape[1] != size:
      if images.dtype == jnp.uint8:  # resize in [0, 1] floats, not in uint8
        images = images.astype(jnp.float32) * jnp.float32(1.0 / 255.0)
      images = jax.image.resize(images, (images.shape[0], size, size, images.shape[3]), "bilinear")
    image_t = teacher.image_tangent(images)
    text_t = teacher.text_tangent(batch["tokens"])
    if "teacher_width_map" in aux:
      image_t = image_t @ aux["teacher_width_map"]
      text_t = text_t @ aux["teacher_width_map"]
    if teacher.geometry == "euclidean":
      radius = self.settings.clip_teacher_radius
      image_t = radius * clip_lib.l2_normalize(image_t)
      text_t = radius * clip_lib.l2_normalize(text_t)
    image_t = jax.lax.stop_gradient(image_t)
    text_t = jax.lax.stop_gradient(text_t)
    curv = student.curv()
    return lorentz.exp_map0(image_t, curv), lorentz.exp_map0(text_t, curv)

  # -- loss -----------------------------------------------------------------------
  def student_image(self, model, aux, batch, rng):
    images = batch["image"]
    if self.settings.mask_ratio <= 0.0:
      return model.encode_image(images)
    if "index" not in batch:
      raise KeyError("HMID-Net masking needs batch['index'] (global example indices)")
    keep = example_keep_indices(
      rng, batch["index"], model.image_tower.num_patches, self.settings.mask_ratio
    )
    if self.settings.unmasked_tuning_steps <= 0:
      return model.encode_image(images, keep_indices=keep)
    masked_steps = self.settings.total_steps - self.settings.unmasked_tuning_steps
    return jax.lax.cond(
      aux["step"] < masked_steps,
      lambda: model.encode_image(images, keep_indices=keep),
      lambda: model.encode_image(images),
    )

  def loss(self, model, aux, batch, *, rng, axis_name, context=base.EMPTY_CONTEXT):
    if context.teacher is None:
      raise ValueError("HMID-Net's loss needs the teacher in its RunContext (teacher_request)")
    image = self.student_image(model, aux, batch, rng)
    text = model.encode_text(batch["tokens"])
    contrastive, entail, metrics = self.contrastive_and_entailment(model, image, text, axis_name)
    teacher_image, teacher_text = self.teacher_embeddings(
      aux, batch, model, context.teacher.model_def
    )
    curv, scale = model.curv(), model.logit_scale()
    all_teacher_text = base.gather_columns(teacher_text, axis_name)
    all_teacher_image = base.gather_columns(teacher_image, axis_name)
    distill = base.symmetric_contrastive(
      -scale * lorentz.pairwise_dist(image, all_teacher_text, curv),
      -scale * lorentz.pairwise_dist(text, all_teacher_image, curv),
      axis_name,
    )
    weighted, weight_metrics, aux = entailment_weight.weighted_entailment(
      self.settings, model, aux, entail
    )
    total = contrastive + self.settings.distill_weight * distill + weighted
    new_aux = dict(aux)
    if "step" in aux:
      new_aux["step"] = aux["step"] + 1
    metrics = {
      **metrics,
      "loss/distillation": distill,
      **weight_metrics,
      **self.scalar_metrics(model),
    }
    if "step" in aux:
      metrics["masked"] = (
        aux["step"] < self.settings.total_steps - self.settings.unmasked_tuning_steps
      ).astype(jnp.float32)
    return total, (metrics, new_aux)
