"""MERU (Desai et al., ICML 2023): hyperbolic CLIP with an entailment loss.

Variants: tiny (default; CPU, synthetic world), vit_s, vit_b, vit_l (paper
App. D.1: batch 2048, 120k steps, AdamW lr 5e-4, 4k warmup + cosine, wd 0.2,
tau 0.07 clamped at 0.01, lambda 0.2, 224 px, embed dim 512, c init 1 in
[0.1, 10], alphas init 1/sqrt(512)). The paper variants decay LayerNorm
gains and biases at 0.2 as the released code does (`gain_bias_decay or
weight_decay` turns its configured 0 into 0.2); the paper exempts them:
`--config.optim.decay_gains_biases=False`. The tiny variant (a CPU recipe of
this codebase, not the release's) keeps the paper's reading, as
configs/clip.py's tiny run beside it.

  python -m hyperbolic_vl.main --config=configs/meru.py --workdir=/tmp/meru_tiny
  python -m hyperbolic_vl.main --config=configs/meru.py:tiny,loss=sigmoid --workdir=/tmp/meru_sig
  python -m hyperbolic_vl.main --config=configs/meru.py:vit_l --workdir=gs://... \
      --config.input.data.path=/data/captions.csv \
      --config.input.data.image_root=/data/images
"""

from configs import common


def get_config(arg: str | None = None):
  arg = common.parse_arg(arg, variant="tiny", data="", loss="softmax")
  common.check_variant(arg.variant)
  config = common.two_tower_config(
    variant=arg.variant, objective="meru", geometry="lorentz", data=arg.data
  )
  if arg.variant != "tiny":
    config.optim.decay_gains_biases = True  # the released optimizer
  common.set_pairwise_loss(config, arg.loss)
  config.lock()
  return config
