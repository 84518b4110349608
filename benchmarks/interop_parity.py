"""Full-size converter parity: MERU ViT-S, MERU's CLIP ViT-S and open_clip
ViT-B/32 (QuickGELU) with random non-trivial weights, PyTorch vs converted.

  python benchmarks/interop_parity.py --images=$HIERARCAPS/images \
      --captions=$HIERARCAPS/hierarcaps_test_sample.csv

Each reference (the same modules tests/interop/test_interop.py builds at depth 2,
here at the released sizes) gets every weight perturbed, is saved in its
release's file format, converted with `hyperbolic_vl.interop` into a run
directory with the config the docs name (no overrides), loaded with
`hyperbolic_vl.load` (float32 by default) and run on the same real images
(224 px, bicubic) and captions (open_clip's tokenizer). Prints the worst relative difference, max|ours - torch| /
max|torch|, of encode_images and encode_texts per model; the acceptance bar
is 1e-4. Needs the `interop` extra.
"""

import argparse
import csv
import math
import pathlib
import sys
import tempfile
import time

import numpy as np
import torch
from PIL import Image

ROOT = pathlib.Path(__file__).resolve().parents[1]
# The PyTorch reference modules (tests/interop/test_interop.py) and the
# test helpers they import.
sys.path[:0] = [str(ROOT / "tests" / "interop"), str(ROOT / "tests" / "fixtures")]

import open_clip  # noqa: E402
import test_interop as refs  # noqa: E402

import hyperbolic_vl  # noqa: E402
from configs import clip as clip_config  # noqa: E402
from configs import meru as meru_config  # noqa: E402
from hyperbolic_vl.interop import workdir  # noqa: E402

BAR = 1e-4


def load_images(folder: pathlib.Path, count: int, size: int) -> np.ndarray:
  paths = sorted(folder.glob("*.jpg"))[:count]
  if not paths:
    raise SystemExit(f"no .jpg images in {folder}")
  return np.stack(
    [
      np.asarray(Image.open(p).convert("RGB").resize((size, size), Image.BICUBIC), np.float32)
      / 255.0
      for p in paths
    ]
  )


def load_captions(path: pathlib.Path, count: int) -> list[str]:
  with open(path, newline="", encoding="utf-8") as f:
    rows = list(csv.DictReader(f))
  # Every tier of the first rows: short ("bird") to full-sentence captions.
  captions = [tier.strip() for row in rows for tier in row["captions"].split("=>")]
  return captions[:count]


def full_config(module, variant):
  """The config the docs name, as it is (its bf16 training towers included:
  `hyperbolic_vl.load` embeds in float32 by default)."""
  return module.get_config(variant)


def convert_and_run(source, state, config, pixels, tokens, scratch):
  """The documented path: convert into a run directory, `hyperbolic_vl.load` it."""
  checkpoint = scratch / "checkpoint.pt"
  torch.save(state, checkpoint)
  out = scratch / "converted"
  workdir.convert_checkpoint(source, str(checkpoint), config, str(out))
  model = hyperbolic_vl.load(str(out))
  return np.asarray(model.encode_images(pixels)), np.asarray(model.encode_tokens(tokens))


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--images", required=True, help="Folder of real .jpg images.")
  parser.add_argument("--captions", required=True, help="HierarCaps test CSV.")
  parser.add_argument("--num_images", type=int, default=8)
  parser.add_argument("--num_captions", type=int, default=32)
  args = parser.parse_args()
  torch.manual_seed(0)
  pixels = load_images(pathlib.Path(args.images), args.num_images, 224)
  captions = load_captions(pathlib.Path(args.captions), args.num_captions)
  tokens = open_clip.tokenize(captions, context_length=77).numpy().astype(np.int32)
  torch_pixels = torch.from_numpy(pixels).permute(0, 3, 1, 2)
  print(f"{len(pixels)} real images (224 px), {len(captions)} captions")

  cases = []
  for hyperbolic in (True, False):
    reference = refs.MeruReference(**refs.MERU_VIT_S_SIZES, hyperbolic=hyperbolic).eval()
    config = full_config(meru_config if hyperbolic else clip_config, "vit_s")
    name = "MERU ViT-S" if hyperbolic else "MERU's CLIP ViT-S"
    cases.append((name, "meru", {"model": reference.state_dict()}, config, reference))
  model = open_clip.create_model("ViT-B-32-quickgelu")  # random init; no download
  refs.perturb(model, seed=2)
  with torch.no_grad():
    model.logit_scale.fill_(math.log(1 / 0.03))
  cases.append(
    (
      "open_clip ViT-B/32 QuickGELU",
      "open_clip",
      model.state_dict(),
      full_config(clip_config, "openai_vit_b32"),
      refs.NormalisedOpenClip(model.eval()),
    )
  )

  worst = 0.0
  for name, source, state, config, reference in cases:
    start = time.perf_counter()
    with torch.no_grad():
      ref_images = reference.encode_image(torch_pixels).numpy()
      ref_texts = reference.encode_text(torch.from_numpy(tokens).long()).numpy()
    with tempfile.TemporaryDirectory() as scratch:
      ours_images, ours_texts = convert_and_run(
        source, state, config, pixels, tokens, pathlib.Path(scratch)
      )
    image_error = refs.relative_error(ours_images, ref_images)
    text_error = refs.relative_error(ours_texts, ref_texts)
    worst = max(worst, image_error, text_error)
    print(
      f"{name:30s} encode_images {image_error:.2e}  encode_texts {text_error:.2e}  "
      f"({time.perf_counter() - start:.0f} s)",
      flush=True,
    )
  print(f"worst relative difference {worst:.2e} ({'within' if worst < BAR else 'ABOVE'} {BAR:g})")
  sys.exit(0 if worst < BAR else 1)


if __name__ == "__main__":
  main()
