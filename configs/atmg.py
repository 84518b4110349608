"""ATMG, "Accept the Modality Gap" (CVPR'24): angle-based contrastive loss +
Einstein-midpoint centroid regulariser, inference by exterior angle.

Variants: tiny (default; CPU, synthetic world), vit_s, vit_b, vit_l (paper
App. B: as MERU, batch 2048, 120k steps, AdamW lr 5e-4, 4k warmup + cosine,
wd 0.2 except biases/gains/learned scalars, 224 px, embed 512).

Loss (hyperbolic_vl/objectives/atmg.py):
  L = CE_T->I(-s alpha) + CE_T->I(s beta) + centroid_weight * L_centroid
  alpha = exterior angle at the text towards the image (eq. 9),
  beta  = exterior angle at the IMAGE towards the text. The paper's literal
          beta = pi - alpha would only repeat the first term (softmax is
          shift invariant); the angle at the image is the other angle of the
          origin-text-image triangle that Fig. 3 draws.
  L_centroid = |d(O, midpoint(texts)) - centroid_text_radius|
             + |d(O, midpoint(images)) - centroid_image_radius|
          (eq. 12 read as "distance of each Einstein-midpoint centroid from
          the origin vs its target"; targets are distances, image > text).
The paper gives no values for lambda, p, q: the defaults below (0.1, 1.0,
0.5) are ours; tune them per dataset.

Curvature: learned by default (MERU's clamp [c0/10, 10 c0]); for the paper's
Table 5 sweep fix it:
  python -m hyperbolic_vl.main --config=configs/atmg.py --workdir=/tmp/atmg_c2 \
      --config.model.learn_curv=False --config.model.curv_init=2.0

  python -m hyperbolic_vl.main --config=configs/atmg.py --workdir=/tmp/atmg_tiny
  python -m hyperbolic_vl.main --config=configs/atmg.py:vit_s --workdir=... \
      --config.input.data.path=/data/captions.csv \
      --config.input.data.image_root=/data/images \
      --config.input.tokenizer.model_path=/data/spm.model
"""

from configs import common


def get_config(arg: str | None = None):
  arg = common.parse_arg(arg, variant="tiny")
  common.check_variant(arg.variant)
  config = common.two_tower_config(variant=arg.variant, objective="atmg", geometry="lorentz")
  config.objective.centroid_weight = 0.1  # lambda, eq. 13
  config.objective.centroid_text_radius = 0.5  # q as a distance from the origin
  config.objective.centroid_image_radius = 1.0  # p > q: image centroid farther out
  config.lock()
  return config
