"""CommonsenseQA dev split (1221 items, 5 options A-E; the usual evaluation split, since test has no labels).

No train split is shipped, so shots come from other dev items (pass the evaluated ids in ``exclude_ids``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

from formtax.tasks.base import Item
from formtax.tasks.io import RowError, check_unique_ids, read_jsonl, require_object, require_str
from formtax.tasks.kinds import ChoiceTask, choice_question
from formtax.tasks.registry import register_task

_EXPECTED = (
    "a JSON object with 'id', 'answerKey' (A-E) and 'question' {'stem', 'choices': [{'label', 'text'} x5]}"
)
_LABELS = ("A", "B", "C", "D", "E")


def _parse_row(index: int, obj: Any) -> Item:
    row = require_object(obj)
    item_id = require_str(row, "id")
    answer_key = require_str(row, "answerKey").strip()
    question = require_object(row.get("question"))
    stem = require_str(question, "stem")
    raw_choices = question.get("choices")
    if not isinstance(raw_choices, list):
        raise RowError("'question.choices' is not a list")
    choices = tuple(
        (require_str(require_object(c), "label").strip(), require_str(require_object(c), "text").strip())
        for c in raw_choices
    )
    if tuple(label for label, _ in choices) != _LABELS:
        raise RowError(f"choice labels must be A-E in order, got {[label for label, _ in choices]}")
    if answer_key not in _LABELS:
        raise RowError(f"'answerKey' {answer_key!r} is not one of A-E")
    meta = {"concept": question.get("question_concept")}
    return Item(
        id=item_id, question=choice_question(stem, choices), gold=answer_key, choices=choices, meta=meta
    )


DEV_EVERY = 16  # 1 item in 16 is held out for shots and FEM distillation, never evaluated


@register_task
class CsqaTask(ChoiceTask):
    """CommonsenseQA dev (1221 items: 1144 evaluated, 77 held out for shots and distillation); upstream hex ids."""

    name: ClassVar[str] = "csqa"
    description: ClassVar[str] = "CommonsenseQA commonsense multiple choice (dev, 1144 items, 77 held out; labels A-E)"
    instructions: ClassVar[tuple[str, str, str]] = (
        "Answer the following commonsense multiple-choice question.",
        "You are given a question that requires commonsense knowledge, with five answer choices. Pick the best one.",
        "Read the question below and choose the most sensible answer from the options.",
    )

    def data_files(self, data_dir: Path) -> list[Path]:
        return [data_dir / "commonsenseqa" / "dev_rand_split.jsonl"]

    holds_out_dev: ClassVar[bool] = True

    def _shot_pool(self, data_dir: Path | None) -> list[Item]:
        """The held-out dev split (ours: the data has no train split): every DEV_EVERY-th item in file order."""
        return self._load(data_dir)[::DEV_EVERY]

    def _load(self, data_dir: Path | None) -> list[Item]:
        path = self.data_files(self._require_dir(data_dir))[0]
        items = read_jsonl(self.name, path, _EXPECTED, _parse_row)
        check_unique_ids(self.name, path, [item.id for item in items])
        return items
