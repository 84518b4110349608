"""HCL (Ge et al.): MoCo-v2 object branch + hyperbolic scene-object branch.

Image tower only (backbone + MoCo-v2 MLP head). Appendix defaults: r 4.5,
lambda 0.1, eps 1e-5, tau 0.2 (MoCo-v2), momentum 0.999, queue 65536 (MoCo),
boxes under 56 x 56 px dropped. As released: the head's output goes into
the exp map unscaled (objective.hyp_input_scale 1), and the scene/object
sampling of the released loader (input.data.sampling="released").
hyp_weight=0 gives the MoCo-only baseline.

Paper variants (COCO-style boxes: input.data.path=instances.json,
input.data.image_root): rn50 trains the released backbone, torchvision's
ResNet-50 (model.image_variant="RN50"; its batch norms are synchronised
over the global batch where MoCo shuffles them); vit_s, vit_b and vit_l
put a ViT in its place. All use the released recipe: batch 128, SGD lr 0.15, momentum 0.9, weight decay 1e-4 on every
parameter, 200 epochs with MoCo's per-epoch cosine (lr constant within an
epoch). total_steps=0 and epochs=200: the run length and the epoch length
are counted from the data at start-up (hyperbolic_vl/data/run_length.py).
The tiny world variant (the default) trains a tiny ViT for 600 AdamW steps.

  python -m hyperbolic_vl.main --config=configs/hcl.py --workdir=runs/hcl
  python -m hyperbolic_vl.main --config=configs/hcl.py --workdir=runs/moco \
      --config.objective.hyp_weight=0
  python -m hyperbolic_vl.main --config=configs/hcl.py:rn50 --workdir=... \
      --config.input.data.path=/data/instances_train2017.json \
      --config.input.data.image_root=/data/train2017
"""

import ml_collections

from configs import common
from hyperbolic_vl.data import registry as data_registry
from hyperbolic_vl.evaluators import registry as evaluators


def get_config(arg: str | None = None):
  arg = common.parse_arg(arg, variant="tiny", data="")
  common.check_variant(arg.variant, extra=("rn50",))
  # rn50: the paper's and the released code's backbone, torchvision's
  # ResNet-50 (batch norms synchronised over the global batch where MoCo
  # shuffles them); vit_s / vit_b / vit_l: the same recipe on a ViT.
  base_variant = "vit_b" if arg.variant == "rn50" else arg.variant
  config = common.two_tower_config(variant=base_variant, objective="hcl", geometry="euclidean")
  if arg.variant == "rn50":
    config.model.image_variant = "RN50"
  config.model.name = "hcl"  # backbone + MoCo-v2 head, no text tower
  config.model.head_dim = 2048
  config.model.embed_dim = 128  # MoCo-v2 output dimension
  # Settings and defaults (released code): HclSettings in hyperbolic_vl/objectives/hcl.py.
  # Scene / object crops as the released loader draws them (boxes of at
  # least 56 x 56 px); MoCo-v2 photometric augmentation, as released.
  default_data = "world_scene_objects" if arg.variant == "tiny" else "coco_scene_objects"
  config.input.data = data_registry.section(
    arg.data or default_data, sampling="released", augment="moco_v2"
  )
  # "adamw" (the codebase's loop) or "sgd" (the released MoCo-v2 recipe).
  config.optim.name = "adamw"
  config.optim.momentum = 0.9  # SGD's
  # The per-epoch cosine's epoch length; 0: counted from the data at start-up.
  config.optim.steps_per_epoch = 0
  # Passes over the training scenes when total_steps is 0; each pass is
  # scenes // batch steps (the released loader drops the last partial batch).
  config.epochs = 0
  config.epoch_last_batch = "drop"
  config.optim.weight_decay = 1e-4
  if arg.variant == "tiny":
    config.model.update(dict(embed_dim=64, head_dim=128))
    config.input.batch_size = 64
    config.input.image_size = 32
    config.total_steps = 600
    config.optim.lr = 1e-3
    config.optim.warmup_steps = 50
    config.log_training_steps = 50
    config.ckpt_steps = 300
    config.objective.queue_size = 1024
    config.objective.momentum = 0.99  # short runs: a faster key encoder
    # Colour is a label on the world: no colour jitter / greyscale there.
    config.input.data.augment = "none"
    config.evals = ml_collections.ConfigDict({"hcl": evaluators.entry("hcl", num_examples=400)})
  else:
    # The world evaluator does not apply to COCO; list real benchmarks here.
    config.evals = ml_collections.ConfigDict()
    # The released pre-training command (its README): batch 128, SGD lr 0.15
    # (the paper's 0.3 x batch / 256), momentum 0.9, wd 1e-4 on every
    # parameter, `--cos`, 200 epochs (the paper's, on COCO).
    config.input.batch_size = 128
    config.input.image_size = 224
    config.optim.name = "sgd"
    config.optim.lr = 0.15
    config.optim.schedule = "cosine_per_epoch"
    config.optim.warmup_steps = 0
    config.optim.decay_gains_biases = True
    config.epochs = 200
    config.total_steps = 0  # epochs * (scenes // 128), counted at start-up
    config.ckpt_steps = 5000
  config.lock()
  return config
