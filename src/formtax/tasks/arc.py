"""ARC-Challenge and ARC-Easy test sets, from the LLM-Adapters reformatted copy.

That copy folds the options into ``instruction`` as ``Answer1: ... Answer2: ...`` followed by an "Answer format"
line, and the gold is ``answerN``. We split the stem and options back out (the regex from the data's SOURCE.md),
relabel options 1..N as A..E, and check the option count against the "Answer format" line. Ids are row indices:
the copy has no upstream ids. No train split: shots come from other test items (pass the evaluated ids).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, ClassVar

from formtax.tasks.base import Item
from formtax.tasks.io import RowError, read_json_array, require_object, require_str
from formtax.tasks.kinds import ChoiceTask, choice_question
from formtax.tasks.registry import register_task

_EXPECTED = (
    "a JSON object with 'instruction' ('Please choose the correct answer to the question: <stem>\\n\\n"
    "Answer1: ... Answer2: ...\\n\\nAnswer format: answer1/answer2/...') and 'answer' ('answerN')"
)
_PREFIX = "Please choose the correct answer to the question: "
_OPTION_RE = re.compile(r"Answer(\d+): (.*?)(?= Answer\d+:|\n\nAnswer format)", re.DOTALL)
_ANSWER_RE = re.compile(r"answer(\d+)")
_LETTERS = "ABCDE"


def _parse_row(index: int, obj: Any) -> Item:
    row = require_object(obj)
    instruction = require_str(row, "instruction")
    answer = require_str(row, "answer").strip()
    if not instruction.startswith(_PREFIX):
        raise RowError(f"'instruction' does not start with {_PREFIX!r}")
    stem, sep, rest = instruction[len(_PREFIX) :].partition("\n\nAnswer1: ")
    if not sep:
        raise RowError("'instruction' has no '\\n\\nAnswer1: ' options block")
    options = _OPTION_RE.findall("Answer1: " + rest)
    numbers = [int(number) for number, _ in options]
    if len(options) < 2 or numbers != list(range(1, len(options) + 1)) or len(options) > len(_LETTERS):
        raise RowError(f"options must be numbered Answer1..AnswerN with 2 <= N <= 5 (found {numbers})")
    answer_format = rest.rpartition("\n\nAnswer format: ")[2].strip()
    if answer_format.count("/") + 1 != len(options):
        raise RowError(f"'Answer format' line {answer_format!r} disagrees with {len(options)} options")
    match = _ANSWER_RE.fullmatch(answer)
    if match is None or not 1 <= int(match.group(1)) <= len(options):
        raise RowError(f"'answer' {answer!r} is not answer1..answer{len(options)}")
    choices = tuple((_LETTERS[i], text.strip()) for i, (_, text) in enumerate(options))
    gold = _LETTERS[int(match.group(1)) - 1]
    return Item(
        id=str(index),
        question=choice_question(stem, choices),
        gold=gold,
        choices=choices,
        meta={"source_answer": answer},
    )


class _ArcTask(ChoiceTask):
    file_name: ClassVar[str]
    instructions: ClassVar[tuple[str, str, str]] = (
        "Answer the following multiple-choice science question.",
        "You are given a grade-school science question with several answer choices. Pick the correct one.",
        "Read the science question below and choose the best answer from the options.",
    )

    def data_files(self, data_dir: Path) -> list[Path]:
        return [data_dir / "arc" / self.file_name]

    def _load(self, data_dir: Path | None) -> list[Item]:
        path = self.data_files(self._require_dir(data_dir))[0]
        return read_json_array(self.name, path, _EXPECTED, _parse_row)


@register_task
class ArcChallengeTask(_ArcTask):
    """ARC-Challenge test (1172 items, 3-5 options)."""

    name: ClassVar[str] = "arc-challenge"
    description: ClassVar[str] = "ARC-Challenge science questions (test, 1172 items; labels A-E)"
    file_name: ClassVar[str] = "ARC-Challenge-test.LLM-Adapters.json"


@register_task
class ArcEasyTask(_ArcTask):
    """ARC-Easy test (2376 items, 3-5 options)."""

    name: ClassVar[str] = "arc-easy"
    description: ClassVar[str] = "ARC-Easy science questions (test, 2376 items; labels A-E)"
    file_name: ClassVar[str] = "ARC-Easy-test.LLM-Adapters.json"
