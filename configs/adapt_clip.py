"""Hyperbolic adaptation of a released CLIP: LoRA on both towers, lifted onto
the hyperboloid with MERU's (or HyCoCLIP's) objective.

HySAC (Poppi et al., CVPR 2025) adapts OpenAI's CLIP ViT-L/14 this way; the
settings are those of its released training script (aimagelab/HySAC,
scripts/hysac_train.py and hysac/training.py):
  LoRA rank 16, lora_alpha 1 (updates scaled by 1/16), dropout 0.1, on the
  key, value and output projections of attention, both MLP linears and the
  patch embedding of both towers; every other CLIP weight frozen, the
  projections included; the curvature (init 1, learned in [0.1, 10]), the
  two alphas (init 1/sqrt(embed dim)) and a fresh logit scale (1/0.07)
  trained beside the adapters;
  AdamW lr 1e-4 held constant (no schedule), betas (0.9, 0.98), weight
  decay 0.2 except on gains, biases and learned scalars; batch 32;
  float32 towers (its autocast is off).
HySAC trains 50 epochs with early stopping on ViSU, a dataset that is not
public; here a run is sized in epochs of your data (`epochs`, default 5)
and has no early stopping.

Variants: vit_b32, vit_l14 (OpenAI CLIP's architectures, configs/clip.py's
openai_vit_b32 / openai_vit_l14). Arguments: objective=meru (default) or
hycoclip (grounded data, `data=grit` by default), data= as elsewhere.

The run starts from a converted CLIP (`init_from` is required):

  python -m hyperbolic_vl.convert --source=open_clip --checkpoint=ViT-B-32.pt \\
      --config=configs/clip.py:openai_vit_b32 --workdir=runs/openai_b32
  python -m hyperbolic_vl.main --config=configs/adapt_clip.py:vit_b32 \\
      --workdir=runs/hyperbolic_b32 --config.init_from=runs/openai_b32 \\
      --config.input.data.path=/data/captions.csv --config.input.data.image_root=/data/images
"""

import ml_collections
from ml_collections import config_dict

from configs import common
from hyperbolic_vl import errors
from hyperbolic_vl.evaluators import registry as evaluators

VARIANTS = {"vit_b32": "openai_vit_b32", "vit_l14": "openai_vit_l14"}
OBJECTIVES = {"meru": "", "hycoclip": "grit"}  # objective -> its default data source


def apply_recipe(config: ml_collections.ConfigDict) -> None:
  """HySAC's adaptation settings (the module docstring) on a two-tower
  config of an OpenAI CLIP architecture; configs/hysac.py uses them too."""
  # The converted CLIP to adapt: required (a workdir written by
  # `python -m hyperbolic_vl.convert --config=configs/clip.py:openai_...`).
  config.init_from = config_dict.placeholder(str)
  # Top-level params that keep their fresh init although the CLIP run has
  # them: HySAC learns a new logit scale for distances instead of CLIP's.
  config.init_from_fresh = ("log_logit_scale",)

  config.model.dtype = "float32"
  config.model.lora.update(
    dict(
      rank=16,
      alpha=1.0,
      dropout=0.1,
      targets=("k", "v", "out", "fc1", "fc2", "patch"),
      towers=("image", "text"),
    )
  )
  config.input.batch_size = 32
  config.optim.update(
    dict(
      lr=1e-4,
      schedule="constant",
      warmup_steps=0,
      b1=0.9,
      b2=0.98,
      weight_decay=0.2,
      decay_gains_biases=False,
    )
  )
  # Sized in passes over the training rows, counted at start-up.
  config.total_steps = 0
  config.epochs = 5


def get_config(arg: str | None = None):
  arg = common.parse_arg(arg, variant="vit_b32", objective="meru", data="")
  if arg.variant not in VARIANTS:
    raise errors.ConfigError(f"unknown variant {arg.variant!r}; valid: {list(VARIANTS)}")
  if arg.objective not in OBJECTIVES:
    raise errors.ConfigError(f"objective={arg.objective!r}; valid: {list(OBJECTIVES)}")
  config = common.two_tower_config(
    variant=VARIANTS[arg.variant],
    objective=arg.objective,
    geometry="lorentz",
    data=arg.data or OBJECTIVES[arg.objective],
  )
  apply_recipe(config)
  if config.input.data.name == "world":
    # The synthetic world (`data=world`, to try the recipe without data).
    config.evals = ml_collections.ConfigDict({"world": evaluators.entry("world")})
  else:
    config.evals = common.paper_evals(every_steps=5000)
  config.lock()
  return config
