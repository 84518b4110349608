"""Side by side: MERU-style torchvision input vs this package's grain input.

Both decode the same JPEG folder and apply RandomResizedCrop(224, scale
(0.5, 1), bicubic). The torch side is a 2-worker DataLoader over
torchvision transforms + ToTensor (MERU's training pipeline style); ours is
the image_text_csv training iterator. The two are measured alternately for
several rounds (the machine may be shared) and medians printed.

  pip install -e '.[bench]'
  python benchmarks/meru_torch_input.py --csv=CSV --images=DIR \
    --image_column=image_url --caption_column=captions
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import ml_collections
import torch
from PIL import Image
from torchvision import transforms

from hyperbolic_vl.data import registry as data_registry
from hyperbolic_vl.data import tokenizer as tokenizer_lib


class _Folder(torch.utils.data.Dataset):
  """The folder's images, listed `repeats` times so that one DataLoader
  iterator (one set of workers) serves every timed batch."""

  def __init__(self, folder: str, repeats: int = 1):
    self.paths = sorted(os.path.join(folder, f) for f in os.listdir(folder)) * repeats
    self.transform = transforms.Compose(
      [
        transforms.RandomResizedCrop(
          224, scale=(0.5, 1.0), interpolation=transforms.InterpolationMode.BICUBIC
        ),
        transforms.ToTensor(),
      ]
    )

  def __len__(self):
    return len(self.paths)

  def __getitem__(self, index):
    with Image.open(self.paths[index]) as image:
      return self.transform(image.convert("RGB"))


def torch_images_per_sec(folder: str, batch_size: int, batches: int) -> float:
  files = len(os.listdir(folder))
  loader = torch.utils.data.DataLoader(
    _Folder(folder, repeats=(batches + 2) * batch_size // max(files, 1) + 1),
    batch_size=batch_size,
    shuffle=True,
    num_workers=2,
    drop_last=True,
    persistent_workers=False,
  )
  iterator = iter(loader)
  next(iterator)  # worker start-up is not timed
  start, images = time.perf_counter(), 0
  for _ in range(batches):
    images += len(next(iterator))
  return images / (time.perf_counter() - start)


def ours_images_per_sec(args, batch_size: int, batches: int) -> float:
  config = ml_collections.ConfigDict(
    dict(
      batch_size=batch_size,
      image_size=224,
      num_threads=args.num_threads,
      num_workers=args.num_workers,
      prefetch_batches=2,
      data=dict(
        name="image_text_csv",
        path=args.csv,
        image_root=args.images,
        image_column=args.image_column,
        caption_column=args.caption_column,
      ),
    )
  )
  tokenizer = tokenizer_lib.world_tokenizer(context_length=32)
  iterator = data_registry.make_train_iterator(
    config, tokenizer, seed=0, process_index=0, process_count=1
  )
  next(iterator)
  start, images = time.perf_counter(), 0
  for _ in range(batches):
    images += len(next(iterator)["image"])
  return images / (time.perf_counter() - start)


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--csv", required=True)
  parser.add_argument("--images", required=True)
  parser.add_argument("--image_column", default="image")
  parser.add_argument("--caption_column", default="caption")
  parser.add_argument("--batch_size", type=int, default=32)
  parser.add_argument("--batches", type=int, default=20)
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--num_threads", type=int, default=2)
  parser.add_argument("--num_workers", type=int, default=0)
  args = parser.parse_args()
  # Both sides read the same files: read them once first so that neither
  # side's first round pays for a cold page cache.
  for name in os.listdir(args.images):
    with open(os.path.join(args.images, name), "rb") as f:
      f.read()
  torch_rates, our_rates = [], []
  for round_number in range(args.rounds):
    torch_rates.append(torch_images_per_sec(args.images, args.batch_size, args.batches))
    our_rates.append(ours_images_per_sec(args, args.batch_size, args.batches))
    print(
      f"round {round_number}: torchvision {torch_rates[-1]:.1f} images/s, "
      f"ours {our_rates[-1]:.1f} images/s",
      flush=True,
    )
  torch_median, our_median = statistics.median(torch_rates), statistics.median(our_rates)
  print(f"median torchvision (2-worker DataLoader): {torch_median:.1f} images/s")
  print(f"median ours (grain): {our_median:.1f} images/s")
  print(f"ratio ours / torchvision: {our_median / torch_median:.2f}")
  print(f"load average: {os.getloadavg()}")


if __name__ == "__main__":
  main()
