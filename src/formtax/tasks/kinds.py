"""Answer-space base classes: integer, multiple-choice and letter-string tasks.

Each fixes how an answer is normalised, described in the prompt and constrained (VC slot), so the three agree
for every task of that kind.
"""

from __future__ import annotations

import re
import string
from typing import ClassVar

from formtax.constraints.template import choice_slot
from formtax.tasks.base import AnswerKind, Item, Task

_INTEGER_RE = re.compile(r"[+-]?\d+(?:\.0+)?")
_CANONICAL_INTEGER_RE = re.compile(r"-?(?:0|[1-9][0-9]*)")  # the {int} slot's surface form (template.py)
_CANONICAL_LETTERS_RE = re.compile(r"[a-z]+")
_STRIP_CHARS = set(string.punctuation) | set(string.whitespace) | set("\u2018\u2019\u201c\u201d\u00a0")


def normalize_integer(value: str) -> str | None:
    """Canonical decimal string of an integer answer, or None.

    Commas, ``$`` and whitespace are removed anywhere, a Unicode minus becomes ``-``, and an all-zero fractional
    part (``18.0``, ``18.00``) is dropped; anything else that is not a whole number gives None.
    """
    cleaned = value.replace(",", "").replace("$", "").replace("\u2212", "-")
    cleaned = "".join(cleaned.split())
    if not _INTEGER_RE.fullmatch(cleaned):
        return None
    return str(int(cleaned.split(".")[0]))


def canonical_integer(value: str) -> str | None:
    """``value`` (stripped) if it is written as the VC slot writes integers: digits, an optional ``-``, no
    leading zeros, no separators or decimals (``28`` yes; ``28.00``, ``2,8``, ``028``, ``$28`` no). ``-0`` is not
    canonical (zero is written ``0``): every task's VC range is non-negative, and there the grammar writes no minus
    sign (``Slot.accepts`` and the JSON oracle's ``integer_literal_error`` refuse ``-0`` too), so the strict
    parser calls it ``invalid`` in an answer line and in JSON alike (issue 60); the lenient parser reads it as 0."""
    cleaned = value.strip()
    if not _CANONICAL_INTEGER_RE.fullmatch(cleaned) or cleaned == "-0":
        return None
    return str(int(cleaned))


def canonical_letters(value: str) -> str | None:
    """``value`` stripped and lowercased if it is then only ASCII letters (``HENE`` -> ``hene``; ``H E N E`` and
    ``h-e`` no). Lowercasing is paper 003's case rule: its unconstrained parser reads ``H E N E`` as
    ``h e n e``, wrong only for the spaces."""
    cleaned = value.strip().lower()
    return cleaned if _CANONICAL_LETTERS_RE.fullmatch(cleaned) else None


def normalize_letters(value: str) -> str | None:
    """Lowercase ASCII letters with spaces and punctuation removed (``"H E N E"`` -> ``"hene"``), or None.

    Any other character left over (a digit, a non-ASCII letter) means the value is not a letter string.
    """
    cleaned = "".join(ch for ch in value if ch not in _STRIP_CHARS).lower()
    if not cleaned or not all("a" <= ch <= "z" for ch in cleaned):
        return None
    return cleaned


def integer_description(low: int | None, high: int | None) -> str:
    """How a prompt describes an integer answer in ``[low, high]`` (either bound optional); matches the slot."""
    if low == 0 and high is None:
        kind = "a non-negative integer"
    elif low is not None and high is not None:
        kind = f"an integer from {low} to {high}"
    else:
        kind = "an integer"
    return f"{kind}, written with digits only (no units)"


class IntegerTask(Task):
    """A task whose answer is an integer; the VC range is ``[vc_min, vc_max]`` (either bound optional)."""

    answer_kind: ClassVar[AnswerKind] = AnswerKind.INTEGER
    vc_min: ClassVar[int | None] = 0
    vc_max: ClassVar[int | None] = None

    def _vc_slot(self, item: Item) -> str:
        low = "" if self.vc_min is None else str(self.vc_min)
        high = "" if self.vc_max is None else str(self.vc_max)
        if not low and not high:
            return "{int}"
        return f"{{int:{low}..{high}}}"

    def answer_description(self, item: Item) -> str:
        return integer_description(self.vc_min, self.vc_max)

    def normalize(self, value: str) -> str | None:
        return normalize_integer(value)

    def canonical(self, value: str) -> str | None:
        return canonical_integer(value)


class ChoiceTask(Task):
    """A task whose answer is one label from a fixed set (letters A-E, or words for IMDb).

    ``normalize`` matches a label case-insensitively and returns its canonical spelling; the choice text is not
    accepted as an answer, because the prompt asks for the label.
    """

    answer_kind: ClassVar[AnswerKind] = AnswerKind.CHOICE
    all_labels: ClassVar[tuple[str, ...]] = ("A", "B", "C", "D", "E")

    def item_labels(self, item: Item) -> tuple[str, ...]:
        """The labels valid for this item (all task labels when the item lists no choices)."""
        return item.labels or self.all_labels

    def _vc_slot(self, item: Item) -> str:
        return choice_slot(self.item_labels(item))

    def answer_description(self, item: Item) -> str:
        return "one of the labels " + ", ".join(self.item_labels(item))

    def normalize(self, value: str) -> str | None:
        key = value.strip().casefold()
        for label in self.all_labels:
            if label.casefold() == key:
                return label
        return None


class LettersTask(Task):
    """A task whose answer is a string of exactly ``length`` lowercase letters."""

    answer_kind: ClassVar[AnswerKind] = AnswerKind.LETTERS
    length: ClassVar[int]

    def _vc_slot(self, item: Item) -> str:
        return f"{{letters:{self.length}}}"

    def answer_description(self, item: Item) -> str:
        return f"a string of {self.length} lowercase letters"

    def normalize(self, value: str) -> str | None:
        return normalize_letters(value)

    def canonical(self, value: str) -> str | None:
        return canonical_letters(value)


def choice_question(stem: str, choices: tuple[tuple[str, str], ...]) -> str:
    """The question text with its options inline, one per line as ``(A) text``.

    The lenient parser recognises ``(A)``-style labels, and every choice task uses this one layout so prompts
    differ across tasks only in content.
    """
    options = "\n".join(f"({label}) {text}" for label, text in choices)
    return f"{stem.strip()}\n\nAnswer choices:\n{options}"
