"""EuCLIP (Chou & Alam 2024, arXiv 2409.13079): CLIP on MERU's towers with
the L2 normalisation removed and a negative squared Euclidean distance as
the logit; the Euclidean control beside MERU and the other hyperbolic
objectives (hyperbolic_vl/objectives/euclip.py, docs/methods/euclip.md).

Variants: tiny (default; CPU, synthetic world), vit_s, vit_b, vit_l: the
towers, data and optimisation of configs/clip.py's variants, so a run of
each differs from CLIP's and MERU's only in the geometry of the loss.

  python -m hyperbolic_vl.main --config=configs/euclip.py --workdir=/tmp/euclip_tiny
  python -m hyperbolic_vl.main --config=configs/euclip.py:tiny \
      --config.objective.logit=distance --workdir=/tmp/euclip_distance
  python -m hyperbolic_vl.main --config=configs/euclip.py:vit_b --workdir=... \
      --config.input.data.path=/data/captions.csv --config.input.data.image_root=/data/images
"""

from configs import common


def get_config(arg: str | None = None):
  arg = common.parse_arg(arg, variant="tiny", data="")
  common.check_variant(arg.variant)
  config = common.two_tower_config(
    variant=arg.variant, objective="euclip", geometry="euclidean", data=arg.data
  )
  config.lock()
  return config
