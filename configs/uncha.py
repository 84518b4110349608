"""UNCHA (CVPR 2026): HyCoCLIP with several boxes per image, uncertainty-
weighted box-to-whole contrast, calibrated part-whole entailment and three
learned logit scales (hyperbolic_vl/objectives/uncha.py).

Variants: tiny (default; CPU, the synthetic world's grounded source
`world_boxes` with up to 4 boxes per scene, the world's most, the model and
optimiser of configs/hycoclip.py's tiny variant, batch 64 and 500 steps),
vit_s, vit_b, vit_l (the released
training configs, configs/train_uncha_vit_{s,b,l}.py: batch 768 (4 GPUs x
192), 500k steps, AdamW lr 5e-4, betas (0.9, 0.98), wd 0.2 with gains and
biases decayed too (the release's `gain_bias_decay or weight_decay`), 4k
warmup + cosine, 224 px random resized crops of 80-100% and grayscale with
p 0.2 for images and each box alike, up to 5 boxes per image (the first 5
stored), embed dim 512, text tower 12 x 512 with 77 BPE tokens, c init 1
learned, lambda 0.2, aperture factors 0.7 / 1.2, angle floor 0.1,
calibration weight 10, logit scales 1/0.07, 1/0.05 (local), 1/0.06
(global-local); ViT-S is MoCo-v3's, 12 heads).

The box means and the uncertainty entropy are taken over the global batch
(`objective.box_reduction="global"`: 1 device == N). The release takes them
per GPU; `--config.objective.box_reduction=per_device
--config.objective.rows_per_device=192` gives its loss on any device count
(docs/methods/uncha.md).

  python -m hyperbolic_vl.main --config=configs/uncha.py --workdir=/tmp/uncha_tiny
  python -m hyperbolic_vl.main --config=configs/uncha.py:vit_b --workdir=...
  python -m hyperbolic_vl.main --config=configs/uncha.py:vit_s,data=grit --workdir=... \
      --config.input.data.path='/data/grit/processed/{00000..01023}.tar' \
      --config.input.data.num_train=0
"""

import ml_collections

from configs import common, hycoclip
from hyperbolic_vl.evaluators import registry as evaluators
from hyperbolic_vl.objectives import uncha


def get_config(arg: str | None = None):
  arg = common.parse_arg(arg, variant="tiny", data="")
  common.check_variant(arg.variant)
  config = common.two_tower_config(
    variant=arg.variant, objective="uncha", geometry="lorentz", data=arg.data or "world_boxes"
  )
  config.model.extra_logit_scales = dict(uncha.EXTRA_LOGIT_SCALES)
  if arg.variant == "tiny":
    # Every object of a world scene (one to four) is a box. Half the tiny
    # batch and steps of configs/hycoclip.py: each row carries five images
    # (the whole one and four box slots), so a step costs ~2.5x HyCoCLIP's.
    config.input.data.max_boxes = 4
    config.input.batch_size = 64
    config.total_steps = 500
    config.optim.warmup_steps = 50
    config.log_training_steps = 50
    config.evals = ml_collections.ConfigDict(
      {"world": evaluators.entry("world"), "world_boxes": evaluators.entry("world_boxes")}
    )
  else:
    # The released configs (train_uncha_vit_{s,b,l}.py).
    config.input.data.max_boxes = 5
    config.input.data.crop_scale = (0.8, 1.0)
    config.input.data.grayscale_prob = 0.2
    hycoclip.apply_released_schedule(config)
    # Batch 768 on the paper's 4 A100 80GB: 70.2 GiB per GPU in one pass,
    # more than the 75% of a GPU JAX takes by default; the towers in two
    # micro-batches need 34.9 GiB (python -m hyperbolic_vl.tools.aot
    # --config=configs/uncha.py:vit_b --topology=a100:4). The loss and its
    # gradient stay the whole batch's.
    config.optim.accumulation_steps = 2
  config.lock()
  return config
