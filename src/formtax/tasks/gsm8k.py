"""GSM8K: grade-school math word problems (test split evaluated, train split for few-shot examples).

The validity constraint follows paper 003 A.2.2: a non-negative integer (``{int:0..}``). Two test items have
negative gold answers (-10 and -3), so under VC those two items cannot be answered correctly; the prompt's answer
description says "non-negative" too, so constrained and unconstrained runs see the same prompt. This caps VC
accuracy at 1317/1319 and is kept on purpose to match the paper's setting.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, ClassVar

from formtax.tasks.base import Item, OutputFormat
from formtax.tasks.io import RowError, read_jsonl, require_object, require_str
from formtax.tasks.kinds import IntegerTask, normalize_integer
from formtax.tasks.registry import register_task

_EXPECTED = "a JSON object with 'question' and 'answer' ending in '#### <integer>'"
_CALCULATOR_RE = re.compile(r"<<[^>]*>>")


def _parse_row(index: int, obj: Any, id_prefix: str) -> Item:
    row = require_object(obj)
    question = require_str(row, "question")
    answer = require_str(row, "answer")
    if answer.count("####") != 1:
        raise RowError("'answer' must contain exactly one '####'")
    worked, final = answer.split("####")
    gold = normalize_integer(final)
    if gold is None:
        raise RowError(f"final answer {final.strip()!r} is not an integer")
    solution = _CALCULATOR_RE.sub("", worked).strip()
    return Item(id=f"{id_prefix}{index}", question=question.strip(), gold=gold, solution=solution or None)


@register_task
class Gsm8kTask(IntegerTask):
    """GSM8K test (1319 items); ids are row indices, train shots are ``train-<row>``."""

    name: ClassVar[str] = "gsm8k"
    description: ClassVar[str] = (
        "GSM8K grade-school math word problems (test split, 1319 items; integer answers)"
    )
    instructions: ClassVar[tuple[str, str, str]] = (
        "Solve the following grade-school math word problem.",
        "You are given a math word problem. Work out its numerical answer carefully.",
        "Read the math question below and calculate the answer.",
    )
    folder: ClassVar[str] = "gsm8k"
    # Deco-G (paper 001) decodes GSM8K with the key phrase "The final answer is ..." that only has to appear
    fem_output_format: ClassVar[OutputFormat] = OutputFormat.REASON_KEYPHRASE

    def data_files(self, data_dir: Path) -> list[Path]:
        # The train split is read only for few-shot examples; it is listed when present.
        train = data_dir / self.folder / "train.jsonl"
        return [data_dir / self.folder / "test.jsonl", *([train] if train.is_file() else [])]

    def _load(self, data_dir: Path | None) -> list[Item]:
        path = self._require_dir(data_dir) / self.folder / "test.jsonl"
        return read_jsonl(self.name, path, _EXPECTED, lambda i, obj: _parse_row(i, obj, ""))

    def _shot_pool(self, data_dir: Path | None) -> list[Item]:
        path = self._require_dir(data_dir) / self.folder / "train.jsonl"
        return read_jsonl(self.name, path, _EXPECTED, lambda i, obj: _parse_row(i, obj, "train-"))
