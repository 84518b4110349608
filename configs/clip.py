"""CLIP baseline as trained by MERU (same towers, cosine logits, no entailment).

Variants: tiny (default; CPU, synthetic world), vit_s, vit_b, vit_l, and the
OpenAI CLIP architectures openai_vit_b32, openai_vit_b16, openai_vit_l14 (to
convert OpenAI / open_clip weights: `python -m hyperbolic_vl.convert`).

  python -m hyperbolic_vl.main --config=configs/clip.py --workdir=/tmp/clip_tiny
  python -m hyperbolic_vl.main --config=configs/clip.py:tiny,loss=sigmoid --workdir=/tmp/siglip
  python -m hyperbolic_vl.main --config=configs/clip.py:vit_b --workdir=... \
      --config.input.data.path=/data/captions.csv --config.input.data.image_root=/data/images
"""

from configs import common


def get_config(arg: str | None = None):
  arg = common.parse_arg(arg, variant="tiny", data="", loss="softmax")
  common.check_variant(arg.variant, extra=tuple(common.OPENAI_VARIANTS))
  config = common.two_tower_config(
    variant=arg.variant, objective="clip", geometry="euclidean", data=arg.data
  )
  common.set_pairwise_loss(config, arg.loss)
  config.lock()
  return config
