"""A multiple-choice question as the VQA readers give it
(`multiple_choice.py`), and the parsing of answers and options the
benchmarks' published files need: an answer given as a letter, a position
or the option's text; options in columns, in a list, or inline in the
question's text (MMStar, RealWorldQA). A question that cannot be scored
raises `BadQuestion`, which the readers count in `LeftOut`."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable

LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


@dataclasses.dataclass(frozen=True)
class ImageRef:
  """Where a question's image is: a file, or a parquet file's row (`column`
  holds an image struct {bytes, path}, raw bytes, base64 text or a list of
  those, whose first is taken)."""

  path: str = ""
  parquet: str = ""
  row: int = -1
  column: str = "image"


@dataclasses.dataclass(frozen=True)
class Question:
  """One multiple-choice question. answer: the right option's position, or
  None where the split hides it (predicted and written, not scored)."""

  index: str
  question: str
  options: tuple[str, ...]
  answer: int | None
  image: ImageRef
  category: str = ""


class BadQuestion(ValueError):
  """A question that cannot be scored; `reason` names the kind."""

  def __init__(self, reason: str, detail: str):
    super().__init__(detail)
    self.reason = reason


@dataclasses.dataclass
class LeftOut:
  """Questions left out, by reason, with the first example of each."""

  counts: dict = dataclasses.field(default_factory=dict)
  examples: dict = dataclasses.field(default_factory=dict)

  def add(self, reason: str, example: str) -> None:
    self.counts[reason] = self.counts.get(reason, 0) + 1
    self.examples.setdefault(reason, example)

  @property
  def total(self) -> int:
    return sum(self.counts.values())

  def describe(self) -> str:
    return "; ".join(
      f"{n} {reason} (first: {self.examples[reason]})" for reason, n in self.counts.items()
    )


# -- answers and options --------------------------------------------------------
def letter_position(answer, num_options: int) -> int:
  """ "B" -> 1; BadQuestion unless a letter naming one of the options."""
  letter = str(answer).strip().strip("().").strip().upper()
  if len(letter) != 1 or letter not in LETTERS[:num_options]:
    raise BadQuestion(
      "answer outside the options",
      f"answer {answer!r} for options {', '.join(LETTERS[:num_options])}",
    )
  return LETTERS.index(letter)


def position(answer, num_options: int) -> int:
  """A position given as an int or its text ("2"); BadQuestion when outside."""
  try:
    value = int(str(answer).strip())
  except ValueError:
    value = -1
  if not 0 <= value < num_options:
    raise BadQuestion("answer outside the options", f"answer {answer!r} for {num_options} options")
  return value


def options_of(values) -> tuple[str, ...]:
  """The options in their order, empty ones at the end dropped (a
  three-option question in a four-column layout); an empty one before a
  filled one is a BadQuestion, since the letters after it would shift."""
  options = ["" if v is None else str(v).strip() for v in values]
  while options and not options[-1]:
    options.pop()
  if "" in options:
    raise BadQuestion("an empty option", f"options {list(values)!r}")
  if len(options) < 2:
    raise BadQuestion("fewer than two options", f"options {list(values)!r}")
  return tuple(options)


def split_lettered(text: str, marker: Callable[[str], str]) -> list[str]:
  """Options lettered in order inside `text`: marker("B") is how option B
  starts (e.g. "B: " or "(B)"); an option runs to the next letter's marker."""
  starts, at = [], 0
  for letter in LETTERS:
    found = text.find(marker(letter), at)
    if found < 0:
      break
    starts.append((found, found + len(marker(letter))))
    at = found + len(marker(letter))
  ends = [s for s, _ in starts[1:]] + [len(text)]
  return [text[begin:end].strip().rstrip(",").strip() for (_, begin), end in zip(starts, ends)]


MMSTAR_HINT = (
  "Hint: Please answer the question and provide the correct option letter, "
  "e.g., A, B, C, D, at the end.\nQuestion: "
)


def mmstar_question(text: str) -> tuple[str, tuple[str, ...]]:
  """MMStar's question text -> (question, options): the options follow
  "Options: A: ..., B: ..." or "Choices:\n(A) ...\n(B) ..."."""
  if "Options:" in text:
    question, _, listed = text.partition("Options:")
    options = split_lettered(listed, lambda letter: f"{letter}: ")
  elif "Choices:" in text:
    question, _, listed = text.removeprefix(MMSTAR_HINT).partition("Choices:")
    options = split_lettered(listed, lambda letter: f"({letter})")
  else:
    raise BadQuestion("options not found in the question", text[:60])
  return question.strip(), options_of(options)


REALWORLDQA_MULTIPLE_CHOICE = (
  "Please answer directly with only the letter of the correct option and nothing else."
)
_LETTERED_LINE = re.compile(r"^([A-Z])(?:[.:)]\s*|\s+)(.*)$")


def realworldqa_question(text: str) -> tuple[str, tuple[str, ...]]:
  """RealWorldQA's text -> (question, options): options on their own lines
  lettered "A. ", "A: " or "A ", the instruction line last."""
  lines = [line.strip() for line in text.replace(REALWORLDQA_MULTIPLE_CHOICE, "").split("\n")]
  question, options = [], []
  for line in lines:
    match = _LETTERED_LINE.match(line)
    if match and match.group(1) == LETTERS[len(options)]:
      options.append(match.group(2))
    elif options and line:  # an option's text running on
      options[-1] += " " + line
    elif line:
      question.append(line)
  return " ".join(question), options_of(options)


def realworldqa_answer(answer, options: tuple[str, ...]) -> int:
  """A letter, or the option's own text (as HAC's script accepts)."""
  text = str(answer).strip()
  if text in options:
    return options.index(text)
  return letter_position(text, len(options))
