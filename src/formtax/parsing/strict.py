"""The strict parser: accepts exactly the output format the prompt asked for, nothing more.

- REASON_ANSWER: the last non-empty line (stripped) must be the task's answer line (:attr:`Task.answer_prefix`
  and the answer: ``The answer is: <answer>``, SummEval's ``The rating is <answer>``), with one optional
  trailing period (a sentence end, not part of the answer). Case and the prefix are exact.
- ANSWER_ONLY: the whole stripped output must be that single line.
- JSON: the whole stripped output must be one JSON object whose keys are exactly ``reason`` (a string) and
  ``answer``. Whitespace inside the JSON is fine; a Markdown code fence or any text around the object is not
  (paper 003 A.4.3 counts both as failures, since a schema-constrained decoder could never produce them).
  The answer is a JSON string or number, as the item's answer space types it (a number for an integer, as the
  prompt shows it: ``{"answer": "18"}`` is ``invalid``). ``NaN``, ``Infinity`` and ``-Infinity`` (not JSON,
  RFC 8259) and a repeated key (``{"answer": 3, "answer": 28}``, which ``json.loads`` would merge into its last
  value) are no object: ``no_answer``, as the FC oracle (:func:`formtax.constraints.spec.load_json`) refuses them.
- REASON_KEYPHRASE (Deco-G's format): the last key phrase (:attr:`Task.key_phrase`: ``The final answer is `` on
  GSM8K, ``The rating is `` on SummEval) anywhere in the text, followed by the answer, read by the one rule that
  Deco-G's answer span shares (:mod:`formtax.constraints.finalanswer`: the run of non-space characters after it,
  less leading emphasis and trailing sentence punctuation and emphasis), so a decog record and a free record with
  the same text always get the same verdict (issue 60).
- REASON_JSON / ANSWER_JSON (paper 003's JSON answer form): the output must end with the object
  ``{"answer": <answer>}`` and nothing after it (after free reasoning, or alone); the same answer rules as JSON.

A missing shape is ``no_answer``; the right shape with an answer that is not already in the task's canonical
representation (:meth:`Task.canonical`: ``28`` but not ``28.00`` or ``2,8``; ``hene`` or ``HENE`` but not
``H E N E``) is ``invalid``, and so is a canonical answer outside the item's answer space (issue 56: one reader):
an integer out of the VC slot's range, a letter string of another length, or a JSON answer of the wrong JSON type
(``{"answer": "5"}`` for an integer); a choice's labels stay the task's to read (its case rule, imdb-alt's words). That check is the reader's own
(:func:`formtax.parsing.common.in_answer_space`: the VC slot's ``validate``, the JSON answer object's schema, as
``formtax.parse`` and every decoded Result read them), so the runner's strict verdict and ``formtax.generate``'s
agree on one text. The shape and spelling rules above stay the strict parser's: they are paper 003's
format-following measure (its parse rate, "parsed according to the specified format schema"), which this module
keeps as the paper defines it. The strict parser repairs nothing: paper 003 (A.4.1) counts exactly these spellings
as the failures a validity constraint removes, so repairing them here would hide the validity gain. The
lenient parser (:mod:`formtax.parsing.lenient`) normalises them and is reported beside it.
"""

from __future__ import annotations

import json

from formtax.constraints.finalanswer import answer_after
from formtax.constraints.jsontail import trailing_json_object
from formtax.constraints.spec import DuplicateKey, no_duplicate_keys, refuse_constant
from formtax.parsing.common import checked, from_json_answer, from_raw, strip_trailing_period
from formtax.parsing.result import NO_ANSWER, ParseResult
from formtax.tasks.base import Item, OutputFormat, Task


def _answer_line(line: str, task: Task, item: Item) -> ParseResult:
    prefix = task.answer_prefix
    if not line.startswith(prefix):
        return NO_ANSWER
    raw = strip_trailing_period(line[len(prefix) :]).strip()
    if not raw:
        return ParseResult("invalid", None, raw)
    return checked(from_raw(task, raw, strict=True), task, item)


def _key_phrase(text: str, task: Task, item: Item) -> ParseResult:
    raw = answer_after(text, task.key_phrase)
    if raw is None:
        return NO_ANSWER
    if not raw:
        return ParseResult("invalid", None, raw)
    return checked(from_raw(task, raw, strict=True), task, item)


class _Literal(str):
    """A JSON number as the output wrote it (issue 49, one source of truth): ``-0`` and ``1e2`` are read as written,
    not as the 0 and 100.0 that ``json.loads`` makes of them, so the strict parser calls them ``invalid`` as the VC
    grammar refuses them."""


def _load(text: str) -> object:
    """The JSON value of ``text``, numbers as written; NaN / Infinity and repeated keys refused (ValueError)."""
    return json.loads(text, parse_int=_Literal, parse_float=_Literal, parse_constant=refuse_constant,
                      object_pairs_hook=no_duplicate_keys)


def _json_answer(answer: object, task: Task, item: Item) -> ParseResult:
    """A JSON ``answer`` value read in the task's canonical form, then checked against the item's answer space as
    the JSON token it was written as (a number, or a string)."""
    return checked(from_json_answer(task, answer, strict=True), task, item, not isinstance(answer, _Literal))


def _json_object(text: str, task: Task, item: Item) -> ParseResult:
    try:
        obj = _load(text)
    except (json.JSONDecodeError, DuplicateKey):
        return NO_ANSWER
    if (not isinstance(obj, dict) or set(obj) != {"reason", "answer"} or not isinstance(obj["reason"], str)
            or isinstance(obj["reason"], _Literal)):  # a number is not a reason
        return NO_ANSWER
    return _json_answer(obj["answer"], task, item)


def _answer_object(text: str, task: Task, item: Item, whole: bool) -> ParseResult:
    """Paper 003's JSON answer form: the text ends with exactly ``{"answer": <answer>}`` (after free reasoning,
    or alone when ``whole``); the answer in the task's canonical form, as in the JSON strategy."""
    found = trailing_json_object(text)
    if found is None or (whole and found != text):
        return NO_ANSWER
    try:
        obj = _load(found)
    except (json.JSONDecodeError, DuplicateKey):
        return NO_ANSWER
    if not isinstance(obj, dict) or set(obj) != {"answer"}:
        return NO_ANSWER
    return _json_answer(obj["answer"], task, item)


def parse_strict(text: str, task: Task, item: Item, output_format: OutputFormat) -> ParseResult:
    """Parse ``text`` only if it has exactly the requested format (see the module docstring)."""
    stripped = text.strip()
    fmt = OutputFormat(output_format)
    if fmt is OutputFormat.JSON:
        return _json_object(stripped, task, item)
    if fmt in (OutputFormat.REASON_JSON, OutputFormat.ANSWER_JSON):
        return _answer_object(stripped, task, item, whole=fmt is OutputFormat.ANSWER_JSON)
    if fmt is OutputFormat.REASON_KEYPHRASE:
        return _key_phrase(stripped, task, item)
    if fmt is OutputFormat.ANSWER_ONLY:
        if "\n" in stripped or "\r" in stripped:
            return NO_ANSWER
        return _answer_line(stripped, task, item)
    lines = [line.strip() for line in stripped.splitlines() if line.strip()]
    if not lines:
        return NO_ANSWER
    return _answer_line(lines[-1], task, item)
