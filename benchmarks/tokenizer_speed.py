"""Captions/s and tokens/s of clip_bpe against open_clip's tokenizer.

    python benchmarks/tokenizer_speed.py --csv=PATH/hierarcaps_test_sample.csv [--repeats=20]

Both tokenizers see the same captions (every tier of every row) in the same
order; each is timed cold (a fresh tokenizer, empty word cache) and warm (the
second pass), in alternating rounds. open_clip is optional (pip install
open_clip_torch); without it only ours is timed.
"""

import argparse
import csv
import statistics
import time

from hyperbolic_vl.data import clip_bpe


def captions(path: str) -> list[str]:
  with open(path) as f:
    return [t for row in csv.DictReader(f) for t in row["captions"].split(" => ")]


def timed(fn, texts) -> float:
  start = time.perf_counter()
  fn(texts)
  return time.perf_counter() - start


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--csv", required=True)
  parser.add_argument("--repeats", type=int, default=20)
  args = parser.parse_args()
  texts = captions(args.csv) * args.repeats
  ours = clip_bpe.ClipBpeTokenizer()
  num_tokens = int((ours.encode(texts) > 0).sum())
  contenders = {"clip_bpe (ours)": lambda: clip_bpe.ClipBpeTokenizer().encode}
  try:
    import open_clip

    contenders["open_clip"] = lambda: open_clip.get_tokenizer("ViT-B-32")
  except ImportError:
    print("open_clip not installed: timing ours only")
  times = {name: {"cold": [], "warm": []} for name in contenders}
  for _ in range(3):
    for name, make in contenders.items():
      encode = make()
      times[name]["cold"].append(timed(encode, texts))
      times[name]["warm"].append(timed(encode, texts))
  print(f"{len(texts)} captions, {num_tokens} tokens (with SOT/EOT), median of 3 rounds")
  for name, runs in times.items():
    for kind in ("cold", "warm"):
      seconds = statistics.median(runs[kind])
      print(
        f"{name:16s} {kind}: {len(texts) / seconds:10.0f} captions/s "
        f"{num_tokens / seconds:11.0f} tokens/s"
      )
  if len(times) == 2:
    for kind in ("cold", "warm"):
      ratio = statistics.median(times["open_clip"][kind]) / statistics.median(
        times["clip_bpe (ours)"][kind]
      )
      print(f"speed ratio ours / open_clip ({kind}): {ratio:.2f}x")


if __name__ == "__main__":
  main()
