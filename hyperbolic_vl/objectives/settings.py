"""Every objective's hyperparameters, with their defaults, in one place.

Each objective reads its `config.objective` section once, into the frozen
dataclass named here, and never re-defaults a value afterwards. Configs build
the section from the same dataclass (`section`), so a key exists in a config
exactly when the objective understands it: an unknown key (a typo on the
command line) fails at once with the valid names, and a bad choice (an
unknown `pullback` kind, say) fails before the model is built.

Kept free of JAX so that configs can import it cheaply.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, ClassVar

import ml_collections


def _plain(value: Any) -> Any:
  if isinstance(value, ml_collections.ConfigDict):
    return value.to_dict()
  if isinstance(value, ml_collections.FieldReference):
    return value.get()
  return value


def _check_choice(settings, key: str, valid: tuple[str, ...]) -> None:
  value = getattr(settings, key)
  if value not in valid:
    raise ValueError(f"objective.{key}={value!r}; valid: {', '.join(map(repr, valid))}")


@dataclasses.dataclass(frozen=True)
class ObjectiveSettings:
  """Settings shared by every objective."""

  name: ClassVar[str] = ""

  @classmethod
  def from_config(cls, config: Mapping[str, Any] | None) -> ObjectiveSettings:
    values = {key: _plain(value) for key, value in dict(config or {}).items()}
    values.pop("name", None)
    fields = {field.name: field for field in dataclasses.fields(cls)}
    unknown = sorted(set(values) - set(fields))
    if unknown:
      raise ValueError(
        f"unknown objective setting(s) {unknown} for objective {cls.name!r}; "
        f"valid: {sorted(fields)}"
      )
    defaults = cls()
    coerced = {}
    for key, value in values.items():
      default = getattr(defaults, key)
      # Command-line overrides may arrive as ints where floats are meant;
      # None keeps the default, as an unset optional value.
      if value is None:
        continue
      if isinstance(default, bool):
        coerced[key] = bool(value)
      elif isinstance(default, (int, float, str)):
        coerced[key] = type(default)(value)
      else:
        coerced[key] = value
    return cls(**coerced)


@dataclasses.dataclass(frozen=True)
class ClipSettings(ObjectiveSettings):
  """CLIP: symmetric InfoNCE on cosine logits."""

  name: ClassVar[str] = "clip"
  # Column block size of the streamed contrastive loss; 0 materialises the
  # full (b, B) logits, -1 picks a block from the global batch.
  logit_chunk_size: int = 0


@dataclasses.dataclass(frozen=True)
class MeruSettings(ObjectiveSettings):
  """MERU: contrastive on -d_L plus lambda x entailment (MERU Sec. 3)."""

  name: ClassVar[str] = "meru"
  entail_weight: float = 0.2  # lambda, MERU Sec. 3.2
  logit_chunk_size: int = 0  # as ClipSettings.logit_chunk_size


@dataclasses.dataclass(frozen=True)
class HmidSettings(MeruSettings):
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
    _check_choice(self, "teacher_width_map", ("orthogonal", ""))
    if not 0.0 <= self.mask_ratio < 1.0:
      raise ValueError(f"objective.mask_ratio={self.mask_ratio}; must be in [0, 1)")


@dataclasses.dataclass(frozen=True)
class AtmgSettings(ObjectiveSettings):
  """ATMG: angle-based contrastive loss plus the centroid regulariser."""

  name: ClassVar[str] = "atmg"
  # "released": 0.5 (CE_text + CE_image), image rows over the texts;
  # "paper": eq. 11 on the text rows only.
  angle_loss: str = "released"
  # "released": zero-shot and text->image by the angle at the image;
  # "paper": smallest mean angle at the text throughout.
  inference: str = "released"
  centroid_weight: float = 0.0  # lambda, eq. 13 (the released code never applies it)
  # q < p as distances from the origin, calibrated on the world: the text /
  # image midpoint distances a run with the released defaults reaches
  # without the regulariser (1.16 / 1.74 after 1000 tiny steps). Calibrate
  # on other data from such a run's logged centroid_dist_origin/*.
  centroid_text_radius: float = 1.1
  centroid_image_radius: float = 1.7

  def __post_init__(self):
    _check_choice(self, "angle_loss", ("released", "paper"))
    _check_choice(self, "inference", ("released", "paper"))


RADIAL_ROOTS = ("auto", "empty", "empty_init", "mean", "zero", "learned", "origin")


@dataclasses.dataclass(frozen=True)
class RadialSettings(ObjectiveSettings):
  """Radial Embeddings: RE loss + pull-back to the initial embeddings."""

  name: ClassVar[str] = "radial"
  root: str = "auto"  # euclidean: "empty" (paper); lorentz: "origin"
  re_weight: float = 1.0  # lambda_RE
  reg_weight: float = 10.0  # lambda_reg
  # "released": (1 - mean cos(e, e0)) / 2 over the texts (authors' code);
  # "squared": mean |e - e0|^2 plus a root term (our earlier reading, 4x).
  pullback: str = "released"
  hard_mining: bool = True  # + hardest positive / negative terms

  def __post_init__(self):
    _check_choice(self, "root", RADIAL_ROOTS)
    _check_choice(self, "pullback", ("released", "squared"))


@dataclasses.dataclass(frozen=True)
class HclSettings(ObjectiveSettings):
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
  # Fixed scale s before the exp map (not in the paper, see geometry.poincare):
  # ~1/sqrt(embed_dim) keeps initial tangent norms ~1 < r.
  hyp_input_scale: float = 1.0
  # Negatives of a scene region u: "queue" (released) a queue_size queue of
  # earlier object keys on the ball; "batch" the global batch's other objects.
  hyp_negatives: str = "queue"
  # "symmetric" (released): both views are queries against the other's key,
  # each direction with its own queue; "paper": q(view1) against k(view2).
  object_loss: str = "symmetric"

  def __post_init__(self):
    _check_choice(self, "ball_clip", ("point", "tangent"))
    _check_choice(self, "hyp_negatives", ("queue", "batch"))
    _check_choice(self, "object_loss", ("symmetric", "paper"))


BY_NAME: dict[str, type[ObjectiveSettings]] = {
  cls.name: cls
  for cls in (ClipSettings, MeruSettings, HmidSettings, AtmgSettings, RadialSettings, HclSettings)
}


def section(name: str, **overrides) -> ml_collections.ConfigDict:
  """A complete `config.objective` section: `name` plus every setting with its
  default (so each can be overridden from the command line), updated by
  `overrides` (checked like a config)."""
  if name not in BY_NAME:
    raise ValueError(f"no settings for objective {name!r}; known: {sorted(BY_NAME)}")
  cls = BY_NAME[name]
  cls.from_config(overrides)  # fails on unknown keys and bad choices
  values = dataclasses.asdict(cls())
  values.update(overrides)
  return ml_collections.ConfigDict({"name": name, **values})
