"""The lenient parser: finds an answer wherever a reader could, to measure extractability, not compliance.

Stages, tried in this order; the first that yields a normalisable answer wins:

1. **Answer marker**: the last "the (final) answer is" (any case, optional colon), or the task's own answer line or
   key phrase (:attr:`Task.answer_prefix`, :attr:`Task.key_phrase`: SummEval's "The rating is") — the rest of that line, or the
   next non-empty line when the line ends there. Markdown emphasis, quotes and one trailing period are
   stripped; if the whole remainder does not normalise, the first candidate of the task's kind inside it is
   tried (see stage 3).
2. **JSON**: an object with an ``answer`` key inside a Markdown code fence, else anywhere in the text (the last
   such object wins).
3. **Kind fallback** over the whole text, last occurrence wins: integers — the last number (commas and ``$``
   allowed; a denominator after ``out of`` or ``/`` is not one); choice tasks — the last standalone label, as ``(B)``, ``B)``, ``**B**``, "answer: B",
   "option B", or a line holding only the label (word labels such as IMDb's: the last label word);
   letters — the last word with exactly the slot's number of letters.

If no stage yields a normalisable answer, the first unnormalisable candidate found is returned as ``invalid``,
else ``no_answer``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from typing import Any

from formtax.parsing.common import from_json_answer, from_raw, strip_trailing_period
from formtax.parsing.result import NO_ANSWER, ParseResult
from formtax.tasks.base import AnswerKind, Item, OutputFormat, Task
from formtax.tasks.kinds import ChoiceTask

_MARKER_RE = re.compile(r"the\s+(?:final\s+)?answer\s+is\s*:?[ \t]*", re.IGNORECASE)
_FENCE_RE = re.compile(r"```[A-Za-z]*[ \t]*\n(.*?)```", re.DOTALL)
# a denominator ("3 out of 5", "4/5") is no answer candidate: the score is the number before it (issue 60)
_NUMBER_RE = re.compile(r"(?<![\w.])(?<!out of )(?<!/)[-\u2212]?\$?\s?\d(?:[\d,]*\d)?(?:\.\d+)?(?![\w])")
_WORD_RE = re.compile(r"[A-Za-z]+")
_LETTERS_SLOT_RE = re.compile(r"\{letters:(\d+)\}")
_DECORATION = "*_`\"'\u201c\u201d\u2018\u2019 \t"


def _choice_patterns(labels: tuple[str, ...]) -> list[re.Pattern[str]]:
    alt = "|".join(re.escape(label) for label in sorted(labels, key=len, reverse=True))
    return [
        re.compile(rf"\(\s*({alt})\s*\)"),
        re.compile(rf"(?<![A-Za-z0-9])({alt})\)"),
        re.compile(rf"\*\*\s*\(?({alt})\)?\s*\*\*"),
        re.compile(rf"(?i:answer|option|choice)\s*(?:is)?\s*[:=\-]?\s*\(?({alt})(?![A-Za-z0-9])"),
        re.compile(rf"^[ \t]*\(?({alt})[.:)]?[ \t]*$", re.MULTILINE),
    ]


def _word_label_pattern(labels: tuple[str, ...]) -> re.Pattern[str]:
    alt = "|".join(re.escape(label) for label in sorted(labels, key=len, reverse=True))
    return re.compile(rf"(?<![A-Za-z])({alt})(?![A-Za-z])", re.IGNORECASE)


def _choice_labels(task: Task, item: Item) -> tuple[str, ...]:
    if isinstance(task, ChoiceTask):
        return task.item_labels(item)
    return item.labels


def _letters_length(task: Task, item: Item) -> int | None:
    match = _LETTERS_SLOT_RE.fullmatch(task.answer_slot("vc", item))
    return int(match.group(1)) if match else None


def _candidates(text: str, task: Task, item: Item) -> list[tuple[int, str]]:
    """Kind-specific answer candidates in ``text`` as (position, raw string), in text order."""
    kind = task.answer_kind
    found: list[tuple[int, str]] = []
    if kind is AnswerKind.INTEGER:
        found = [(m.start(), m.group(0)) for m in _NUMBER_RE.finditer(text)]
    elif kind is AnswerKind.CHOICE:
        labels = _choice_labels(task, item)
        if not labels:
            return []
        if all(len(label) == 1 for label in labels):
            for pattern in _choice_patterns(labels):
                found.extend((m.start(1), m.group(1)) for m in pattern.finditer(text))
        else:
            found = [(m.start(1), m.group(1)) for m in _word_label_pattern(labels).finditer(text)]
    elif kind is AnswerKind.LETTERS:
        length = _letters_length(task, item)
        found = [
            (m.start(), m.group(0))
            for m in _WORD_RE.finditer(text)
            if length is None or len(m.group(0)) == length
        ]
    return sorted(found)


def _marker_re(task: Task) -> re.Pattern[str]:
    """The answer markers: the generic one, and the task's own answer line and key phrase when they differ."""
    own = {p.strip().rstrip(":").strip() for p in (task.answer_prefix, task.key_phrase)}
    extra = sorted(o for o in own if o and not _MARKER_RE.fullmatch(o + " "))
    if not extra:
        return _MARKER_RE
    alt = "|".join(re.escape(o) for o in extra)
    return re.compile(rf"(?:{_MARKER_RE.pattern}|(?:{alt})\s*:?[ \t]*)", re.IGNORECASE)


def _marker_stage(text: str, task: Task, item: Item) -> ParseResult:
    matches = list(_marker_re(task).finditer(text))
    if not matches:
        return NO_ANSWER
    rest = text[matches[-1].end() :]
    lines = rest.split("\n")
    remainder = lines[0].strip()
    if not remainder:
        remainder = next((line.strip() for line in lines[1:] if line.strip()), "")
    cleaned = strip_trailing_period(remainder.strip(_DECORATION)).strip(_DECORATION)
    if not cleaned:
        return ParseResult("invalid", None, remainder)
    whole = from_raw(task, cleaned)
    if whole.ok:
        return whole
    for _, raw in _candidates(remainder, task, item):
        first = from_raw(task, raw.strip())
        if first.ok:
            return first
    return whole


def _json_objects(text: str) -> Iterator[dict[str, Any]]:
    decoder = json.JSONDecoder()
    for start in (m.start() for m in re.finditer(r"\{", text)):
        try:
            obj, _ = decoder.raw_decode(text, start)
        except json.JSONDecodeError:
            continue
        if isinstance(obj, dict) and "answer" in obj:
            yield obj


def _json_stage(text: str, task: Task, item: Item) -> ParseResult:
    fenced = [obj for block in _FENCE_RE.findall(text) for obj in _json_objects(block)]
    objects = fenced or list(_json_objects(text))
    if not objects:
        return NO_ANSWER
    return from_json_answer(task, objects[-1]["answer"])


def _fallback_stage(text: str, task: Task, item: Item) -> ParseResult:
    candidates = _candidates(text, task, item)
    if not candidates:
        return NO_ANSWER
    return from_raw(task, candidates[-1][1].strip())


_STAGES: tuple[Callable[[str, Task, Item], ParseResult], ...] = (_marker_stage, _json_stage, _fallback_stage)


def parse_lenient(text: str, task: Task, item: Item, output_format: OutputFormat) -> ParseResult:
    """Extract an answer from any output shape (see the module docstring); ``output_format`` is not used."""
    first_invalid: ParseResult | None = None
    for stage in _STAGES:
        result = stage(text, task, item)
        if result.ok:
            return result
        if result.status == "invalid" and first_invalid is None:
            first_invalid = result
    return first_invalid or NO_ANSWER
