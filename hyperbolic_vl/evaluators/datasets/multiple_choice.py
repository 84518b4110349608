"""Multiple-choice VQA benchmarks read from their published files.

Seven benchmarks (HAC's zero-shot VQA suite, Dibitonto et al. 2026), each in
the layout its Hugging Face dataset repository publishes (`BENCHMARKS`
names the repository) and in HAC's processed layout (`<NAME>_ann.json`, a
list of {"index", "question", "options": {"A": ...}, "answer",
"image_path"[, "category"]}, beside an `images/` folder; VMCBench as one
such folder per category), which HAC's `scripts/vqa/*.py` write:

  ai2d         lmms-lab/ai2d: data/test-*.parquet; question, options
               (list), answer (the right option's position as text), image
  aokvqa       HuggingFaceM4/A-OKVQA: data/<split>-*.parquet; question,
               choices, correct_choice_idx (null in the test split),
               question_id, image
  mmstar       Lin-Chen/MMStar: mmstar.parquet; index, question (the
               options inline: "Options: A: ..., B: ..." or "Choices:\n(A)
               ..."), answer (a letter), category, image
  realworldqa  xai-org/RealworldQA: data/test-*.parquet; question (options
               inline, one per line: "A. ..."), answer (a letter or the
               option's text), image; only the multiple-choice questions
  scienceqa    derek-thomas/ScienceQA: data/<split>-*.parquet; question,
               choices, answer (position), image (null for text-only
               questions, which are left out as HAC does)
  seedbench    lmms-lab/SEED-Bench: data/test-*.parquet; question,
               choice_a..choice_d, answer (a letter), data_type, image (a
               list of images); or AILab-CVC/SEED-Bench's SEED-Bench.json
               ({"questions": [...]}, the same fields plus data_id) with the
               SEED-Bench-image/ folder; image questions only
  vmcbench     suyc21/VMCBench: data/<split>-*.parquet; index, question, A,
               B, C, D, answer (empty in the test split), category, image

Questions and the parsing of their options: `vqa_questions.py`. Reading
never decodes an image: `ImageReader` does, a batch at a time, when
the evaluator embeds. A file that lacks a column is refused in one line
(errors.DataError); a question that cannot be scored (an answer outside its
options, options that cannot be parsed) is left out and counted
(`LeftOut`), as the other benchmark readers do with a bad sample. Parquet is
read with pyarrow (installed with tensorflow-datasets), imported only when a
parquet file is read.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import glob
import io
import json
import os
import re
from collections.abc import Callable

import numpy as np
from PIL import Image

from hyperbolic_vl import errors
from hyperbolic_vl.evaluators import EvaluatorUnavailable
from hyperbolic_vl.evaluators.datasets import images as image_files
from hyperbolic_vl.evaluators.datasets.vqa_questions import (
  REALWORLDQA_MULTIPLE_CHOICE,
  BadQuestion,
  ImageRef,
  LeftOut,
  Question,
  letter_position,
  mmstar_question,
  options_of,
  position,
  realworldqa_answer,
  realworldqa_question,
)


# -- HAC's processed layout -----------------------------------------------------
def read_processed(ann_path: str, left_out: LeftOut, category: str = "") -> list[Question]:
  """A `<NAME>_ann.json` and its `images/` folder."""
  try:
    with open(ann_path, encoding="utf-8") as f:
      entries = json.load(f)
  except json.JSONDecodeError as error:
    raise errors.DataError(f"{ann_path} is not JSON: {error}") from None
  if not isinstance(entries, list):
    raise errors.DataError(
      f"{ann_path}: expected a list of questions, got {type(entries).__name__}"
    )
  images_dir = os.path.join(os.path.dirname(ann_path), "images")
  questions = []
  for row, entry in enumerate(entries):
    missing = [k for k in ("question", "options", "image_path") if k not in entry]
    if missing or not isinstance(entry.get("options"), dict):
      raise errors.DataError(
        f"{ann_path}: question {row} lacks {missing or ['options as an object']}; "
        "HAC's layout has question, options {A: ...}, answer, image_path"
      )
    try:
      options = options_of(entry["options"].values())
      letters = list(entry["options"])[: len(options)]
      answer = entry.get("answer")
      known = answer is not None and str(answer).strip() != ""
      answer_position = letters.index(str(answer).strip()) if known else None
    except BadQuestion as bad:
      left_out.add(bad.reason, f"{os.path.basename(ann_path)} question {row}: {bad}")
      continue
    except ValueError:
      left_out.add(
        "answer outside the options",
        f"{os.path.basename(ann_path)} question {row}: answer {answer!r} for options {letters}",
      )
      continue
    questions.append(
      Question(
        index=str(entry.get("index", row)),
        question=str(entry["question"]).strip(),
        options=options,
        answer=answer_position,
        image=ImageRef(path=os.path.join(images_dir, str(entry["image_path"]))),
        category=str(entry.get("category", "") or category),
      )
    )
  return questions


def processed_files(path: str) -> list[tuple[str, str]]:
  """[(ann.json, category)] of HAC's layout at `path`: its own
  `<NAME>_ann.json`, else one per sub-folder (VMCBench's categories)."""
  if os.path.isfile(path):
    return [(path, "")] if path.endswith("_ann.json") else []
  own = sorted(glob.glob(os.path.join(path, "*_ann.json")))
  if len(own) > 1:
    named = os.path.join(path, os.path.basename(os.path.normpath(path)) + "_ann.json")
    if named not in own:
      raise errors.DataError(f"{path} holds several annotation files {own}; keep one")
    own = [named]
  if own:
    return [(own[0], "")]
  return [
    (ann, os.path.basename(os.path.dirname(ann)))
    for ann in sorted(glob.glob(os.path.join(path, "*", "*_ann.json")))
  ]


# -- the Hub's parquet files ----------------------------------------------------
def _pyarrow_parquet():
  try:
    import pyarrow.parquet as pq
  except ImportError as error:
    raise EvaluatorUnavailable(f"reading parquet needs pyarrow: {error}") from None
  return pq


def parquet_files(path: str, split: str) -> list[str]:
  """The parquet files of `split` under a Hub snapshot folder (named
  "<split>-*.parquet", or in a folder named `split`); every one when split
  is ""; `path` itself when it is a file."""
  if os.path.isfile(path):
    return [path]
  found = sorted(glob.glob(os.path.join(path, "**", "*.parquet"), recursive=True))
  if not split:
    return found

  def of_split(file: str) -> bool:
    parts = os.path.relpath(file, path).split(os.sep)
    return split in parts[:-1] or re.match(rf"{re.escape(split)}[-_.]", parts[-1]) is not None

  chosen = [f for f in found if of_split(f)]
  if found and not chosen:
    names = [os.path.relpath(f, path) for f in found]
    raise errors.DataError(f"{path}: no parquet file of split {split!r} among {names}")
  return chosen


def parquet_rows(file: str, required: tuple[str, ...], optional: tuple[str, ...], layout: str):
  """[(row number, {column: value})] of the text columns (the image column
  is read later, by ImageReader); DataError naming a missing column."""
  pq = _pyarrow_parquet()
  try:
    names = pq.read_schema(file).names
  except Exception as error:  # pyarrow's own error types: not a parquet file
    raise errors.DataError(f"{file} is not a parquet file ({error})") from None
  missing = [c for c in required if c not in names]
  if missing:
    raise errors.DataError(f"{file} lacks column(s) {missing}; expected {layout}")
  columns = [c for c in required + optional if c in names and c != "image"]
  return list(enumerate(pq.read_table(file, columns=columns).to_pylist()))


@dataclasses.dataclass(frozen=True)
class ParquetLayout:
  """A benchmark's parquet columns and how a row becomes a Question
  (`convert(row, ref) -> Question`, raising BadQuestion)."""

  required: tuple[str, ...]
  optional: tuple[str, ...]
  convert: Callable[[dict, ImageRef, str], Question]
  keep: Callable[[dict], str] = lambda row: ""  # a reason to leave the row out, or ""

  def describe(self, repository: str) -> str:
    return f"{repository}'s parquet columns {', '.join(self.required)}"


def read_parquet(
  files: list[str], layout: ParquetLayout, repository: str, left_out: LeftOut
) -> list[Question]:
  questions, offset = [], 0
  for file in files:
    rows = parquet_rows(file, layout.required, layout.optional, layout.describe(repository))
    for row, values in rows:
      name = f"{os.path.basename(file)} row {row}"
      reason = layout.keep(values)
      if reason:
        left_out.add(reason, name)
        continue
      try:
        questions.append(layout.convert(values, ImageRef(parquet=file, row=row), str(offset + row)))
      except BadQuestion as bad:
        left_out.add(bad.reason, f"{name}: {bad}")
    offset += len(rows)
  return questions


def _ai2d(row, ref, number):
  options = options_of(row["options"])
  return Question(
    number, row["question"].strip(), options, position(row["answer"], len(options)), ref
  )


def _aokvqa(row, ref, number):
  options = options_of(row["choices"])
  answer = row["correct_choice_idx"]
  answer = None if answer is None else position(answer, len(options))
  return Question(
    str(row.get("question_id") or number), row["question"].strip(), options, answer, ref
  )


def _mmstar(row, ref, number):
  question, options = mmstar_question(row["question"])
  answer = letter_position(row["answer"], len(options))
  index = str(row.get("index", number))
  return Question(index, question, options, answer, ref, str(row.get("category") or ""))


def _realworldqa(row, ref, number):
  question, options = realworldqa_question(row["question"])
  return Question(number, question, options, realworldqa_answer(row["answer"], options), ref)


def _scienceqa(row, ref, number):
  options = options_of(row["choices"])
  return Question(
    number, row["question"].strip(), options, position(row["answer"], len(options)), ref
  )


def _seedbench(row, ref, number):
  options = options_of([row[f"choice_{c}"] for c in "abcd"])
  answer = letter_position(row["answer"], len(options))
  return Question(
    str(row.get("question_id") or number), row["question"].strip(), options, answer, ref
  )


def _vmcbench(row, ref, number):
  options = options_of([row[c] for c in "ABCD"])
  known = row["answer"] is not None and str(row["answer"]).strip() != ""
  answer = letter_position(row["answer"], len(options)) if known else None
  index = str(row.get("index", number))
  return Question(index, row["question"].strip(), options, answer, ref, str(row["category"] or ""))


def _realworldqa_keep(row) -> str:
  return "" if REALWORLDQA_MULTIPLE_CHOICE in row["question"] else "not multiple-choice"


def _seedbench_keep(row) -> str:
  kind = row.get("data_type") or "image"
  return "" if kind == "image" else f"{kind} question"


PARQUET_LAYOUTS = {
  "ai2d": ParquetLayout(("question", "options", "answer", "image"), (), _ai2d),
  "aokvqa": ParquetLayout(
    ("question", "choices", "correct_choice_idx", "image"), ("question_id",), _aokvqa
  ),
  "mmstar": ParquetLayout(("question", "answer", "image"), ("index", "category"), _mmstar),
  "realworldqa": ParquetLayout(
    ("question", "answer", "image"), (), _realworldqa, _realworldqa_keep
  ),
  "scienceqa": ParquetLayout(("question", "choices", "answer", "image"), (), _scienceqa),
  "seedbench": ParquetLayout(
    ("question", "choice_a", "choice_b", "choice_c", "choice_d", "answer", "image"),
    ("question_id", "data_type"),
    _seedbench,
    _seedbench_keep,
  ),
  "vmcbench": ParquetLayout(
    ("question", "A", "B", "C", "D", "answer", "category", "image"), ("index",), _vmcbench
  ),
}


def read_seedbench_json(json_path: str, image_root: str, left_out: LeftOut) -> list[Question]:
  """AILab-CVC/SEED-Bench's SEED-Bench.json; images `<image_root>/<data_id>`
  (default: SEED-Bench-image/ beside the file)."""
  image_root = image_root or os.path.join(os.path.dirname(json_path), "SEED-Bench-image")
  try:
    with open(json_path, encoding="utf-8") as f:
      entries = json.load(f)["questions"]
  except (json.JSONDecodeError, KeyError, TypeError) as error:
    raise errors.DataError(
      f"{json_path}: expected SEED-Bench's {{'questions': [...]}} ({type(error).__name__})"
    ) from None
  layout = PARQUET_LAYOUTS["seedbench"]
  questions = []
  for row, entry in enumerate(entries):
    missing = [c for c in (*layout.required[:-1], "data_id") if c not in entry]
    if missing:
      raise errors.DataError(f"{json_path}: question {row} lacks {missing}")
    reason = layout.keep(entry)
    if reason:
      left_out.add(reason, f"{os.path.basename(json_path)} question {row}")
      continue
    ref = ImageRef(path=os.path.join(image_root, str(entry["data_id"])))
    try:
      questions.append(layout.convert(entry, ref, str(row)))
    except BadQuestion as bad:
      left_out.add(bad.reason, f"{os.path.basename(json_path)} question {row}: {bad}")
  return questions


# -- images ---------------------------------------------------------------------
class UndecodableImage(ValueError):
  pass


def image_bytes(cell, parquet_dir: str) -> bytes:
  """The encoded image of a parquet cell: an image struct {bytes, path}
  (path alone: a file beside the parquet), raw bytes, base64 text, or a
  list of those (SEED-Bench's frames; the first)."""
  if isinstance(cell, list):
    cell = cell[0] if cell else None
  if isinstance(cell, dict):
    if cell.get("bytes"):
      return cell["bytes"]
    path = cell.get("path") or ""
    if path and os.path.isfile(os.path.join(parquet_dir, path)):
      with open(os.path.join(parquet_dir, path), "rb") as f:
        return f.read()
    raise UndecodableImage("no image")
  if isinstance(cell, (bytes, bytearray)):
    return bytes(cell)
  if isinstance(cell, str) and cell:
    try:
      return base64.b64decode(re.sub(r"^data:image/[^;]+;base64,", "", cell.strip()))
    except (binascii.Error, ValueError):
      raise UndecodableImage("image text is not base64") from None
  raise UndecodableImage("no image")


class ImageReader:
  """Decodes questions' images at the model's resolution; reads one parquet
  file's image column at a time (questions come in file order)."""

  def __init__(self, size: int, mode: str):
    self.size, self.mode = size, mode
    self._file, self._cells = "", None

  def _cell(self, ref: ImageRef):
    if ref.parquet != self._file:
      pq = _pyarrow_parquet()
      self._cells = pq.read_table(ref.parquet, columns=[ref.column]).column(ref.column)
      self._file = ref.parquet
    return self._cells[ref.row].as_py()

  def encoded(self, ref: ImageRef) -> bytes:
    """The encoded image (read on the calling thread: parquet reads are not
    shared across threads)."""
    if ref.path:
      if not os.path.isfile(ref.path):
        raise UndecodableImage(f"no image file {ref.path}")
      with open(ref.path, "rb") as f:
        return f.read()
    return image_bytes(self._cell(ref), os.path.dirname(ref.parquet))

  def decode(self, encoded: bytes) -> np.ndarray:
    try:
      with Image.open(io.BytesIO(encoded)) as image:
        pixels = np.asarray(image.convert("RGB"))
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as error:
      raise UndecodableImage(f"image does not decode ({type(error).__name__})") from None
    return image_files.resize_image(pixels, self.size, self.mode)


# -- the seven benchmarks -------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Benchmark:
  """name: the key in settings and figures; group: HAC's category
  (scripts' configs eval_vqa_{general,reasoning,ocr}.py), "" for VMCBench,
  whose questions are grouped by their own category; split: the split read
  by default (all parquet files for "")."""

  name: str
  title: str
  repository: str
  group: str
  split: str


BENCHMARKS = {
  b.name: b
  for b in (
    Benchmark("ai2d", "AI2D", "lmms-lab/ai2d", "ocr", "test"),
    Benchmark("aokvqa", "A-OKVQA", "HuggingFaceM4/A-OKVQA", "general", "validation"),
    Benchmark("mmstar", "MMStar", "Lin-Chen/MMStar", "general", ""),
    Benchmark("realworldqa", "RealWorldQA", "xai-org/RealworldQA", "reasoning", "test"),
    Benchmark("scienceqa", "ScienceQA", "derek-thomas/ScienceQA", "reasoning", "test"),
    Benchmark("seedbench", "SEED-Bench", "lmms-lab/SEED-Bench", "general", "test"),
    Benchmark("vmcbench", "VMCBench", "suyc21/VMCBench", "", "dev"),
  )
}
GROUPS = ("general", "reasoning", "ocr")

# VMCBench's 20 source datasets (its `category` column, folded) by the four
# groups VMCBench reports: General, Reasoning, OCR and Doc&Chart (its dataset
# card's leaderboard, suyc21/VMCBench README; the grouping VMCBench's authors
# gave lmms-eval, lmms_eval/tasks/vmcbench/utils.py `datasets_category_map`,
# whose "doc" is Doc&Chart). Doc&Chart stays its own group, so that
# vmcbench/ocr is VMCBench's OCR column (TextVQA, OCRVQA) and not HAC's ocr
# group (AI2D, a Doc&Chart set here). HAC's release gives VMCBench no
# grouping: scripts/vqa/vmcbench.py writes one folder per `category`.
VMCBENCH_GROUPS = {
  **dict.fromkeys(
    ("seedbench", "mmstar", "aokvqa", "vizwiz", "mmvet", "vqav2", "okvqa"), "general"
  ),
  **dict.fromkeys(
    ("mmmu", "mathvista", "scienceqa", "realworldqa", "gqa", "mathvision"), "reasoning"
  ),
  **dict.fromkeys(("textvqa", "ocrvqa"), "ocr"),
  **dict.fromkeys(("ai2d", "chartqa", "docvqa", "infovqa", "tablevqabench"), "doc_chart"),
}


def folded(name: str) -> str:
  """ "A-OKVQA" -> "aokvqa": a folder or category name compared loosely."""
  return re.sub(r"[^a-z0-9]", "", name.lower())


def group_of(benchmark: str, question: Question) -> str:
  return BENCHMARKS[benchmark].group or VMCBENCH_GROUPS.get(folded(question.category), "")


def read_benchmark(
  name: str, path: str, split: str, image_root: str, left_out: LeftOut
) -> list[Question]:
  """The questions of benchmark `name` at `path` (a folder or a file), in
  HAC's processed layout when it holds `*_ann.json`, else the Hub's."""
  spec = BENCHMARKS[name]
  if not os.path.exists(path):
    raise EvaluatorUnavailable(f"{spec.title}: {path} does not exist")
  processed = processed_files(path)
  if processed:
    return [q for ann, category in processed for q in read_processed(ann, left_out, category)]
  if name == "seedbench":
    json_path = path if path.endswith(".json") else os.path.join(path, "SEED-Bench.json")
    if os.path.isfile(json_path):
      return read_seedbench_json(json_path, image_root, left_out)
  split = spec.split if split is None else split
  files = parquet_files(path, split)
  if not files:
    raise EvaluatorUnavailable(
      f"{spec.title}: no parquet file{f' of split {split!r}' if split else ''} and no "
      f"*_ann.json under {path}; download {spec.repository} (huggingface-cli download "
      f"{spec.repository} --repo-type dataset --local-dir DIR) or give HAC's processed folder"
    )
  return read_parquet(files, PARQUET_LAYOUTS[name], spec.repository, left_out)
