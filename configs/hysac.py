"""HySAC (Poppi et al., CVPR 2025): safety-aware hyperbolic CLIP on
quadruplets (safe image, safe caption, unsafe image, unsafe caption), four
Lorentzian contrastive and three entailment terms
(hyperbolic_vl/objectives/hysac.py), evaluated by safety retrieval with and
without traversal to safety (hyperbolic_vl/evaluators/safety_retrieval.py).

Variants:
  tiny (default)   trains from scratch on the synthetic world's quadruplets
                   (`world_quadruplets`: each scene and its copy with a drawn
                   and named "unsafe" mark) on a CPU in minutes, then prints
                   the safety-retrieval table
  vit_l14, vit_b32 the release's recipe: OpenAI CLIP adapted with LoRA
                   (configs/adapt_clip.py: rank 16, scale 1/16, k, v, out,
                   fc1, fc2 and the patch embedding of both towers; AdamW
                   1e-4, no schedule, batch 32) on ViSU (`visu`), trained 50
                   epochs (the release stops early, patience 5; we have no
                   early stopping), logit scale kept in [1/0.07, 100]
  vit_s, vit_b, vit_l  HySAC's loss on a hyperbolic CLIP trained from
                   scratch at MERU's paper scale (not in the paper), on ViSU

The release contrasts each GPU's rows alone and never synchronises
gradients, so its run is one replica at batch 32; here the default
contrasts the whole global batch (`objective.contrastive_scope="global"`,
1 device == N); `local` is the release's reading.

  python -m hyperbolic_vl.main --config=configs/hysac.py --workdir=/tmp/hysac_tiny

  python -m hyperbolic_vl.convert --source=open_clip --checkpoint=ViT-L-14.pt \\
      --config=configs/clip.py:openai_vit_l14 --workdir=runs/openai_l14
  python -m hyperbolic_vl.main --config=configs/hysac.py:vit_l14 --workdir=runs/hysac_l14 \\
      --config.init_from=runs/openai_l14 \\
      --config.input.data.path=/data/visu/train/visu_train.json \\
      --config.input.data.eval_path=/data/visu/test/visu_test.json \\
      --config.input.data.safe_image_root=/data/coco \\
      --config.input.data.unsafe_image_root=/data/visu/unsafe_images
"""

import ml_collections

from configs import adapt_clip, common
from hyperbolic_vl.evaluators import registry as evaluators

RELEASE_VARIANTS = tuple(adapt_clip.VARIANTS)
MIN_LOGIT_SCALE = 1 / 0.07  # the release's floor (hysac/training.py)


def safety_evals(
  every_steps: int = 0, num_examples=None, alpha: float = 0.8
) -> ml_collections.ConfigDict:
  """Safety retrieval on the test split, bounds from the validation split
  (written to <workdir>/eval/safety/hysac_bounds.json)."""
  return ml_collections.ConfigDict(
    {
      "safety": evaluators.entry(
        "safety_retrieval",
        every_steps=every_steps,
        num_examples=num_examples,
        bounds_examples=num_examples,
        alpha=alpha,
      )
    }
  )


def get_config(arg: str | None = None):
  arg = common.parse_arg(arg, variant="tiny", data="")
  common.check_variant(arg.variant, extra=RELEASE_VARIANTS)
  default_data = "world_quadruplets" if arg.variant == "tiny" else "visu"
  data = arg.data or default_data
  if arg.variant in RELEASE_VARIANTS:
    config = common.two_tower_config(
      variant=adapt_clip.VARIANTS[arg.variant], objective="hysac", geometry="lorentz", data=data
    )
    adapt_clip.apply_recipe(config)
    config.epochs = 50
  else:
    config = common.two_tower_config(
      variant=arg.variant, objective="hysac", geometry="lorentz", data=data
    )
  # A floor on the logit scale (models/two_towers.py): a key of HySAC's
  # configs only, so every other run's saved config is unchanged.
  config.model.min_logit_scale = MIN_LOGIT_SCALE
  if config.input.data.name == "visu":
    config.input.data.num_train = 0  # every quadruplet of the file
    config.input.data.num_eval = 0
  if arg.variant == "tiny":
    config.input.batch_size = 64
    config.total_steps = 600
    config.log_training_steps = 100
    config.ckpt_steps = 600
    config.optim.warmup_steps = 50
    # Traversal's radius b' = b + tanh((b - alpha)/c) + 1 with the release's
    # alpha 0.8 suits CLIP-L's radii (> 1); the tiny world's embeddings lie
    # at 0.3-0.6, where that b' exceeds every point and nothing would move.
    # alpha = 5 makes tanh ~ -1, so b' ~ b: the bound itself.
    config.evals = safety_evals(num_examples=500, alpha=5.0)
  elif config.input.data.name in ("visu", "world_quadruplets"):
    config.evals = safety_evals(every_steps=5000)
  config.lock()
  return config
