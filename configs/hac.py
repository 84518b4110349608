"""HAC (Dibitonto, Beyan, Murino, ICPR 2026): a released Euclidean CLIP made
hyperbolic with rank-stabilised LoRA and HyCoCLIP's objective
(docs/methods/hac.md).

The recipe is the release's configs/train_hac_vit_b_lora.py (fdibiton/HAC
at 99d6c52): HyCoCLIP's Euclidean CLIP ViT-B/16 (`clip_vit_b_grit` in the
release table) with both projections and final LayerNorms re-initialised,
curvature learned from 1, alphas 1/sqrt(512); LoRA r=128, alpha=128,
rank-stabilised (update scaled alpha/sqrt(r) = 11.3), dropout 0.1 on q, k,
v and the attention output of visual blocks 8-11 and text blocks 4-11
(blocks 0-7 and 0-3 excluded); NEFTune noise alpha 0.1 on the text tower's
embeddings while training; HyCoCLIP's loss (4 contrastive terms, 4
entailment terms x 0.5, apertures 0.7 / 1.2, lambda 0.2) on GRIT; AdamW lr
2.5e-4, betas (0.9, 0.98), weight decay 0.2, 4k warmup then cosine over 30k
steps, batch 768. Only the adapters, projections, final LayerNorms and the
four learned scalars train.

Weight decay as the release's code applies it: its config excludes gains,
biases and `lora_` parameters, but `set_weight_decay_per_param` turns the
configured `gain_bias_decay=0.0` into 0.2 (`gain_bias_decay or
weight_decay`, hac/optim.py:116) and matches the exclusions against the
local parameter name ("weight"), which never holds "lora_"
(hac/optim.py:143): so LoRA matrices and the final LayerNorms decay at 0.2
as the projections do; only the logit scale, curvature and alphas do not.
`--config.optim.decay_gains_biases=False` spares the LayerNorms and
biases (the config's stated intent); the adapters then still decay.

Variants:
  vit_b (default)  the release's recipe on GRIT (`data=grit`)
  tiny             the same recipe on the synthetic world's boxes
                   (`world_boxes`), towers "mu" (2 blocks each), LoRA rank 8
                   (alpha 8, rank-stabilised) with block 0 of each tower
                   excluded; a few minutes on a CPU

Both start from a converted (or trained) Euclidean CLIP (`init_from`):

  python -m hyperbolic_vl.convert --pretrained=clip_vit_b_grit --workdir=runs/clip_vit_b_grit
  python -m hyperbolic_vl.main --config=configs/hac.py --workdir=runs/hac_vit_b \\
      --config.init_from=runs/clip_vit_b_grit \\
      --config.input.data.path='/data/grit/processed/{00000..01023}.tar' \\
      --config.input.data.num_train=0

  python -m hyperbolic_vl.main --config=configs/clip.py --workdir=/tmp/clip_tiny
  python -m hyperbolic_vl.main --config=configs/hac.py:tiny --workdir=/tmp/hac_tiny \\
      --config.init_from=/tmp/clip_tiny
"""

import ml_collections
from ml_collections import config_dict

from configs import common
from hyperbolic_vl import errors
from hyperbolic_vl.evaluators import registry as evaluators

VARIANTS = ("vit_b", "tiny")
# What HAC re-initialises although the CLIP it adapts has it (`init_proj`,
# `init_final_ln` in hac/models.py:632-647), and what therefore trains
# beside the adapters.
FRESH_AND_TRAINED = ("image_proj", "text_proj", "image_tower/norm", "text_tower/norm")
RELEASE_LORA = dict(
  rank=128,
  alpha=128.0,
  dropout=0.1,
  targets=("q", "k", "v", "out"),
  towers=("image", "text"),
  rank_stabilised=True,
  image_excluded_blocks=tuple(range(8)),
  text_excluded_blocks=tuple(range(4)),
  train_beside=FRESH_AND_TRAINED,
)
NEFTUNE_ALPHA = 0.1  # TransformerTextEncoder(noise_alpha=0.1) in the release's config


def apply_recipe(config: ml_collections.ConfigDict, lora: dict) -> None:
  """HAC's adaptation settings (the module docstring) on a two-tower config."""
  config.init_from = config_dict.placeholder(str)
  config.init_from_fresh = FRESH_AND_TRAINED
  # The extra LoRA keys (rank_stabilised, the excluded blocks, train_beside)
  # exist in HAC's configs only, so every other run's saved config is unchanged.
  config.model.lora = ml_collections.ConfigDict(lora)
  config.model.text_embedding_noise = NEFTUNE_ALPHA
  config.optim.update(
    dict(
      lr=2.5e-4,
      schedule="cosine",
      warmup_steps=4000,
      b1=0.9,
      b2=0.98,
      weight_decay=0.2,
      decay_gains_biases=True,
    )
  )
  config.input.batch_size = 768
  config.total_steps = 30_000
  config.ckpt_steps = 5000


def get_config(arg: str | None = None):
  arg = common.parse_arg(arg, variant="vit_b", data="")
  if arg.variant not in VARIANTS:
    raise errors.ConfigError(f"unknown variant {arg.variant!r}; valid: {list(VARIANTS)}")
  if arg.variant == "tiny":
    config = common.two_tower_config(
      variant="tiny", objective="hycoclip", geometry="lorentz", data=arg.data or "world_boxes"
    )
    apply_recipe(
      config,
      dict(
        RELEASE_LORA,
        rank=8,
        alpha=8.0,
        image_excluded_blocks=(0,),
        text_excluded_blocks=(0,),
      ),
    )
    config.input.batch_size = 64
    config.total_steps = 300
    config.log_training_steps = 50
    config.ckpt_steps = 300
    config.optim.lr = 2e-3
    config.optim.warmup_steps = 30
    config.evals = ml_collections.ConfigDict(
      {"world": evaluators.entry("world"), "world_boxes": evaluators.entry("world_boxes")}
    )
  else:
    config = common.two_tower_config(
      variant="vit_b", objective="hycoclip", geometry="lorentz", data=arg.data or "grit"
    )
    apply_recipe(config, RELEASE_LORA)
    if config.input.data.name == "world_boxes":
      config.evals = ml_collections.ConfigDict(
        {"world": evaluators.entry("world"), "world_boxes": evaluators.entry("world_boxes")}
      )
    else:
      config.evals = common.paper_evals(every_steps=5000)
  config.lock()
  return config
