"""SVAMP: one-step arithmetic word problems built to defeat shallow heuristics (1000 items, no train split).

The question is ``Body + " " + Question`` (358 bodies lack a final period, so this is the upstream join). The
``Equation`` field gives a one-line worked solution for few-shot examples. VC: a non-negative integer.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, ClassVar

from formtax.tasks.base import Item
from formtax.tasks.io import check_unique_ids, read_json_array, require_int, require_object, require_str
from formtax.tasks.kinds import IntegerTask
from formtax.tasks.registry import register_task

_EXPECTED = "a JSON object with 'ID', 'Body', 'Question', 'Equation' (str) and a whole-number 'Answer'"
_TRAILING_ZERO_RE = re.compile(r"(\d+)\.0\b")


def _parse_row(index: int, obj: Any) -> Item:
    row = require_object(obj)
    item_id = require_str(row, "ID")
    body = require_str(row, "Body").strip()
    question = require_str(row, "Question").strip()
    equation = require_str(row, "Equation")
    answer = require_int(row, "Answer")
    expression = " ".join(_TRAILING_ZERO_RE.sub(r"\1", equation).split())
    solution = f"We compute {expression} = {answer}."
    meta = {"type": row.get("Type"), "equation": equation}
    return Item(id=item_id, question=f"{body} {question}", gold=str(answer), solution=solution, meta=meta)


DEV_EVERY = 16  # 1 item in 16 is held out for shots and FEM distillation, never evaluated


@register_task
class SvampTask(IntegerTask):
    """SVAMP (1000 items: 937 evaluated, 63 held out as a dev split); ids are the upstream ``ID`` (e.g. ``chal-1``)."""

    name: ClassVar[str] = "svamp"
    description: ClassVar[str] = "SVAMP arithmetic word problems (937 items, 63 held out; integer answers)"
    instructions: ClassVar[tuple[str, str, str]] = (
        "Solve the following math word problem.",
        "You are given a short arithmetic word problem. Work out its numerical answer.",
        "Read the problem below and calculate the answer.",
    )

    def data_files(self, data_dir: Path) -> list[Path]:
        return [data_dir / "svamp" / "SVAMP.json"]

    holds_out_dev: ClassVar[bool] = True

    def _shot_pool(self, data_dir: Path | None) -> list[Item]:
        """The held-out dev split (ours: the data has no train split): every DEV_EVERY-th item in file order."""
        return self._load(data_dir)[::DEV_EVERY]

    def _load(self, data_dir: Path | None) -> list[Item]:
        path = self.data_files(self._require_dir(data_dir))[0]
        items = read_json_array(self.name, path, _EXPECTED, _parse_row)
        check_unique_ids(self.name, path, [item.id for item in items])
        return items
