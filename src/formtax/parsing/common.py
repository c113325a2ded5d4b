"""Helpers shared by the parsers: turning a raw answer string or JSON value into a ``ParseResult``."""

from __future__ import annotations

import json
import re
from typing import Any

from formtax.parsing.result import ParseResult
from formtax.tasks.base import Task

_TRAILING_PERIOD_RE = re.compile(r"\.\s*$")


def from_raw(task: Task, raw: str, strict: bool = False) -> ParseResult:
    """``ok`` if ``raw`` reads as an answer, else ``invalid``; ``raw`` is kept as found.

    ``strict`` reads it with :meth:`Task.canonical` (already in the canonical representation), otherwise with
    :meth:`Task.normalize` (every spelling a reader would accept).
    """
    value = task.canonical(raw) if strict else task.normalize(raw)
    return ParseResult("ok" if value is not None else "invalid", value, raw)


def strip_trailing_period(text: str) -> str:
    """Drop one final period: "The answer is: 18." is accepted as 18 (sentence punctuation, not the answer)."""
    return _TRAILING_PERIOD_RE.sub("", text, count=1)


def from_json_answer(task: Task, answer: Any, strict: bool = False) -> ParseResult:
    """Read a JSON ``answer`` value: strings as they are, numbers via their JSON text (``18.0`` -> 18 when
    lenient; not canonical, so ``invalid``, when ``strict``).

    Booleans, null, arrays and objects are never answers, nor the shape the format asks for (its schema types the
    answer as a string, or a number where the prompt shows one): ``no_answer`` for the strict parser (raw kept),
    so paper 003's format-level parse rate (``report.load.format_ok``) does not count them (issue 49); the lenient
    parser calls them ``invalid``.
    """
    if isinstance(answer, str):
        return from_raw(task, answer, strict)
    raw = json.dumps(answer, ensure_ascii=False)
    if isinstance(answer, bool) or not isinstance(answer, int | float):
        return ParseResult("no_answer" if strict else "invalid", None, raw)
    return from_raw(task, raw, strict)
