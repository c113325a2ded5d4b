"""Helpers shared by the parsers: turning a raw answer string or JSON value into a ``ParseResult``."""

from __future__ import annotations

import functools
import json
import re
from typing import Any

from formtax.constraints.jsonreason import JsonAnswerObject
from formtax.constraints.spec import Constraint, TemplateConstraint
from formtax.parsing.result import ParseResult
from formtax.tasks.base import Item, Task

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


@functools.lru_cache(maxsize=4096)
def _answer_space(slot: str, json_answer: bool) -> Constraint:
    """The reader's own check of an answer value: the item's VC slot as the constrained strategy validates it, or
    as paper 003's JSON answer object types its ``answer`` field (built without the engine: validating needs no
    grammar)."""
    line = TemplateConstraint(slot)
    return JsonAnswerObject(line) if json_answer else line


def in_answer_space(task: Task, item: Item, value: str, json_string: bool | None = None) -> bool:
    """Whether ``value`` (an answer in the task's canonical spelling) lies in the item's answer space, decided by
    the reader that ``formtax.parse`` and every decoded Result use (issue 56: one reader): the VC slot's
    ``validate`` (an integer's range, a letter string's length), and for a JSON answer (``json_string``: written
    as a JSON string, or as a number when False) also its JSON type, so ``"5"`` is no integer.

    A choice is left to the task (True): its labels are read by the task's own rule (:meth:`Task.canonical`: a
    label in any case, imdb-alt's synonyms mapped to their class), which the slot's exact words do not know."""
    slot = task.answer_slot("vc", item)
    line = _answer_space(slot, False)
    assert isinstance(line, TemplateConstraint)
    if any(s.kind == "choice" for s in line.template.slots):
        return True
    if json_string is None:
        return line.validate(value).ok
    literal = json.dumps(value, ensure_ascii=False) if json_string else value
    return _answer_space(slot, True).validate('{"answer": ' + literal + "}").ok


def checked(result: ParseResult, task: Task, item: Item, json_string: bool | None = None) -> ParseResult:
    """``result``, or ``invalid`` (raw kept) where its ``ok`` value is outside the item's answer space
    (:func:`in_answer_space`): the right shape holding a value the answer's constraint refuses. The strict
    parser's shape and spelling rules are paper 003's format-following measure and stay its own; this check is
    the one it shares with the reader, so the runner and ``formtax.generate`` read one text alike."""
    if result.status != "ok" or result.value is None or in_answer_space(task, item, result.value, json_string):
        return result
    return ParseResult("invalid", None, result.raw)
