"""HCL (Ge et al.): MoCo-v2 object branch + hyperbolic scene-object branch.

Image tower only (ViT + MoCo-v2 MLP head). Appendix defaults: r 4.5, lambda
0.1, eps 1e-5, tau 0.2 (MoCo-v2), momentum 0.999, queue 65536 (MoCo),
boxes <= 56 x 56 px dropped. The paper trains ResNet-50 with SGD lr 0.3; here
the codebase's AdamW loop is used. hyp_weight=0 gives the MoCo-only baseline.

Variants: tiny (default; synthetic world, exact boxes), vit_s, vit_b, vit_l
(COCO-style boxes: input.data.path=instances.json, input.data.image_root).

  python -m hyperbolic_vl.main --config=configs/hcl.py --workdir=runs/hcl
  python -m hyperbolic_vl.main --config=configs/hcl.py --workdir=runs/moco \
      --config.objective.hyp_weight=0
  python -m hyperbolic_vl.main --config=configs/hcl.py:vit_s --workdir=... \
      --config.input.data.path=/data/instances_train2017.json \
      --config.input.data.image_root=/data/train2017
"""

import ml_collections

from configs import common
from hyperbolic_vl.data import registry as data_registry
from hyperbolic_vl.evaluators import registry as evaluators


def get_config(arg: str | None = None):
  arg = common.parse_arg(arg, variant="tiny", data="")
  common.check_variant(arg.variant)
  config = common.two_tower_config(variant=arg.variant, objective="hcl", geometry="euclidean")
  config.model.name = "hcl"  # ViT + MoCo-v2 head, no text tower
  config.model.head_dim = 2048
  config.model.embed_dim = 128  # MoCo-v2 output dimension
  # Settings and defaults (released code): HclSettings in hyperbolic_vl/objectives/hcl.py.
  # Fixed scale before the exp map: 1/sqrt(embed_dim) keeps initial tangent
  # norms ~1 < r.
  config.objective.hyp_input_scale = 128**-0.5
  config.optim.weight_decay = 1e-4
  # Scene / object crops: whole scenes and their object boxes; min_box_area is
  # normalised (smaller boxes are never the object); MoCo-v2 photometric
  # augmentation, as released.
  default_data = "world_scene_objects" if arg.variant == "tiny" else "coco_scene_objects"
  config.input.data = data_registry.section(
    arg.data or default_data, min_box_area=0.0, augment="moco_v2"
  )
  if arg.variant == "tiny":
    config.model.update(dict(embed_dim=64, head_dim=128))
    config.objective.hyp_input_scale = 64**-0.5
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
    config.input.batch_size = 256
    config.input.image_size = 224
  config.lock()
  return config
