"""PHyCLIP (Yoshikawa and Matsubara, ICLR 2026): HyCoCLIP's terms in a product of
small Lorentz spaces (hyperbolic_vl/objectives/phyclip.py).

Variants: tiny (default; CPU, the synthetic world's grounded source
`world_boxes`, configs/hycoclip.py's tiny run with its embedding of 64 split
into 8 factors of 8), vit_s, vit_b, vit_l (the released
train_phyclip_vit_{s,b,l}.py: embed dim 512 in 64 factors of 8
(`subspace_dim=8`), each with its own curvature (init 1, learned, clamped
to [0.1, 10]) and alphas (init 8^-0.5), l1 product metric, eps 1e-6 in
every clamp, lambda 0.2, apertures 0.7 / 1.2, batch 768, 500k steps, AdamW
lr 5e-4, betas (0.9, 0.98), wd 0.2, 4k warmup + cosine, 224 px random
resized crops of 50-100% for images and box crops; the towers are
HyCoCLIP's).

Weight decay as released: LayerNorm gains and biases decay at 0.2 (the
released `gain_bias_decay or weight_decay`), and so do the 64 curvatures and
128 alphas (the release's exclusion names never match the entries of its
ParameterLists); only the logit scale is spared. The paper's reading is
--config.optim.decay_gains_biases=False --config.optim.decay_factor_scalars=False.
The tiny variant keeps configs/hycoclip.py's tiny optimizer (no decay on
gains, biases or scalars), so the two compare on geometry alone.

  python -m hyperbolic_vl.main --config=configs/phyclip.py --workdir=/tmp/phyclip_tiny
  python -m hyperbolic_vl.main --config=configs/phyclip.py:vit_b --workdir=...
  python -m hyperbolic_vl.main --config=configs/phyclip.py:vit_s,data=grit --workdir=... \
      --config.input.data.path='/data/grit/processed/{00000..01023}.tar' \
      --config.input.data.num_train=0
"""

import ml_collections

from configs import common, hycoclip
from hyperbolic_vl.evaluators import registry as evaluators

RELEASED_FACTOR_DIM = 8  # subspace_dim of the released configs
TINY_FACTOR_DIM = 8  # the tiny embedding of 64 in 8 factors


def get_config(arg: str | None = None):
  arg = common.parse_arg(arg, variant="tiny", data="")
  common.check_variant(arg.variant)
  config = common.two_tower_config(
    variant=arg.variant, objective="phyclip", geometry="lorentz", data=arg.data or "world_boxes"
  )
  if arg.variant == "tiny":
    config.model.factor_dim = TINY_FACTOR_DIM
    config.evals = ml_collections.ConfigDict(
      {"world": evaluators.entry("world"), "world_boxes": evaluators.entry("world_boxes")}
    )
  else:
    config.model.factor_dim = RELEASED_FACTOR_DIM
    hycoclip.apply_released_schedule(config)
    config.optim.decay_factor_scalars = True  # the release's per-factor scalars
  config.lock()
  return config
