"""The released models as a user lists them: `hyperbolic_vl.list_pretrained()`
and `python -m hyperbolic_vl.convert --list` (and `--help`, exit 0)."""

import os
import subprocess
import sys

from paths import REPO

import hyperbolic_vl
from hyperbolic_vl.interop import releases


def test_list_pretrained_gives_every_release_with_its_paper_size_and_address():
  models = hyperbolic_vl.list_pretrained()
  assert [m.name for m in models] == list(releases.RELEASES)
  by_name = {m.name: m for m in models}
  meru = by_name["meru_vit_l"]
  assert (meru.size, meru.where_from) == (
    "ViT-L/16",
    "https://dl.fbaipublicfiles.com/meru/meru_vit_l.pth",
  )
  assert meru.paper == "Desai et al., Hyperbolic Image-Text Representations, ICML 2023"
  assert by_name["hysac_vit_l"].size == "ViT-L/14"
  assert by_name["uncha_vit_b"].where_from == "Hugging Face hayeonkim/uncha (uncha_vit_b.pth)"
  assert by_name["openai_clip_vit_b32"].size == "ViT-B/32"
  assert by_name["atmg_vit_s"].where_from.startswith("no download address: ")


def test_the_command_lists_the_names_and_its_help_exits_0():
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  listed = subprocess.run(
    [sys.executable, "-m", "hyperbolic_vl.convert", "--list"],
    cwd=REPO,
    env=env,
    capture_output=True,
    text=True,
    timeout=120,
  )
  lines = listed.stdout.splitlines()
  assert listed.returncode == 0, listed.stderr
  assert [line.split()[0] for line in lines] == list(releases.RELEASES)
  assert lines[0].split()[:2] == ["meru_vit_s", "ViT-S/16"]
  helped = subprocess.run(
    [sys.executable, "-m", "hyperbolic_vl.convert", "--help"],
    cwd=REPO,
    env=env,
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert helped.returncode == 0, helped.stderr
  assert helped.stdout.startswith("Released PyTorch checkpoint -> run directory")
  assert "--list" in helped.stdout
