"""AIME 2025 I and II: 30 competition problems with integer answers in [0, 999].

Paper 003 evaluates AIME 2026, which is not available as a data file; AIME 2025 is the closest public stand-in.
VC follows A.2.2: an integer between 0 and 999 (``{int:0..999}``). There is no train split and no worked
solution, so shots (rarely wanted here) are other problems with only their answers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

from formtax.tasks.base import Item
from formtax.tasks.io import RowError, check_unique_ids, read_jsonl, require_int, require_object, require_str
from formtax.tasks.kinds import IntegerTask
from formtax.tasks.registry import register_task

_EXPECTED = "a JSON object with 'id', 'problem' (str) and an integer 'answer' in [0, 999]"


def _parse_row(index: int, obj: Any) -> Item:
    row = require_object(obj)
    item_id = require_str(row, "id")
    problem = require_str(row, "problem")
    answer = require_int(row, "answer")
    if not 0 <= answer <= 999:
        raise RowError(f"answer {answer} is outside [0, 999]")
    meta = {"contest": row.get("contest"), "number": row.get("number")}
    return Item(id=item_id, question=problem.strip(), gold=str(answer), meta=meta)


@register_task
class AimeTask(IntegerTask):
    """AIME 2025 (30 items); ids like ``2025-I-1``."""

    name: ClassVar[str] = "aime"
    description: ClassVar[str] = "AIME 2025 I+II competition math (30 items; integer answers 0-999)"
    instructions: ClassVar[tuple[str, str, str]] = (
        "Please reason step by step to solve the following competition mathematics problem.",
        "Solve the following problem from the American Invitational Mathematics Examination (AIME).",
        "The following is a competition math problem whose answer is an integer between 0 and 999. Solve it.",
    )
    vc_min: ClassVar[int | None] = 0
    vc_max: ClassVar[int | None] = 999

    def data_files(self, data_dir: Path) -> list[Path]:
        return [data_dir / "aime2025" / "aime2025.jsonl"]

    def _load(self, data_dir: Path | None) -> list[Item]:
        path = self.data_files(self._require_dir(data_dir))[0]
        items = read_jsonl(self.name, path, _EXPECTED, _parse_row)
        check_unique_ids(self.name, path, [item.id for item in items])
        return items
