"""The released checkpoints the converters read, by name: data only.

One `Release` per released weight file: where it is downloaded from (the
address its release gives, read from the release's own README, model card
or loading code, with the place it was read in `address_from`), its size
and SHA-256 where the release publishes them, the `convert --source` and
config variant it maps to, its license, and the figures its paper (or, where
no paper table was in reach, its README) prints for it. `pretrained.py`
downloads, checks, converts and caches by this table;
`benchmarks/release_table.py --pretrained=NAME` prints our figures beside
`paper`. docs/interop.md renders it as a table.

What the table does not know it leaves empty and says why in `note`:
- `size` / `sha256`: no release of this family publishes either, except
  OpenAI's CLIP, whose addresses carry the file's SHA-256 (OpenAI's own
  loader checks it). Without one, a Hugging Face download is checked
  against the SHA-256 and size the hub states when it serves the file
  (release_files.py), any other against the server's Content-Length, and its
  SHA-256 is printed so that a user can pin it.
- `weights.url`: ATMG shares Google Drive folders (no file address a plain
  download can follow), PHyCLIP has released no weights, and the Hugging
  Face copy of OpenAI's CLIP (the `hf_clip` layout) names no file in any
  release read here. Such an entry converts a file the user passes with
  `--checkpoint=FILE`.

Hugging Face addresses are the hub's `resolve` addresses of the file the
release names (its `blob` page, or `hf_hub_download(repo, file)` in its
code); `hub` keeps (repository, file) so the `HF_ENDPOINT` mirror setting
the hub's own client reads is honoured (release_files.py).
"""

from __future__ import annotations

import dataclasses

# Where each release's addresses were read (repository at the commit read).
MERU_README = "facebookresearch/meru README.md (commit 6d44300, 2023-08-23)"
HYCOCLIP_ZOO = "PalAvik/hycoclip model-zoo.md (commit 08bb05b, 2025-01-25)"
UNCHA_README = "jeeit17/UNCHA README.md, Pretrained models (commit b9aa27d, 2026-04-12)"
HYSAC_CODE = (
  "aimagelab/HySAC README.md (model aimagelab/HySAC) and hysac/models.py "
  "HySAC.from_pretrained: hf_hub_download(repo_id, 'hysac_model.pth' / 'hysac_bounds.json') "
  "(commit e2ba79f, 2025-04-08)"
)
ATMG_README = "samgregoost/atmg README.md, Pretrained checkpoints (commit e9f9df3, 2024-10-26)"
PHYCLIP_README = "tksmatsubara/PHyCLIP README.md (commit 0bf13d6, 2026-02-25)"
OPENAI_CODE = "openai/CLIP clip/clip.py _MODELS (commit d05afc4, 2026-03-25)"
HAC_README = "fdibiton/HAC README.md, Pre-trained Models (commit 99d6c52)"

CC_BY_NC = "CC BY-NC 4.0"
MERU_PAPER = "Desai et al., Hyperbolic Image-Text Representations, ICML 2023"
ATMG_PAPER = "Ramasinghe et al., Accept the Modality Gap, CVPR 2024"


@dataclasses.dataclass(frozen=True)
class Download:
  """One released file. `url` None: the release gives no address a plain
  download can follow (the entry's note says why)."""

  filename: str
  url: str | None
  size: int | None = None
  sha256: str | None = None
  hub: tuple[str, str] | None = None  # (Hugging Face repository, file)


@dataclasses.dataclass(frozen=True)
class PaperFigure:
  """A figure the paper prints for this release, in percent, under the
  figure name our evaluators write (docs/evaluation.md). ImageNet's figure
  is `top1_mean_per_class`, the metric of MERU's evaluation code, which each
  later release reuses; its validation set holds 50 images of every class,
  so plain top-1 is the same number."""

  figure: str
  value: float
  where: str  # "Table 2" of `Release.paper`, or the README section


@dataclasses.dataclass(frozen=True)
class Release:
  name: str
  title: str
  weights: Download
  source: str  # python -m hyperbolic_vl.convert --source
  config: str  # the target config, file:variant as --config takes it
  license: str
  address_from: str
  paper: str = ""
  figures: tuple[PaperFigure, ...] = ()
  suite: str = "meru"  # python -m hyperbolic_vl.evaluate --suite of its paper's tables
  bounds: Download | None = None  # HySAC's hysac_bounds.json (convert --bounds)
  overrides: tuple[str, ...] = ()  # config KEY=VALUE (tests' shrunk models only)
  note: str = ""


def _hf(repo: str, filename: str) -> Download:
  return Download(
    filename, f"https://huggingface.co/{repo}/resolve/main/{filename}", hub=(repo, filename)
  )


def _meru_figures(imagenet, coco_t2i, flickr_t2i, coco_i2t, flickr_i2t) -> tuple:
  """MERU's Table 2 (ImageNet zero-shot, top-1 mean per class as its
  appendix says it reports) and Table 1 (recall@5, COCO and Flickr30K)."""
  return (
    PaperFigure("zero_shot/imagenet/top1_mean_per_class", imagenet, "Table 2"),
    PaperFigure("retrieval/coco/t2i_recall@5", coco_t2i, "Table 1"),
    PaperFigure("retrieval/flickr30k/t2i_recall@5", flickr_t2i, "Table 1"),
    PaperFigure("retrieval/coco/i2t_recall@5", coco_i2t, "Table 1"),
    PaperFigure("retrieval/flickr30k/i2t_recall@5", flickr_i2t, "Table 1"),
  )


def _meru(kind: str, size: str, figures: tuple) -> Release:
  filename = f"{kind}_vit_{size}.pth"
  return Release(
    name=f"{kind}_vit_{size}",
    title=f"{'MERU' if kind == 'meru' else 'CLIP'} ViT-{size.upper()}/16 (RedCaps, MERU's release)",
    weights=Download(filename, f"https://dl.fbaipublicfiles.com/meru/{filename}"),
    source="meru",
    config=f"configs/{kind}.py:vit_{size}",
    license=CC_BY_NC,
    address_from=MERU_README,
    paper=MERU_PAPER,
    figures=figures,
  )


def _grit_figures(imagenet, coco_text, coco_image) -> tuple:
  """The model zoo's columns: ImageNet zero-shot accuracy, COCO zero-shot
  text retrieval (image -> text) and image retrieval (text -> image) R@10."""
  return (
    PaperFigure("zero_shot/imagenet/top1_mean_per_class", imagenet, "model-zoo.md"),
    PaperFigure("retrieval/coco/i2t_recall@10", coco_text, "model-zoo.md"),
    PaperFigure("retrieval/coco/t2i_recall@10", coco_image, "model-zoo.md"),
  )


def _hycoclip(kind: str, size: str, figures: tuple) -> Release:
  filename = f"{kind}_vit_{size}.pth"
  titles = {"hycoclip": "HyCoCLIP", "meru": "MERU", "clip": "CLIP"}
  return Release(
    name=f"hycoclip_vit_{size}" if kind == "hycoclip" else f"{kind}_vit_{size}_grit",
    title=f"{titles[kind]} ViT-{size.upper()}/16 (GRIT, HyCoCLIP's release)",
    weights=_hf("avik-pal/hycoclip", filename),
    source="meru",
    config=f"configs/{kind}.py:vit_{size}",
    license=CC_BY_NC,
    address_from=HYCOCLIP_ZOO,
    paper="Pal et al., Compositional Entailment Learning for Hyperbolic VLMs, ICLR 2025",
    figures=figures,
    note="" if kind == "hycoclip" else "a baseline released with HyCoCLIP, trained on GRIT",
  )


def _uncha(size: str, imagenet, coco_text, coco_image) -> Release:
  filename = f"uncha_vit_{size}.pth"
  return Release(
    name=f"uncha_vit_{size}",
    title=f"UNCHA ViT-{size.upper()}/16 (GRIT)",
    weights=Download(
      filename,
      f"https://huggingface.co/hayeonkim/uncha/resolve/main/{filename}?download=true",
      hub=("hayeonkim/uncha", filename),
    ),
    source="uncha",
    config=f"configs/uncha.py:vit_{size}",
    license=CC_BY_NC,
    address_from=UNCHA_README,
    paper="Kim et al., UNCHA, CVPR 2026",
    figures=(
      PaperFigure("zero_shot/imagenet/top1_mean_per_class", imagenet, "README, Pretrained models"),
      PaperFigure("retrieval/coco/i2t_recall@1", coco_text, "README, Pretrained models"),
      PaperFigure("retrieval/coco/t2i_recall@1", coco_image, "README, Pretrained models"),
    ),
    suite="uncha",
    note="README columns 'COCO R@1 (Text)' / '(Image)' read as text / image retrieval",
  )


def _atmg(size: str, folder: str, figures: tuple) -> Release:
  return Release(
    name=f"atmg_vit_{size}",
    title=f"ATMG ViT-{size.upper()}/16 (RedCaps)",
    weights=Download(f"atmg_vit_{size}.pth", None),
    source="meru",
    config=f"configs/atmg.py:vit_{size}",
    license="not stated (the repository has no license file)",
    address_from=ATMG_README,
    paper=ATMG_PAPER,
    figures=figures,
    note=(
      f"the README links a Google Drive folder ({folder}), not a file: download it by hand "
      "and pass --checkpoint=FILE"
    ),
  )


def _openai(variant: str, digest: str, filename: str, title: str) -> Release:
  return Release(
    name=f"openai_clip_{variant}",
    title=f"OpenAI CLIP {title}",
    weights=Download(
      filename,
      f"https://openaipublic.azureedge.net/clip/models/{digest}/{filename}",
      sha256=digest,
    ),
    source="open_clip",
    config=f"configs/clip.py:openai_{variant}",
    license="MIT (openai/CLIP)",
    address_from=OPENAI_CODE,
    paper="Radford et al., Learning Transferable Visual Models From Natural Language Supervision",
    suite="meru",
    note="the address carries the file's SHA-256; the CLIP paper's tables are not recorded here",
  )


_ENTRIES = (
  _meru("meru", "s", _meru_figures(34.4, 30.5, 37.1, 39.0, 43.5)),
  _meru("meru", "b", _meru_figures(37.5, 33.2, 41.1, 41.8, 48.1)),
  _meru("meru", "l", _meru_figures(38.8, 32.6, 39.6, 41.9, 50.3)),
  _meru("clip", "s", _meru_figures(34.3, 29.9, 35.3, 37.5, 42.1)),
  _meru("clip", "b", _meru_figures(37.9, 32.9, 40.3, 41.4, 50.2)),
  _meru("clip", "l", _meru_figures(38.4, 31.7, 39.0, 40.6, 47.8)),
  _hycoclip("hycoclip", "s", _grit_figures(41.7, 79.5, 66.6)),
  _hycoclip("hycoclip", "b", _grit_figures(45.8, 82.0, 69.3)),
  _hycoclip("meru", "s", _grit_figures(35.4, 78.8, 65.3)),
  _hycoclip("meru", "b", _grit_figures(40.1, 82.0, 68.6)),
  _hycoclip("clip", "s", _grit_figures(36.7, 79.1, 65.2)),
  _hycoclip("clip", "b", _grit_figures(40.6, 81.5, 68.5)),
  _uncha("s", 43.9, 69.9, 56.2),
  _uncha("b", 48.8, 72.7, 60.0),
  Release(
    name="hysac_vit_l",
    title="HySAC ViT-L/14 (OpenAI CLIP + LoRA, ViSU)",
    weights=_hf("aimagelab/HySAC", "hysac_model.pth"),
    bounds=_hf("aimagelab/HySAC", "hysac_bounds.json"),
    source="hysac",
    config="configs/hysac.py:vit_l14",
    license="not stated in the repository (no license file)",
    address_from=HYSAC_CODE,
    paper="Poppi et al., Hyperbolic Safety-Aware Vision-Language Models, CVPR 2025",
    note="no paper table in reach here: no figures recorded",
  ),
  # ATMG's Table 1 / 7: ImageNet zero-shot top-1; Table 2 / 8: recall@5.
  _atmg(
    "s",
    "https://drive.google.com/drive/folders/1n54yl6IPZRexw2wE0dqUbQWI7IrpsMvB",
    (
      PaperFigure("zero_shot/imagenet/top1_mean_per_class", 29.7, "Table 1"),
      PaperFigure("retrieval/coco/t2i_recall@5", 23.7, "Table 2"),
      PaperFigure("retrieval/flickr30k/t2i_recall@5", 33.2, "Table 2"),
      PaperFigure("retrieval/coco/i2t_recall@5", 32.6, "Table 2"),
      PaperFigure("retrieval/flickr30k/i2t_recall@5", 30.7, "Table 2"),
    ),
  ),
  _atmg(
    "b",
    "https://drive.google.com/drive/folders/1uS0t_tODBGSJg7fYZjalwA3jHNPkCgiJ",
    (
      PaperFigure("zero_shot/imagenet/top1_mean_per_class", 31.1, "Table 7"),
      PaperFigure("retrieval/coco/t2i_recall@5", 25.1, "Table 8"),
      PaperFigure("retrieval/flickr30k/t2i_recall@5", 34.6, "Table 8"),
      PaperFigure("retrieval/coco/i2t_recall@5", 28.7, "Table 8"),
      PaperFigure("retrieval/flickr30k/i2t_recall@5", 38.9, "Table 8"),
    ),
  ),
  Release(
    name="phyclip_vit_b",
    title="PHyCLIP ViT-B/16 (GRIT)",
    weights=Download("phyclip_vit_b.pth", None),
    source="meru",
    config="configs/phyclip.py:vit_b",
    license=CC_BY_NC,
    address_from=PHYCLIP_README,
    paper="Yoshikawa and Matsubara, PHyCLIP, ICLR 2026",
    suite="phyclip",
    note=(
      "no weights released: the README evaluates checkpoints/phyclip_vit_b.pth but gives no "
      "address; a file of its layout converts with --checkpoint=FILE"
    ),
  ),
  Release(
    name="hac_vit_b_lora",
    title="HAC-B w/ LoRA (HyCoCLIP's CLIP ViT-B/16 adapted on GRIT)",
    weights=_hf("fdibiton/HAC", "hac_vit_b_lora.pth"),
    source="hac",
    config="configs/hac.py:vit_b",
    license=CC_BY_NC,
    address_from=HAC_README,
    paper="Dibitonto, Beyan and Murino, HAC, ICPR 2026 (arXiv 2604.23665)",
    note=(
      "no checksum published: the hub's SHA-256 at download is checked (release_files.py); "
      "the paper's VQA table is not recorded here (docs/methods/hac.md)"
    ),
  ),
  _openai(
    "vit_b32",
    "40d365715913c9da98579312b702a82c18be219cc2a73407c4526f58eba950af",
    "ViT-B-32.pt",
    "ViT-B/32",
  ),
  _openai(
    "vit_b16",
    "5806e77cd80f8b59890b7e101eabd078d9fb84e6937f9e85e4ecb61988df416f",
    "ViT-B-16.pt",
    "ViT-B/16",
  ),
  _openai(
    "vit_l14",
    "b8cca3fd41ae0c99ba7e8951adf17d267cdb84cd88be6f7c2e0eca1737a03836",
    "ViT-L-14.pt",
    "ViT-L/14",
  ),
  Release(
    name="hf_openai_clip_vit_b32",
    title="OpenAI CLIP ViT-B/32 as a Hugging Face CLIPModel",
    weights=Download("model.safetensors", None),
    source="hf_clip",
    config="configs/clip.py:openai_vit_b32",
    license="MIT (openai/CLIP)",
    address_from="no release read here names the file (hub repository openai/clip-vit-base-patch32)",
    note=(
      "the hub's file list could not be read from here, so no address is recorded: download "
      "openai/clip-vit-base-patch32's weights and pass --checkpoint=FILE"
    ),
  ),
)

# name -> Release. Tests point an entry at their own server by replacing it
# (pytest's monkeypatch.setitem), which undoes itself after the test.
RELEASES: dict[str, Release] = {release.name: release for release in _ENTRIES}
