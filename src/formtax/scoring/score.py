"""Scoring parsed answers: correct only when a parser extracted an answer equal to the gold."""

from __future__ import annotations

from collections.abc import Mapping

from formtax.parsing.result import ParseResult
from formtax.tasks.base import Item, Task


def score_all(task: Task, item: Item, parses: Mapping[str, ParseResult]) -> dict[str, bool]:
    """Per parser name: whether its answer is correct. ``no_answer`` and ``invalid`` parses are wrong."""
    return {name: parse.ok and task.score(item, parse.value) for name, parse in parses.items()}
