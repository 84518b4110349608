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

import logging
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from hyperbolic_vl import checkpointing
from hyperbolic_vl.data import tokenizer as tokenizer_lib
from hyperbolic_vl.geometry import lorentz
from hyperbolic_vl.models import two_towers, vit
from hyperbolic_vl.objectives import base, meru
from hyperbolic_vl.objectives import clip as clip_lib
from hyperbolic_vl.objectives import settings as settings_lib

# Folded into the step rng before the example index, so the mask stream is
# independent of any other randomness derived from the same step rng.
_MASK_SALT = 0x4D41534B  # "MASK"
# The teacher run's config.json, copied into the student's workdir.
TEACHER_CONFIG = "teacher_config.json"


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


class HmidObjective(meru.MeruObjective):
  """MERU's losses on a masked student plus distillation from a frozen teacher."""

  name = "hmid"
  geometry = "lorentz"
  Settings = settings_lib.HmidSettings

  def __init__(self, config=None):
    super().__init__(config)
    self._teacher_def = None
    self._teacher_geometry = None

  # -- teacher --------------------------------------------------------------------
  def set_teacher(self, teacher_def) -> None:
    """Registers the teacher's ModelDef (static graph); its params go in aux."""
    self._teacher_def = teacher_def
    self._teacher_geometry = teacher_def.module.geometry

  def _random_teacher(self, model, rng):
    """A randomly initialised teacher of `teacher_model`'s size (benchmarks only)."""
    cfg = dict(self.settings.teacher_model)
    module = model
    image_tower = module.image_tower
    cfg.setdefault("image_variant", image_tower.variant)
    cfg.setdefault("text_variant", "mu")
    cfg["embed_dim"] = module.embed_dim
    text = module.text_tower
    teacher = two_towers.build_two_towers(
      cfg,
      vocab_size=text.vocab_size,
      context_length=text.context_length,
      image_size=image_tower.image_size,
      rngs=nnx.Rngs(params=int(jax.random.randint(rng, (), 0, 2**30))),
    )
    return checkpointing.ModelDef.from_module(teacher)

  def bind_run(self, workdir: str | None, resuming: bool) -> None:
    """The run's own workdir: the teacher's config is kept there, so a resumed
    run rebuilds the teacher from it and takes its params from the run's own
    checkpoint (aux), never reading `teacher_workdir` again."""
    self._run_workdir, self._resuming = workdir, resuming

  def init_aux(self, model, params, rng):
    workdir = self.settings.teacher_workdir
    run_workdir = getattr(self, "_run_workdir", None)
    kept_config = os.path.join(run_workdir, TEACHER_CONFIG) if run_workdir else None
    if getattr(self, "_resuming", False) and kept_config and os.path.exists(kept_config):
      # Placeholder params of the right shapes: the checkpoint's aux replaces them.
      run_config = checkpointing.load_config_file(kept_config)
      tokenizer = tokenizer_lib.get_tokenizer(run_config.input.tokenizer)
      teacher_def, teacher_params = build_teacher(run_config, tokenizer, run_config.seed)
    elif workdir:
      _, teacher_def, teacher_params, _ = checkpointing.restore_run_params(workdir, build_teacher)
      if kept_config and jax.process_index() == 0:
        os.makedirs(run_workdir, exist_ok=True)
        shutil.copyfile(os.path.join(workdir, "config.json"), kept_config)
    elif self.settings.allow_random_teacher:
      logging.warning(
        "HMID-Net: no objective.teacher_workdir; using a RANDOMLY INITIALISED "
        "teacher (benchmarking only, the distillation target is meaningless)"
      )
      print(
        "HMID-Net: RANDOM teacher (no objective.teacher_workdir); benchmark use only", flush=True
      )
      teacher_def, teacher_params = self._random_teacher(model, rng)
    else:
      raise ValueError(
        "HMID-Net needs objective.teacher_workdir (a workdir of a MERU/CLIP run of this "
        "codebase, e.g. python -m hyperbolic_vl.main --config=configs/meru.py "
        "--workdir=/tmp/teacher)"
      )
    teacher = teacher_def.module
    if teacher.text_tower.vocab_size != model.text_tower.vocab_size:
      raise ValueError(
        f"teacher and student must share a tokenizer (vocab sizes {teacher.text_tower.vocab_size}"
        f" vs {model.text_tower.vocab_size}); a converted release uses clip_bpe: set "
        "--config.input.tokenizer.name=clip_bpe --config.input.tokenizer.vocab_size=49408"
      )
    self.set_teacher(teacher_def)
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
    return aux

  def teacher_embeddings(self, aux, batch, student) -> tuple[jax.Array, jax.Array]:
    """Teacher (image, text) embeddings on the student's hyperboloid, no gradient."""
    if self._teacher_def is None:
      raise RuntimeError("HmidObjective.init_aux (or set_teacher) must run before loss")
    teacher_params = jax.lax.stop_gradient(aux["teacher_params"])
    teacher = self._teacher_def.merge(teacher_params)
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
    if self._teacher_geometry == "euclidean":
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

  def loss(self, model, aux, batch, *, rng, axis_name):
    image = self.student_image(model, aux, batch, rng)
    text = model.encode_text(batch["tokens"])
    contrastive, entail, metrics = self.contrastive_and_entailment(model, image, text, axis_name)
    teacher_image, teacher_text = self.teacher_embeddings(aux, batch, model)
    curv, scale = model.curv(), model.logit_scale()
    all_teacher_text = base.gather_columns(teacher_text, axis_name)
    all_teacher_image = base.gather_columns(teacher_image, axis_name)
    distill = base.symmetric_contrastive(
      -scale * lorentz.pairwise_dist(image, all_teacher_text, curv),
      -scale * lorentz.pairwise_dist(text, all_teacher_image, curv),
      axis_name,
    )
    total = (
      contrastive + self.settings.distill_weight * distill + self.settings.entail_weight * entail
    )
    new_aux = dict(aux)
    if "step" in aux:
      new_aux["step"] = aux["step"] + 1
    metrics = {**metrics, "loss/distillation": distill, **self.scalar_metrics(model)}
    if "step" in aux:
      metrics["masked"] = (
        aux["step"] < self.settings.total_steps - self.settings.unmasked_tuning_steps
      ).astype(jnp.float32)
    return total, (metrics, new_aux)


def build_teacher(run_config, tokenizer, seed: int):
  """The teacher run's two-tower model (MERU or CLIP) from its config.json."""
  module = two_towers.build_two_towers(
    dict(run_config.model),
    vocab_size=tokenizer.vocab_size,
    context_length=tokenizer.context_length,
    image_size=int(run_config.input.image_size),
    rngs=nnx.Rngs(params=seed),
  )
  return checkpointing.ModelDef.from_module(module)
