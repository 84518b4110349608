"""Full-size export round trip: MERU ViT-S/16 and open_clip ViT-B/32
(QuickGELU) with random non-trivial weights, release -> run -> release.

  python benchmarks/export_round_trip.py [--meru_repo=/path/to/meru]

Each release (the reference modules of tests/interop/test_interop.py at the
released sizes, every weight perturbed) is saved in its own file format,
converted into a run directory (`interop.workdir.convert_checkpoint`, the
paper configs with float32 towers), exported back with
`python -m hyperbolic_vl.export`'s function, and the exported file is
loaded the way the other code loads it: MERU's weights into a fresh MERU
reference (`load_state_dict(torch.load(f)["model"])`, strict), open_clip's
through `open_clip.create_model("ViT-B-32-quickgelu", pretrained=FILE)`.
Prints per model the largest |exported - original| over every tensor of
the state dict, whether the key sets agree, and the largest difference
between the reloaded torch model's embeddings and `hyperbolic_vl.load`'s
of the run (absolute, and relative to the largest embedding entry) on 8
generated 224 px images and 8 captions. With `--meru_repo` (a checkout of
facebookresearch/meru; MERU imports loguru, the `bench` extra), the MERU
file is also loaded by MERU's own code: its `MERU` model (ViT-S as in its
configs/train_meru_vit_s.py) through its `CheckpointManager(model=model)
.load(path)`, and that model's `encode_image` / `encode_text(project=True)`
are compared the same way. Needs the `interop` extra.
"""

import argparse
import math
import os
import pathlib
import sys
import tempfile
import time

import numpy as np
import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests" / "interop"), str(ROOT / "tests" / "fixtures")]

import open_clip  # noqa: E402
import test_interop as refs  # noqa: E402

import hyperbolic_vl  # noqa: E402
from configs import clip as clip_config  # noqa: E402
from configs import meru as meru_config  # noqa: E402
from hyperbolic_vl import export  # noqa: E402
from hyperbolic_vl.interop import workdir  # noqa: E402

CAPTIONS = [
  "A blue bird sitting on the top of a branch with autumn leaves",
  "table with three plates",
  "a dog",
  "two people riding horses on a beach at sunset",
  "a red double-decker bus in a busy street",
  "bird",
  "a plate of food",
  "",
]


def float32_config(module, variant):
  config = module.get_config(variant)
  with config.unlocked():
    config.model.dtype = "float32"
  return config


def meru_vit_s(seed: int) -> torch.nn.Module:
  torch.manual_seed(seed)
  return refs.MeruReference(**refs.MERU_VIT_S_SIZES, hyperbolic=True).eval()


def open_clip_b32() -> torch.nn.Module:
  model = open_clip.create_model("ViT-B-32-quickgelu")  # random init; no download
  refs.perturb(model, seed=2)
  with torch.no_grad():
    model.logit_scale.fill_(math.log(1 / 0.03))
  return model.eval()


def tensor_difference(exported: dict, original: dict) -> tuple[float, str, bool]:
  """(max |exported - original| over shared tensors, the tensor where it
  is, key sets equal)."""
  worst, where = 0.0, "-"
  for name, value in original.items():
    if name in exported:
      diff = (exported[name].double() - value.double()).abs().max().item()
      if diff > worst:
        worst, where = diff, name
  return worst, where, set(exported) == set(original)


def embedding_difference(torch_model, loaded, pixels, tokens) -> tuple[float, float]:
  """(max |torch - ours|, that over max |torch|) over images and texts."""
  with torch.no_grad():
    theirs = [
      torch_model.encode_image(torch.from_numpy(pixels).permute(0, 3, 1, 2)).numpy(),
      torch_model.encode_text(torch.from_numpy(tokens).long()).numpy(),
    ]
  ours = [np.asarray(loaded.encode_images(pixels)), np.asarray(loaded.encode_tokens(tokens))]
  absolute = max(float(np.max(np.abs(a - b))) for a, b in zip(ours, theirs))
  scale = max(float(np.max(np.abs(b))) for b in theirs)
  return absolute, absolute / scale


def meru_own_model():
  """MERU ViT-S built by MERU's own code (its configs/train_meru_vit_s.py)."""
  from meru.encoders.image_encoders import build_timm_vit
  from meru.encoders.text_encoders import TransformerTextEncoder
  from meru.models import MERU

  return MERU(
    visual=build_timm_vit(
      "vit_small_mocov3_patch16_224", global_pool="token", use_sincos2d_pos=True
    ),
    textual=TransformerTextEncoder(arch="L12_W512", vocab_size=49408, context_length=77),
    embed_dim=512,
    curv_init=1.0,
    learn_curv=True,
    entail_weight=0.2,
  ).eval()


class MeruOwnEncoders:
  """MERU's model with the reference modules' call signature: images in
  [0, 1], BCHW; padded token rows (MERU pads variable-length lists itself)."""

  def __init__(self, model):
    self.model = model

  def encode_image(self, images):
    return self.model.encode_image(images, project=True)

  def encode_text(self, tokens):
    return self.model.encode_text([row[: int((row > 0).sum())] for row in tokens], project=True)


def report(name, absolute, relative):
  print(f"  {name}: embeddings max |diff| {absolute:.2e} ({relative:.2e} relative)", flush=True)


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--num_images", type=int, default=8)
  parser.add_argument("--meru_repo", help="checkout of facebookresearch/meru (optional)")
  args = parser.parse_args()
  if args.meru_repo:
    sys.path.insert(0, os.path.abspath(args.meru_repo))
  pixels = refs.images("generated", size=224, count=args.num_images)
  tokens = open_clip.tokenize(CAPTIONS, context_length=77).numpy().astype(np.int32)
  cases = [
    ("MERU ViT-S/16", "meru", meru_vit_s(0), float32_config(meru_config, "vit_s")),
    (
      "open_clip ViT-B/32 QuickGELU",
      "open_clip",
      open_clip_b32(),
      float32_config(clip_config, "openai_vit_b32"),
    ),
  ]
  for name, release, reference, config in cases:
    start = time.perf_counter()
    original = reference.state_dict()
    with tempfile.TemporaryDirectory() as scratch:
      scratch = pathlib.Path(scratch)
      checkpoint = scratch / "release.pt"
      torch.save({"model": original} if release == "meru" else original, checkpoint)
      run = scratch / "run"
      workdir.convert_checkpoint(release, str(checkpoint), config, str(run))
      output = scratch / "exported.pt"
      export.export_run(str(run), release, str(output))
      if release == "meru":
        exported = torch.load(output, weights_only=True)["model"]
        reloaded = meru_vit_s(seed=1)  # other random weights, all replaced
        reloaded.load_state_dict(exported, strict=True)
      else:
        exported = torch.load(output, weights_only=True)
        reloaded = refs.NormalisedOpenClip(
          open_clip.create_model("ViT-B-32-quickgelu", pretrained=str(output)).eval()
        )
      tensors, where, same_keys = tensor_difference(exported, original)
      loaded = hyperbolic_vl.load(run)
      print(
        f"{name}: tensors max |diff| {tensors:.2e} (at {where}) over {len(original)} "
        f"({'same keys' if same_keys else 'KEYS DIFFER'})",
        flush=True,
      )
      report("reloaded reference", *embedding_difference(reloaded, loaded, pixels, tokens))
      if release == "meru" and args.meru_repo:
        from meru.utils.checkpointing import CheckpointManager

        model = meru_own_model()
        CheckpointManager(model=model).load(output)  # MERU's loader: strict load_state_dict
        own = MeruOwnEncoders(model)
        report("MERU's own code", *embedding_difference(own, loaded, pixels, tokens))
    print(f"  ({time.perf_counter() - start:.0f} s)", flush=True)


if __name__ == "__main__":
  main()
