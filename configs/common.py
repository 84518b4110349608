"""Shared config pieces and the `file.py:arg` parser (big_vision style).

`--config=configs/meru.py:vit_l` passes "vit_l" to `get_config`; the argument
may also be a comma-separated list of `key=value` items and bare flags, e.g.
`meru.py:variant=vit_s,runlocal`. A bare word that is not a flag is taken as
the variant. Every config takes `data=NAME`, the source of input.data (a
section holds only its source's settings, so switching source is an argument,
not a --config.input.data.name override): e.g. `meru.py:vit_l,data=tfds`.
"""

from __future__ import annotations

import dataclasses

import ml_collections
from ml_collections import config_dict

from hyperbolic_vl import errors
from hyperbolic_vl.data import registry as data_registry
from hyperbolic_vl.evaluators import registry as evaluators
from hyperbolic_vl.objectives import registry as objective_registry


def _coerce(text: str, default):
  if isinstance(default, bool):
    if text.lower() in ("1", "true", "yes", ""):
      return True
    if text.lower() in ("0", "false", "no"):
      return False
    raise errors.ConfigError(f"expected a boolean, got {text!r}")
  if isinstance(default, int):
    return int(text)
  if isinstance(default, float):
    return float(text)
  return text


def parse_arg(arg: str | None, **spec) -> ml_collections.ConfigDict:
  """Parses "vit_l" or "variant=vit_s,runlocal" against defaults in `spec`."""
  result = dict(spec)
  for item in filter(None, (arg or "").split(",")):
    key, sep, value = item.partition("=")
    key = key.strip()
    if not sep and key not in spec and "variant" in spec:
      key, value = "variant", item
    elif not sep:
      value = "true"
    if key not in spec:
      raise errors.ConfigError(f"unknown config argument {key!r}; valid: {sorted(spec)}")
    result[key] = _coerce(value.strip(), spec[key])
  return ml_collections.ConfigDict(result)


# Image-tower size per paper variant (MERU App. D.1: patch 16 everywhere).
PAPER_VARIANTS = {"vit_s": "S/16", "vit_b": "B/16", "vit_l": "L/16"}
TINY_VARIANTS = ("tiny",)
# OpenAI CLIP architectures (open_clip's "-quickgelu" models): image variant,
# text size, embedding width. All take 224 px images and 77 BPE tokens.
OPENAI_VARIANTS = {
  "openai_vit_b32": ("B/32", "base", 512),
  "openai_vit_b16": ("B/16", "base", 512),
  "openai_vit_l14": ("L/14", "large", 768),
}


def set_pairwise_loss(config: ml_collections.ConfigDict, loss: str) -> None:
  """`loss=sigmoid`: SigLIP's pairwise sigmoid loss with its initialisation
  (logit scale 10, learned logit bias -10); "softmax" leaves the config as is.
  The text columns are gathered; `--config.objective.sigmoid_columns=ring`
  passes them around the devices instead."""
  if loss == "softmax":
    return
  if loss != "sigmoid":
    raise errors.ConfigError(f"config argument loss={loss!r}; valid: 'softmax', 'sigmoid'")
  config.objective.pairwise_loss = "sigmoid"
  config.model.logit_scale_init = 10.0
  config.model.logit_bias_init = -10.0


def set_openai_architecture(config: ml_collections.ConfigDict, variant: str) -> None:
  """OpenAI CLIP's layout on a paper-scale config: learned positions, ln_pre,
  bias-free patch embedding, QuickGELU, OpenAI pixel statistics, clip_bpe."""
  image_variant, text_variant, embed_dim = OPENAI_VARIANTS[variant]
  config.model.update(
    dict(
      image_variant=image_variant,
      text_variant=text_variant,
      embed_dim=embed_dim,
      image_position_embedding="learned",
      image_ln_pre=True,
      image_patch_bias=False,
      pixel_stats="openai",
      activation="quick_gelu",
    )
  )
  config.model.image_num_heads = None
  config.input.image_size = 224
  config.input.tokenizer.name = "clip_bpe"
  config.input.tokenizer.vocab_size = 49408
  config.input.tokenizer.context_length = 77


def check_variant(variant: str, extra: tuple[str, ...] = ()) -> None:
  valid = TINY_VARIANTS + tuple(PAPER_VARIANTS) + extra
  if variant not in valid:
    raise errors.ConfigError(f"unknown variant {variant!r}; valid: {list(valid)}")


def world_input(
  batch_size: int = 128, image_size: int = 32, data: str = "world"
) -> ml_collections.ConfigDict:
  """The embedded synthetic world (default): no downloads, CPU friendly.

  `data` names the source (hyperbolic_vl/data/registry.py): input.data holds
  exactly its settings, each overridable from the command line.
  """
  return ml_collections.ConfigDict(
    dict(
      batch_size=batch_size,
      image_size=image_size,
      num_workers=0,
      num_threads=1,
      prefetch_batches=2,
      # Share of undecodable examples (skipped and counted) that stops a run.
      max_bad_fraction=0.01,
      data=data_registry.section(data),
      tokenizer=dict(name="world_sentencepiece", context_length=32, vocab_size=256, model_path=""),
    )
  )


# Real-data sources read at most this many training / evaluation examples
# unless told otherwise (the values every source had before issue 17, when
# input.data was one section shared by all sources; num_train=0 reads all).
USER_DATA_LIMITS = dict(num_train=100_000, num_eval=1000)


def user_data_input(
  batch_size: int, image_size: int = 224, data: str = "image_text_csv"
) -> ml_collections.ConfigDict:
  """Paper-scale input: an image-text CSV (+ image folder) the user supplies.

  Set --config.input.data.path=/data/captions.csv and
  --config.input.data.image_root=/data/images (or another source by the
  config argument `data=`, e.g. `configs/meru.py:vit_l,data=tfds` with
  --config.input.data.tfds_name / data_dir). The tokenizer is CLIP's BPE,
  shipped with the package, as in the released code of MERU, HMID-Net, ATMG
  and HyCoCLIP (vocabulary 49,408, 77 tokens); a SentencePiece model of your
  own is --config.input.tokenizer.name=sentencepiece
  --config.input.tokenizer.model_path=/data/spm.model.
  """
  config = world_input(batch_size, image_size)
  # Real images: PIL releases the GIL while it decodes and resizes, so
  # reader threads spread the per-example work over the host's cores
  # (num_workers > 0 adds worker processes on hosts with many cores).
  config.num_threads = 8
  fields = {field.name for field in dataclasses.fields(data_registry.settings_class(data))}
  config.data = data_registry.section(
    data, **{key: value for key, value in USER_DATA_LIMITS.items() if key in fields}
  )
  config.tokenizer = ml_collections.ConfigDict(
    dict(name="clip_bpe", context_length=77, vocab_size=49408, model_path="", vocab_path="")
  )
  return config


def paper_evals(every_steps: int) -> ml_collections.ConfigDict:
  """MERU's headline benchmarks during paper-scale training: ImageNet
  zero-shot and COCO retrieval, read from TFDS (set data_dir, e.g.
  --config.evals.imagenet.data_dir=/data/tfds). A dataset that is not there
  is reported at start-up and training goes on without it;
  `python -m hyperbolic_vl.evaluate --suite=meru` runs the whole table."""
  return ml_collections.ConfigDict(
    {
      "imagenet": evaluators.entry("zero_shot", dataset="imagenet", every_steps=every_steps),
      "coco": evaluators.entry("retrieval", dataset="coco", every_steps=every_steps),
    }
  )


def two_tower_config(
  *, variant: str, objective: str, geometry: str, data: str = ""
) -> ml_collections.ConfigDict:
  """Everything but the objective section, at tiny or MERU-paper scale.
  `data` names input.data's source ("": the world for tiny, else a CSV)."""
  config = ml_collections.ConfigDict()
  config.seed = 0
  # Workdir of another run whose latest params initialise this one (e.g. a
  # CLIP run to fine-tune); ignored once this workdir has its own checkpoint.
  config.init_from = ""
  config.num_devices = config_dict.placeholder(int)  # None: every device
  # The towers' compute dtype of every evaluation (during and after training,
  # `hyperbolic_vl.load`'s default too): float32 whatever `model.dtype`
  # training uses; "bfloat16" is faster and moves embeddings by about 1%.
  config.eval_dtype = "float32"
  # fsdp > 1: params and optimizer state sharded over an `fsdp` mesh axis of
  # this size (hyperbolic_vl/training/sharding.py); arrays below fsdp_min_elements
  # elements stay replicated.
  config.mesh = ml_collections.ConfigDict(dict(fsdp=1, fsdp_min_elements=2**14))
  config.keep_ckpts = 3
  # JAX's persistent compilation cache: a restarted or resumed run loads its
  # compiled step from here instead of compiling it again. "": the user cache
  # ($XDG_CACHE_HOME or ~/.cache, /hyperbolic_vl/jax_compilation_cache);
  # "off": no cache.
  config.compilation_cache_dir = ""
  # The console's progress line: every this many seconds (a bar redrawn in
  # place where the output is a terminal).
  config.progress_every_secs = 30.0
  config.optim = ml_collections.ConfigDict(
    dict(
      name="adamw",  # or "sgd" (PyTorch's, with momentum; HCL's released recipe)
      momentum=0.9,  # SGD's only
      steps_per_epoch=0,  # schedule "cosine_per_epoch" only (run_length fills it)
      lr=5e-4,
      schedule="cosine",  # linear warmup + cosine to 0; "constant": lr throughout
      warmup_steps=4000,
      weight_decay=0.2,
      b1=0.9,
      b2=0.98,
      eps=1e-8,
      # Global gradient-norm clipping threshold; 0 turns it off. No paper
      # here nor its released code clips, so the default is off; set e.g.
      # 1.0 to clip (the threshold this codebase used before).
      grad_clip_norm=0.0,
      # MERU's paper: no decay on gains/biases; the released code of MERU,
      # HyCoCLIP and PHyCLIP decays them too (`gain_bias_decay or
      # weight_decay`), which their paper variants set True.
      decay_gains_biases=False,
      # Decay a product model's per-factor curvatures and alphas (PHyCLIP's
      # release does); other learned scalars never decay.
      decay_factor_scalars=False,
      # K > 1: each device's rows go through the towers in K micro-batches
      # (one micro-batch's activations at a time, the towers' forward run
      # twice); the loss and gradient stay those of the whole batch.
      accumulation_steps=1,
      # AdamW's first moment (SGD's momentum buffer) in this dtype; "": the
      # params' dtype. "bfloat16" halves its memory (optax's mu_dtype).
      mu_dtype="",
    )
  )
  config.model = ml_collections.ConfigDict(
    dict(
      # The model registry's name (hyperbolic_vl/models/registry.py).
      name="two_towers",
      geometry=geometry,
      embed_dim=512,
      image_variant="S/16",
      text_variant="base",
      curv_init=1.0,
      learn_curv=True,
      curv_clamp_factor=10.0,  # a learned c stays in [c0 / f, f c0]
      logit_scale_init=1 / 0.07,
      max_logit_scale=100.0,
      # The sigmoid loss's learned logit bias (objective.pairwise_loss=
      # 'sigmoid'; SigLIP: -10); None: no bias param (every softmax loss).
      logit_bias_init=config_dict.placeholder(float),
      alpha_init=config_dict.placeholder(float),
      learn_alphas=True,
      # > 0: the embedding is a product of embed_dim / factor_dim Lorentz
      # spaces, each with its own curvature and alphas (PHyCLIP,
      # geometry/product.py); 0: one space.
      factor_dim=0,
      dtype="bfloat16",
      # Tower layout (models.tower_options.TOWER_OPTION_DEFAULTS): MERU's.
      image_position_embedding="sincos2d",
      image_ln_pre=False,
      image_patch_bias=True,
      # None: the size's head count. MERU's ViT-S (MoCo-v3) has 12 heads;
      # the paper variant vit_s below sets that so its checkpoints convert.
      image_num_heads=config_dict.placeholder(int),
      pixel_stats="imagenet",
      activation="gelu",
      text_init="clip",
      # Locked towers (open_clip's LiT options, models/locking.py): a locked
      # tower and its projection get no gradient and no optimizer state;
      # the last N blocks (and what follows them), or its LayerNorms, may
      # stay trainable.
      lock_image=False,
      lock_image_unlocked_blocks=0,
      lock_image_norms_trainable=False,
      lock_text=False,
      lock_text_unlocked_blocks=0,
      lock_text_norms_trainable=False,
      # LoRA adapters (models/lora.py); rank 0: none. An adapted tower's
      # base weights are locked, its adapters train.
      lora=ml_collections.ConfigDict(
        dict(
          rank=0,
          alpha=1.0,
          dropout=0.0,
          targets=("q", "k", "v", "out", "fc1", "fc2"),
          towers=("image", "text"),
        )
      ),
      # What each tower's encoder blocks keep for the backward pass: "none"
      # (everything), "dots_saveable" (matmul outputs) or "full" (the
      # block's input); less memory for recomputation, same function.
      image_remat="none",
      text_remat="none",
      # FLIP's token dropping (models/token_drop.py): this fraction of each
      # image's patches dropped in every training step (never in
      # evaluation); from image_token_drop_until_step on (0: never) whole
      # images again, FLIP's unmasked tuning.
      image_token_drop=0.0,
      image_token_drop_until_step=0,
    )
  )
  # Every setting the objective understands, with its default.
  config.objective = objective_registry.section(objective)
  if "entail_weight_learned" in config.objective:
    # The learned entailment weight's param exists only in models of runs
    # that learn it: the model key follows the objective's setting, so
    # --config.objective.entail_weight_learned=True is all a user sets.
    config.model.learned_entail_weight = config.objective.get_ref("entail_weight_learned")

  if variant == "tiny":
    config.input = world_input(batch_size=128, image_size=32, data=data or "world")
    config.total_steps = 1000
    config.log_training_steps = 100
    config.ckpt_steps = 500
    # The synthetic world's figures, at the end of training only.
    config.evals = ml_collections.ConfigDict({"world": evaluators.entry("world")})
    config.optim.lr = 2e-3
    config.optim.warmup_steps = 100
    config.optim.weight_decay = 0.05
    config.model.update(
      dict(embed_dim=64, image_variant="mu/8", text_variant="mu", dtype="float32")
    )
  else:
    config.input = user_data_input(batch_size=2048, image_size=224, data=data or "image_text_csv")
    config.total_steps = 120_000
    config.log_training_steps = 100
    config.ckpt_steps = 2000
    config.evals = paper_evals(every_steps=10_000)
    if variant in OPENAI_VARIANTS:
      set_openai_architecture(config, variant)
    else:
      config.model.image_variant = PAPER_VARIANTS[variant]
      if variant == "vit_s":
        config.model.image_num_heads = 12
  return config
