"""Zero-shot multiple-choice VQA ("vqa") on small files in each benchmark's
published layout (the Hub's parquet or JSON, HAC's processed
`<NAME>_ann.json` + images/), built here with tiny PNG images, through a
stand-in predictor whose scores are known (stub_predictors.py: an image is
its unit mean colour, a text the colour words it names, so the option naming
the image's colour wins). Every figure equals the hand count written beside
its case; a tiny real MERU and CLIP predict the argmax of a float64 Lorentz
inner product / cosine of their own embeddings."""

import io
import json
import os

import ml_collections
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image
from stub_predictors import ColourPredictor
from tiny_fixtures import CONTEXT, IMAGE, VOCAB, tiny_two_towers

from configs import clip as clip_config
from configs import meru as meru_config
from hyperbolic_vl import errors
from hyperbolic_vl import objectives as objectives_lib
from hyperbolic_vl import predictor as predictor_lib
from hyperbolic_vl.evaluators import EvaluatorUnavailable, registry
from hyperbolic_vl.evaluators.datasets import images as eval_images
from hyperbolic_vl.evaluators.datasets import vqa_questions
from hyperbolic_vl.runs import results_table

SOLID = {"red": (230, 20, 20), "green": (20, 230, 20), "blue": (20, 20, 230)}


def png(colour: str) -> bytes:
  pixels = np.broadcast_to(np.asarray(SOLID[colour], np.uint8), (6, 5, 3))
  buffer = io.BytesIO()
  Image.fromarray(np.ascontiguousarray(pixels)).save(buffer, format="PNG")
  return buffer.getvalue()


def image(colour: str) -> dict:
  """A Hugging Face image cell: {bytes, path}."""
  return {"bytes": png(colour), "path": f"{colour}.png"}


def write_parquet(path, rows) -> None:
  os.makedirs(os.path.dirname(path), exist_ok=True)
  pq.write_table(pa.Table.from_pylist(rows), str(path))


def build(path, **settings):
  settings = dict(path=str(path), **settings)
  run_input = ml_collections.ConfigDict({"image_size": 8})
  return registry.get("vqa").build("vqa", registry.entry("vqa", **settings), run_input)


RWQA = "Please answer directly with only the letter of the correct option and nothing else."


def write_hub_layouts(root) -> None:
  """The seven benchmarks as their Hub repositories publish them; the hand
  count of each is written beside its rows."""
  # AI2D, two files: right, wrong (green image, answer "red"), right, and an
  # answer outside the options (left out): 2 of 3.
  ai2d = root / "AI2D" / "data"
  write_parquet(
    ai2d / "test-00000-of-00002.parquet",
    [
      dict(question="Q1", options=["red", "green", "blue", "x"], answer="0", image=image("red")),
      dict(question="Q2", options=["red", "green", "blue", "x"], answer="0", image=image("green")),
    ],
  )
  write_parquet(
    ai2d / "test-00001-of-00002.parquet",
    [
      dict(question="Q3", options=["a", "b", "blue", "c"], answer="2", image=image("blue")),
      dict(question="Q4", options=["red", "b", "c", "d"], answer="7", image=image("red")),
    ],
  )
  # A-OKVQA validation: 2 of 2.
  write_parquet(
    root / "A-OKVQA" / "data" / "validation-00000-of-00001-abc.parquet",
    [
      dict(
        question_id="q1",
        question="What?",
        choices=["green", "red", "blue", "cat"],
        correct_choice_idx=1,
        image=image("red"),
      ),
      dict(
        question_id="q2",
        question="What?",
        choices=["blue", "red", "green", "dog"],
        correct_choice_idx=0,
        image=image("blue"),
      ),
    ],
  )
  # MMStar, both inline option forms: right (coarse perception), wrong with
  # three options (fine-grained perception), and answer "E" (left out): 1 of 2.
  write_parquet(
    root / "MMStar" / "mmstar.parquet",
    [
      dict(
        index=0,
        question="Which one? Options: A: red, B: green, C: blue, D: a cup",
        answer="A",
        category="coarse perception",
        image=image("red"),
      ),
      dict(
        index=1,
        question=vqa_questions.MMSTAR_HINT + "Which one?\nChoices:\n(A) green\n(B) blue\n(C) red",
        answer="B",
        category="fine-grained perception",
        image=image("green"),
      ),
      dict(
        index=2,
        question="Which? Options: A: red, B: green",
        answer="E",
        category="math",
        image=image("red"),
      ),
    ],
  )
  # RealWorldQA, two files: right by letter, a free-form question (left
  # out), wrong where the answer is the option's text ("green", B): 1 of 2.
  rwqa = root / "RealworldQA" / "data"
  write_parquet(
    rwqa / "test-00000-of-00002.parquet",
    [
      dict(question=f"Car?\nA. green\nB. red\nC. blue\n{RWQA}", answer="B", image=image("red")),
      dict(question="How many?\nAnswer with a number.", answer="3", image=image("red")),
    ],
  )
  write_parquet(
    rwqa / "test-00001-of-00002.parquet",
    [dict(question=f"It?\nA: blue\nB: green\n{RWQA}", answer="green", image=image("blue"))],
  )
  # ScienceQA: right with five options (the fifth), a text-only question
  # (no image: skipped), wrong: 1 of 2.
  write_parquet(
    root / "ScienceQA" / "data" / "test-00000-of-00001-xyz.parquet",
    [
      dict(question="S1", choices=["a", "b", "c", "d", "red"], answer=4, image=image("red")),
      dict(question="S2", choices=["red", "green"], answer=0, image=None),
      dict(question="S3", choices=["green", "blue"], answer=1, image=image("green")),
    ],
  )
  # SEED-Bench: right, a video question (left out), right: 2 of 2.
  seed = dict(choice_c="green", choice_d="cat", data_type="image")
  write_parquet(
    root / "SEED-Bench" / "data" / "test-00000-of-00001.parquet",
    [
      dict(seed, question_id="1", question="Q", choice_a="blue", choice_b="red", answer="B", image=[image("red")]),
      dict(seed, question_id="2", question="Q", choice_a="x", choice_b="y", answer="A", data_type="video", image=[]),
      dict(seed, question_id="3", question="Q", choice_a="x", choice_b="y", answer="C", image=[image("green")]),
    ],
  )  # fmt: skip
  # VMCBench dev, one question from each of its four groups (multiple_
  # choice.VMCBENCH_GROUPS): right (SEEDBench, General), wrong (ScienceQA,
  # Reasoning), right (AI2D, Doc&Chart), wrong (TextVQA, OCR): 2 of 4.
  vmc = dict(A="red", B="green", C="blue", D="x")
  write_parquet(
    root / "VMCBench" / "data" / "dev-00000-of-00001.parquet",
    [
      dict(vmc, index=10, question="V", answer="A", category="SEEDBench", image=image("red")),
      dict(vmc, index=11, question="V", answer="A", category="ScienceQA", image=image("green")),
      dict(vmc, index=12, question="V", answer="C", category="AI2D", image=image("blue")),
      dict(vmc, index=13, question="V", answer="B", category="TextVQA", image=image("red")),
    ],
  )


def test_the_seven_hub_layouts_hand_counted(tmp_path, capsys):
  write_hub_layouts(tmp_path)
  evaluator = build(tmp_path, batch_size=2)
  assert capsys.readouterr().out.splitlines() == [
    "vqa: AI2D: left out 1 question(s): 1 answer outside the options (first: "
    "test-00001-of-00002.parquet row 1: answer '7' for 4 options)",
    "vqa: MMStar: left out 1 question(s): 1 answer outside the options (first: "
    "mmstar.parquet row 2: answer 'E' for options A, B)",
    "vqa: RealWorldQA: left out 1 question(s): 1 not multiple-choice (first: "
    "test-00000-of-00002.parquet row 1)",
    "vqa: SEED-Bench: left out 1 question(s): 1 video question (first: "
    "test-00000-of-00001.parquet row 1)",
  ]
  figures = evaluator(ColourPredictor())
  assert (
    capsys.readouterr().out
    == "vqa: ScienceQA: skipped 1 question(s): 1 no image (first: question 1)\n"
  )
  accuracy = {
    "ai2d": 2 / 3,
    "aokvqa": 1.0,
    "mmstar": 1 / 2,
    "realworldqa": 1 / 2,
    "scienceqa": 1 / 2,
    "seedbench": 1.0,
    "vmcbench": 2 / 4,
  }
  skipped = dict(ai2d=1, aokvqa=0, mmstar=1, realworldqa=1, scienceqa=1, seedbench=1, vmcbench=0)
  want = {f"vqa/{b}/accuracy": a for b, a in accuracy.items()}
  want.update({f"vqa/{b}/skipped": float(n) for b, n in skipped.items()})
  want.update({f"vqa/{b}/num_unanswered": 0.0 for b in accuracy})
  want.update(
    {
      "vqa/mmstar/coarse_perception/accuracy": 1.0,
      "vqa/mmstar/finegrained_perception/accuracy": 0.0,
      "vqa/vmcbench/seedbench/accuracy": 1.0,
      "vqa/vmcbench/scienceqa/accuracy": 0.0,
      "vqa/vmcbench/ai2d/accuracy": 1.0,
      "vqa/vmcbench/textvqa/accuracy": 0.0,
      # VMCBench's own four groups: AI2D is Doc&Chart there, not OCR.
      "vqa/vmcbench/general/accuracy": 1.0,
      "vqa/vmcbench/reasoning/accuracy": 0.0,
      "vqa/vmcbench/doc_chart/accuracy": 1.0,
      "vqa/vmcbench/ocr/accuracy": 0.0,
      # HAC's groups: the mean of their benchmarks' accuracies.
      "vqa/general/accuracy": (1.0 + 1 / 2 + 1.0) / 3,  # A-OKVQA, MMStar, SEED-Bench
      "vqa/reasoning/accuracy": (1 / 2 + 1 / 2) / 2,  # ScienceQA, RealWorldQA
      "vqa/ocr/accuracy": 2 / 3,  # AI2D
      "vqa/average/accuracy": sum(accuracy.values()) / 7,
    }
  )
  assert figures == pytest.approx(want, abs=1e-12)
  # The cross-run table takes them as any other figures, bookkeeping left out.
  row = results_table.evaluation_row("run", str(tmp_path), "vqa", None, figures)
  runs = results_table.merged_by_run([row])
  columns = results_table.default_columns(runs)
  assert columns == sorted(k for k in want if k.endswith("/accuracy"))
  table = results_table.markdown_table(runs, columns)
  assert "| run | vqa/ai2d/accuracy |" in table and "| run | 0.667 | 1.000 |" in table


def write_processed(root, name: str, entries, category_folder: str = "") -> None:
  """HAC's processed layout: <folder>/<NAME>_ann.json + images/."""
  folder = root / name / category_folder if category_folder else root / name
  os.makedirs(folder / "images", exist_ok=True)
  for colour in SOLID:
    (folder / "images" / f"{colour}.png").write_bytes(png(colour))
  stem = category_folder or name
  (folder / f"{stem}_ann.json").write_text(json.dumps(entries))


def test_hac_processed_layout_more_options_and_unanswered_questions(tmp_path, capsys):
  write_processed(
    tmp_path,
    "AI2D",
    [
      # six options, the sixth right: right
      {
        "index": 5,
        "question": "Q",
        "options": dict(zip("ABCDEF", ["x", "y", "z", "w", "v", "red"])),
        "answer": "F",
        "image_path": "red.png",
      },
      {"index": 6, "question": "Q", "options": {"A": "green", "B": "red"}, "answer": "A", "image_path": "green.png"},
      # an answer letter outside the options: left out
      {"index": 7, "question": "Q", "options": {"A": "red", "B": "blue"}, "answer": "C", "image_path": "red.png"},
      # its image is absent: skipped when embedding
      {"index": 8, "question": "Q", "options": {"A": "red", "B": "blue"}, "answer": "A", "image_path": "gone.png"},
    ],
  )  # fmt: skip
  # VMCBench as HAC writes it: one folder per category; TextVQA's question
  # has no answer (a test split): predicted and written, not scored.
  two = {"A": "red", "B": "green"}
  mmstar = [
    {"index": 1, "question": "Q", "options": two, "answer": "A", "image_path": "red.png"},
    {"index": 2, "question": "Q", "options": two, "answer": "A", "image_path": "green.png"},
  ]
  write_processed(tmp_path, "VMCBench", mmstar, "MMStar")
  text = [{"index": 3, "question": "Q", "options": {"A": "blue", "B": "red"}, "answer": None, "image_path": "blue.png"}]  # fmt: skip
  write_processed(tmp_path, "VMCBench", text, "TextVQA")
  out = tmp_path / "out"
  evaluator = build(tmp_path, output_dir=str(out))
  figures = evaluator(ColourPredictor())
  assert capsys.readouterr().out.splitlines() == [
    "vqa: AI2D: left out 1 question(s): 1 answer outside the options (first: "
    "AI2D_ann.json question 2: answer 'C' for options ['A', 'B'])",
    f"vqa: AI2D: skipped 1 question(s): 1 no image file {tmp_path / 'AI2D' / 'images' / 'gone.png'} "
    "(first: question 8)",
    f"vqa: VMCBench: 1 unanswered question(s) predicted, written to {out / 'vmcbench_predictions.jsonl'}",
  ]
  assert figures == {
    "vqa/ai2d/accuracy": 1.0,  # 2 of 2 scored
    "vqa/ai2d/skipped": 2.0,
    "vqa/ai2d/num_unanswered": 0.0,
    "vqa/vmcbench/accuracy": 0.5,  # 1 of 2 answered (MMStar's)
    "vqa/vmcbench/mmstar/accuracy": 0.5,
    "vqa/vmcbench/general/accuracy": 0.5,
    "vqa/vmcbench/skipped": 0.0,
    "vqa/vmcbench/num_unanswered": 1.0,
    "vqa/ocr/accuracy": 1.0,
    "vqa/average/accuracy": 0.75,
  }
  lines = [
    json.loads(line) for line in (out / "vmcbench_predictions.jsonl").read_text().splitlines()
  ]
  assert lines == [
    {"index": "1", "prediction": "A", "answer": "A", "category": "MMStar"},
    {"index": "2", "prediction": "B", "answer": "A", "category": "MMStar"},
    {"index": "3", "prediction": "A", "answer": None, "category": "TextVQA"},
  ]
  ai2d = [json.loads(line) for line in (out / "ai2d_predictions.jsonl").read_text().splitlines()]
  assert [(r["index"], r["prediction"]) for r in ai2d] == [("5", "F"), ("6", "A"), ("8", None)]


def test_a_test_split_is_predicted_and_written_not_scored(tmp_path, capsys):
  vmc = dict(A="red", B="green", C="blue", D="x", question="V", category="GQA")
  write_parquet(
    tmp_path / "VMCBench" / "data" / "test-00000-of-00001.parquet",
    [dict(vmc, index=7, answer="", image=image("blue")), dict(vmc, index=8, answer=None, image=image("green"))],
  )  # fmt: skip
  evaluator = build(tmp_path, split="test", output_dir=str(tmp_path / "out"))
  assert evaluator(ColourPredictor()) == {
    "vqa/vmcbench/skipped": 0.0,
    "vqa/vmcbench/num_unanswered": 2.0,
  }
  written = (tmp_path / "out" / "vmcbench_predictions.jsonl").read_text().splitlines()
  assert [json.loads(line)["prediction"] for line in written] == ["C", "B"]
  # The default split (dev) is not there: one line naming what to download.
  with pytest.raises(errors.DataError) as raised:
    build(tmp_path)
  assert str(raised.value) == (
    f"{tmp_path / 'VMCBench'}: no parquet file of split 'dev' among "
    "['data/test-00000-of-00001.parquet']"
  )


class RecordingPredictor(ColourPredictor):
  def __init__(self):
    super().__init__()
    self.texts = []

  def encode_texts(self, texts):
    self.texts += list(texts)
    return super().encode_texts(texts)


@pytest.mark.parametrize(
  "template, prefix, prompts",
  [
    ("plain", "vqa", ["Which colour? red", "Which colour? green"]),
    ("qa", "vqa_qa", ["Question: Which colour? Answer: red", "Question: Which colour? Answer: green"]),
    ("{answer} <- {question}", "vqa_vqa", ["red <- Which colour?", "green <- Which colour?"]),
  ],
)  # fmt: skip
def test_prompt_templates(tmp_path, template, prefix, prompts):
  entry = {"question": "Which colour?", "options": {"A": "red", "B": "green"}, "answer": "B"}
  write_processed(tmp_path, "ScienceQA", [dict(entry, image_path="green.png")])
  predictor = RecordingPredictor()
  figures = build(tmp_path / "ScienceQA", benchmarks=("scienceqa",), template=template)(predictor)
  assert predictor.texts == prompts
  assert figures[f"{prefix}/scienceqa/accuracy"] == 1.0


def test_a_template_without_both_fields_is_one_line(tmp_path):
  write_processed(tmp_path, "AI2D", [])
  with pytest.raises(errors.ConfigError, match=r"template='\{question\}'"):
    build(tmp_path, template="{question}")


# -- bad files: one line --------------------------------------------------------------
def test_a_missing_column_is_one_line(tmp_path, capsys):
  file = tmp_path / "AI2D" / "data" / "test-00000-of-00001.parquet"
  write_parquet(file, [dict(question="Q", answer="0", image=image("red"))])
  with pytest.raises(errors.DataError) as raised:
    build(tmp_path)
  assert str(raised.value) == (
    f"{file} lacks column(s) ['options']; expected lmms-lab/ai2d's parquet columns "
    "question, options, answer, image"
  )
  # Through the registry (training, evaluate): the evaluator disabled in one line.
  config = ml_collections.ConfigDict(
    {"input": {"image_size": 8}, "evals": {"vqa": registry.entry("vqa", path=str(tmp_path))}}
  )
  assert registry.build_all(config, None) == []
  assert capsys.readouterr().out == f"Evaluator 'vqa' (vqa) disabled: {raised.value}\n"


def test_an_image_that_does_not_decode_is_skipped_and_counted(tmp_path, capsys):
  rows = [
    dict(index=1, question="V", A="red", B="green", C="b", D="c", answer="A", category="GQA", image=image("red")),
    dict(index=2, question="V", A="red", B="green", C="b", D="c", answer="A", category="GQA",
         image={"bytes": b"not an image", "path": "x.png"}),
  ]  # fmt: skip
  write_parquet(tmp_path / "VMCBench" / "data" / "dev-00000-of-00001.parquet", rows)
  figures = build(tmp_path)(ColourPredictor())
  assert capsys.readouterr().out == (
    "vqa: VMCBench: skipped 1 question(s): 1 image does not decode "
    "(UnidentifiedImageError) (first: question 2)\n"
  )
  assert figures["vqa/vmcbench/accuracy"] == 1.0 and figures["vqa/vmcbench/skipped"] == 1.0
  # A file none of whose images decode: one line.
  write_parquet(tmp_path / "VMCBench" / "data" / "dev-00000-of-00001.parquet", rows[1:])
  with pytest.raises(errors.DataError, match=r"^vqa: no image of \['vmcbench'\] could be read"):
    build(tmp_path)(ColourPredictor())


def test_answers_outside_the_options_left_out_and_a_file_of_them_refused(tmp_path, capsys):
  row = dict(
    index=1, question="V", A="red", B="green", C="b", D="c", category="GQA", image=image("red")
  )
  write_parquet(
    tmp_path / "VMCBench" / "data" / "dev-00000-of-00001.parquet",
    [dict(row, answer="E"), dict(row, answer="A")],
  )
  assert build(tmp_path)(ColourPredictor())["vqa/vmcbench/accuracy"] == 1.0
  assert capsys.readouterr().out.startswith(
    "vqa: VMCBench: left out 1 question(s): 1 answer outside the options (first: "
    "dev-00000-of-00001.parquet row 0: answer 'E' for options A, B, C, D)"
  )
  # A blank last option drops it (three options); a blank one before a filled one
  # would shift the letters after it: left out.
  write_parquet(
    tmp_path / "VMCBench" / "data" / "dev-00000-of-00001.parquet",
    [dict(row, answer="C", C="blue", D=""), dict(row, answer="C", B="", C="red")],
  )
  evaluator = build(tmp_path / "VMCBench")  # the benchmark's own folder, named after it
  assert [q.options for q in evaluator.questions["vmcbench"]] == [("red", "green", "blue")]
  assert capsys.readouterr().out == (
    "vqa: VMCBench: left out 1 question(s): 1 an empty option (first: "
    "dev-00000-of-00001.parquet row 1: options ['red', '', 'red', 'c'])\n"
  )
  assert evaluator(ColourPredictor())["vqa/vmcbench/accuracy"] == 0.0  # red image, answer C (blue)
  write_parquet(
    tmp_path / "VMCBench" / "data" / "dev-00000-of-00001.parquet", [dict(row, answer="E")]
  )
  with pytest.raises(errors.DataError, match="^vqa: VMCBench: no usable question in "):
    build(tmp_path)


def test_a_path_without_benchmark_folders_names_them(tmp_path):
  with pytest.raises(EvaluatorUnavailable, match=r"no folder for any benchmark; .*AI2D/, A-OKVQA/"):
    build(tmp_path)
  with pytest.raises(errors.ConfigError, match="vqa benchmarks \\['gqa'\\] unknown"):
    build(tmp_path, benchmarks=("gqa",))


def test_seed_bench_json_with_its_image_folder(tmp_path):
  """AILab-CVC/SEED-Bench's own layout: SEED-Bench.json + SEED-Bench-image/."""
  folder = tmp_path / "SEED-Bench"
  os.makedirs(folder / "SEED-Bench-image")
  (folder / "SEED-Bench-image" / "1.png").write_bytes(png("blue"))
  base = dict(question="Q", choice_a="red", choice_b="blue", choice_c="x", choice_d="y")
  questions = [
    dict(base, question_id="a", data_id="1.png", data_type="image", answer="B"),  # right
    dict(base, question_id="b", data_id="v.mp4", data_type="video", answer="A"),  # left out
    dict(base, question_id="c", data_id="1.png", data_type="image", answer="A"),  # wrong
  ]
  (folder / "SEED-Bench.json").write_text(json.dumps({"questions": questions}))
  figures = build(tmp_path)(ColourPredictor())
  assert figures["vqa/seedbench/accuracy"] == 0.5
  assert figures["vqa/seedbench/skipped"] == 1.0


# -- a real model's own score ---------------------------------------------------------
class CharacterTokenizer:
  """Token ids inside the tiny model's vocabulary, CLIP's convention (start
  VOCAB-2, end VOCAB-1, the largest id, where the text tower reads)."""

  def encode(self, texts):
    rows = np.zeros((len(texts), CONTEXT), np.int32)
    for row, text in enumerate(texts):
      ids = [VOCAB - 2] + [ord(c) % (VOCAB - 3) + 1 for c in text][: CONTEXT - 2] + [VOCAB - 1]
      rows[row, : len(ids)] = ids
    return rows


@pytest.mark.parametrize("geometry, get_config", [("lorentz", meru_config.get_config), ("euclidean", clip_config.get_config)])  # fmt: skip
def test_a_tiny_model_predicts_the_argmax_of_its_own_score(tmp_path, geometry, get_config):
  model_def, params = tiny_two_towers(geometry=geometry)
  objective = objectives_lib.get(get_config().objective)
  predictor = predictor_lib.Predictor(
    model_def, objective, params, tokenizer=CharacterTokenizer(), image_size=IMAGE
  )
  options = [["cat", "dog", "fox"], ["a", "bb", "ccc", "dd", "e"], ["red", "blue"], ["sun", "moon", "sky", "sea"]]  # fmt: skip
  colours = ["red", "green", "blue", "red"]
  entries = [
    {"index": i, "question": f"q{i}?", "options": dict(zip(vqa_questions.LETTERS, o)), "answer": "A", "image_path": f"{c}.png"}
    for i, (o, c) in enumerate(zip(options, colours))
  ]  # fmt: skip
  write_processed(tmp_path, "AI2D", entries)
  out = tmp_path / "out"
  settings = dict(image_size=IMAGE, output_dir=str(out), batch_size=3)
  figures = build(tmp_path, **settings)(predictor)
  # The float64 reference: HAC's score, the Lorentzian inner product
  # <x, y>_L = x.y - x_t y_t with x_t = sqrt(1/c + |x|^2) (the release's
  # L.pairwise_inner), or the cosine for CLIP, of the model's embeddings.
  paths = [str(tmp_path / "AI2D" / "images" / f"{c}.png") for c in colours]
  image_emb = predictor.encode_images(eval_images.load_image_files(paths, IMAGE, "crop"))
  reference = []
  for row, (question, opts) in enumerate(zip(entries, options)):
    x = image_emb[row].astype(np.float64)
    y = predictor.encode_texts([f"{question['question']} {o}" for o in opts]).astype(np.float64)
    if geometry == "lorentz":
      c = float(predictor.curv)
      score = y @ x - np.sqrt(1 / c + x @ x) * np.sqrt(1 / c + np.sum(y * y, axis=1))
    else:
      score = (y @ x) / (np.linalg.norm(y, axis=1) * np.linalg.norm(x))
    # float32 scores agree with float64 to ~1e-6 relative: a gap this wide
    # between the two best options keeps the argmax the same.
    top = np.sort(score)[::-1]
    assert top[0] - top[1] > 1e-4 * max(1.0, abs(top[0]))
    reference.append(int(np.argmax(score)))
  written = [json.loads(line) for line in (out / "ai2d_predictions.jsonl").read_text().splitlines()]
  assert [vqa_questions.LETTERS.index(r["prediction"]) for r in written] == reference
  assert figures["vqa/ai2d/accuracy"] == np.mean([r == 0 for r in reference])
