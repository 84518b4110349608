"""Evaluator type "vqa": zero-shot multiple-choice VQA, HAC's benchmark
family (Dibitonto et al. 2026; the release's hac/evaluation/vqa.py).

Each option of a question becomes a prompt, `template` filled with the
question and the option ("plain": "{question} {answer}", HAC's default;
"qa": "Question: {question} Answer: {answer}", HAC's `use_qa_prompts`; or
any text holding both fields); the image is scored against every prompt by
the objective's own score (`predictor.paired_similarity`: the Lorentzian
inner product for MERU-style models, cosine for CLIP) and the best-scoring
option is the prediction (the first on a tie, as argmax). Any number of
options. Questions without an answer (VMCBench's and A-OKVQA's test
splits) are predicted and written, not scored.

  path        a folder holding one folder per benchmark, each named after it
              (loosely: "A-OKVQA", "SEED-Bench", "ai2d", "MMSTAR" ...), in
              its Hub layout or HAC's processed one (datasets/
              multiple_choice.py); or, with one name in `benchmarks`, that
              benchmark's own folder or file
  benchmarks  names of `multiple_choice.BENCHMARKS`; () = every one found
  split       the split read from a Hub layout ("" = each benchmark's own)
  image_root  SEED-Bench's images beside its JSON (default SEED-Bench-image/)
  output_dir  where `<benchmark>_predictions.jsonl` goes (default
              <workdir>/eval/<name>)

Figures, under "vqa" (template plain), "vqa_qa" (template qa) or
"vqa_<evaluator name>" (a template of one's own):
  <p>/<benchmark>/accuracy             answered questions predicted right
  <p>/<benchmark>/<category>/accuracy  MMStar's and VMCBench's own categories
  <p>/vmcbench/<group>/accuracy        VMCBench by its own groups (general, reasoning,
                                       ocr, doc_chart: multiple_choice.VMCBENCH_GROUPS)
  <p>/<group>/accuracy                 the mean of the accuracies of the group's
                                       benchmarks (general: A-OKVQA, MMStar,
                                       SEED-Bench; reasoning: ScienceQA,
                                       RealWorldQA; ocr: AI2D), as HAC groups them
  <p>/average/accuracy                 the mean over the benchmarks scored
  <p>/<benchmark>/{skipped,num_unanswered}   bookkeeping
Images: the centre square resized (resize="crop", HAC's Resize + CenterCrop).
"""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from hyperbolic_vl import errors, files
from hyperbolic_vl.evaluators import EvaluatorUnavailable, registry
from hyperbolic_vl.evaluators.datasets import images, vqa_questions
from hyperbolic_vl.evaluators.datasets import multiple_choice as mc

TEMPLATES = {"plain": "{question} {answer}", "qa": "Question: {question} Answer: {answer}"}
SETTINGS = dict(
  path="",
  benchmarks=(),
  split="",
  image_root="",
  template="plain",
  resize="crop",
  image_size=0,
  num_examples=None,
  output_dir="",
)


def prompt_template(template: str) -> str:
  """A template's text; ConfigError unless it fills {question} and {answer}."""
  text = TEMPLATES.get(template, template)
  try:
    filled = text.format(question="\0q", answer="\0a")
  except (KeyError, IndexError, ValueError):
    filled = ""
  if "\0q" not in filled or "\0a" not in filled:
    raise errors.ConfigError(
      f"vqa template={template!r}: use {sorted(TEMPLATES)} or a text with {{question}} and "
      "{answer} (and no other braces)"
    )
  return text


def benchmark_paths(path: str, names: tuple[str, ...]) -> dict[str, str]:
  """{benchmark: its folder or file}, in `BENCHMARKS` order."""
  unknown = sorted(set(names) - set(mc.BENCHMARKS))
  if unknown:
    raise errors.ConfigError(f"vqa benchmarks {unknown} unknown; valid: {list(mc.BENCHMARKS)}")
  if not path or not os.path.exists(path):
    raise EvaluatorUnavailable(f"vqa path={path!r} does not exist")
  found = {}
  if os.path.isdir(path):
    for entry in sorted(os.listdir(path)):
      name = mc.folded(entry)
      if name in mc.BENCHMARKS and os.path.isdir(os.path.join(path, entry)):
        found.setdefault(name, os.path.join(path, entry))
  if len(names) == 1 and names[0] not in found:
    return {names[0]: path}  # the benchmark's own folder or file
  own = mc.folded(os.path.basename(os.path.normpath(path)))
  if not names and not found and own in mc.BENCHMARKS:
    return {own: path}  # a benchmark's folder, named after it
  wanted = names or tuple(found)
  missing = [n for n in wanted if n not in found]
  if missing or not wanted:
    titles = ", ".join(f"{b.title}/" for b in mc.BENCHMARKS.values())
    raise EvaluatorUnavailable(
      f"vqa: {path} has no folder for {missing or 'any benchmark'}; expected folders named "
      f"after them ({titles})"
    )
  return {n: found[n] for n in mc.BENCHMARKS if n in wanted}


@registry.register(
  "vqa",
  settings=SETTINGS,
  description="zero-shot multiple-choice VQA (HAC's seven benchmarks; path=their folder)",
)
class MultipleChoiceVqaEvaluator:
  def __init__(self, name: str, settings, run_input, tokenizer=None):
    del tokenizer  # the predictor tokenizes
    template = str(settings.template)
    self.template = prompt_template(template)
    self.prefix = {"plain": "vqa", "qa": "vqa_qa"}.get(template, f"vqa_{name}")
    if settings.resize not in ("squeeze", "crop"):
      raise errors.ConfigError(f"vqa resize={settings.resize!r}; valid: squeeze, crop")
    paths = benchmark_paths(str(settings.path), tuple(settings.benchmarks))
    split = str(settings.split) or None
    num = settings.get("num_examples")
    self.questions, self.left_out = {}, {}
    for benchmark, path in paths.items():
      left_out = vqa_questions.LeftOut()
      questions = mc.read_benchmark(benchmark, path, split, str(settings.image_root), left_out)
      questions = questions if num is None else questions[: int(num)]
      title = mc.BENCHMARKS[benchmark].title
      if left_out.total:
        print(f"vqa: {title}: left out {left_out.total} question(s): {left_out.describe()}")
      if not questions:
        raise errors.DataError(f"vqa: {title}: no usable question in {path}")
      self.questions[benchmark], self.left_out[benchmark] = questions, left_out
    self.size = images.image_size(settings, run_input)
    self.resize = str(settings.resize)
    self.batch_size = max(1, int(settings.batch_size))
    self.output_dir = str(settings.get("output_dir", "") or "")

  def predict(self, predictor, questions, reader, unreadable) -> list[int | None]:
    """The best-scoring option of each question; None where its image could
    not be read (counted in `unreadable`)."""
    predictions = [None] * len(questions)

    def encoded(question):
      try:
        return reader.encoded(question.image)
      except mc.UndecodableImage as error:
        return error

    def decoded(data):
      if isinstance(data, Exception):
        return data
      try:
        return reader.decode(data)
      except mc.UndecodableImage as error:
        return error

    with ThreadPoolExecutor(max_workers=8) as pool:
      for start in range(0, len(questions), self.batch_size):
        chunk = questions[start : start + self.batch_size]
        # Read on this thread (one parquet file at a time), decoded on the pool.
        pixels = list(pool.map(decoded, [encoded(q) for q in chunk]))
        kept = []
        for i, (question, image) in enumerate(zip(chunk, pixels)):
          if isinstance(image, Exception):
            unreadable.add(str(image), f"question {question.index}")
          else:
            kept.append(i)
        if not kept:
          continue
        image_emb = predictor.encode_images(np.stack([pixels[i] for i in kept]))
        counts = [len(chunk[i].options) for i in kept]
        prompts = [
          self.template.format(question=chunk[i].question, answer=option)
          for i in kept
          for option in chunk[i].options
        ]
        scores = predictor.paired_similarity(
          np.repeat(image_emb, counts, axis=0), predictor.encode_texts(prompts)
        )
        for i, option_scores in zip(kept, np.split(np.asarray(scores), np.cumsum(counts)[:-1])):
          predictions[start + i] = int(np.argmax(option_scores))
    return predictions

  def __call__(self, predictor) -> dict[str, float]:
    reader = mc.ImageReader(self.size, self.resize)
    figures, accuracies = {}, {}
    for benchmark, questions in self.questions.items():
      title = mc.BENCHMARKS[benchmark].title
      unreadable = vqa_questions.LeftOut()
      predictions = self.predict(predictor, questions, reader, unreadable)
      if unreadable.total:
        print(f"vqa: {title}: skipped {unreadable.total} question(s): {unreadable.describe()}")
      if all(p is None for p in predictions):
        print(f"vqa: {title}: no image could be read; no figure", flush=True)
        continue
      key = f"{self.prefix}/{benchmark}"
      figures.update(self.benchmark_figures(benchmark, questions, predictions))
      figures[f"{key}/skipped"] = float(self.left_out[benchmark].total + unreadable.total)
      unanswered = sum(q.answer is None and p is not None for q, p in zip(questions, predictions))
      figures[f"{key}/num_unanswered"] = float(unanswered)
      if f"{key}/accuracy" in figures:
        accuracies[benchmark] = figures[f"{key}/accuracy"]
      self.write_predictions(benchmark, questions, predictions, unanswered)
    if not figures:
      raise errors.DataError(f"vqa: no image of {list(self.questions)} could be read (see above)")
    for group in mc.GROUPS:
      members = [a for b, a in accuracies.items() if mc.BENCHMARKS[b].group == group]
      if members:
        figures[f"{self.prefix}/{group}/accuracy"] = float(np.mean(members))
    if accuracies:
      figures[f"{self.prefix}/average/accuracy"] = float(np.mean(list(accuracies.values())))
    return figures

  def benchmark_figures(self, benchmark, questions, predictions) -> dict[str, float]:
    """Accuracy over the answered questions whose image was read: overall,
    per category (MMStar, VMCBench) and, for VMCBench, per group."""
    scored = [
      (q, p == q.answer)
      for q, p in zip(questions, predictions)
      if p is not None and q.answer is not None
    ]
    if not scored:
      return {}
    key = f"{self.prefix}/{benchmark}"
    figures = {f"{key}/accuracy": float(np.mean([right for _, right in scored]))}
    subsets = {}
    for question, right in scored:
      if question.category and benchmark in ("mmstar", "vmcbench"):
        name = "_".join(mc.folded(part) for part in question.category.split() if mc.folded(part))
        subsets.setdefault(name, []).append(right)
      if benchmark == "vmcbench" and mc.group_of(benchmark, question):
        subsets.setdefault(mc.group_of(benchmark, question), []).append(right)
    for name, rights in sorted(subsets.items()):
      figures[f"{key}/{name}/accuracy"] = float(np.mean(rights))
    return figures

  def write_predictions(self, benchmark, questions, predictions, unanswered: int) -> None:
    """`<output_dir>/<benchmark>_predictions.jsonl`: one line per question,
    {"index", "prediction", "answer", "category"} (letters; null prediction
    where the image could not be read, null answer where the split hides it)."""
    title = mc.BENCHMARKS[benchmark].title
    if not self.output_dir:
      if unanswered:
        print(
          f"vqa: {title}: {unanswered} unanswered question(s) predicted; no output_dir to write them"
        )
      return
    path = os.path.join(self.output_dir, f"{benchmark}_predictions.jsonl")

    def letter(position):
      return None if position is None else vqa_questions.LETTERS[position]

    lines = [
      json.dumps(
        {
          "index": q.index,
          "prediction": letter(p),
          "answer": letter(q.answer),
          "category": q.category,
        }
      )
      for q, p in zip(questions, predictions)
    ]
    files.write_file_atomically(path, "".join(line + "\n" for line in lines))
    if unanswered:
      print(f"vqa: {title}: {unanswered} unanswered question(s) predicted, written to {path}")
