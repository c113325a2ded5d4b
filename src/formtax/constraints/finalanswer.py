"""The one reading rule for a final answer after a key phrase (issue 60: every strategy's reader shares it).

Deco-G's answer span (``strategies/decog.py``, placement ``anywhere``), the strict key-phrase parser
(``parsing/strict.py``) and the library's reading of free text (``TemplateConstraint.search``) all read a
key-phrase answer here, so the same text gets the same verdict whichever strategy wrote it: a decog-vs-baseline
difference then comes from the model, never from the reader.

The rule (ours; paper 001 only says the phrase may sit anywhere and the last one counts):

1. the **last** occurrence of the phrase (``The final answer is ``, ``The rating is ``) anywhere in the text;
2. after it (any whitespace skipped), the answer is the run of non-space characters;
3. from that run, leading Markdown emphasis (``*``, ``_``) and trailing sentence punctuation and emphasis
   (``. , ; : ! ?``, ``*``, ``_``) are dropped: ``**The final answer is 19**``, ``... is 19;`` and ``... is 19!``
   all read ``19``;
4. nothing else is repaired: ``19%``, ``19-20``, ``4/5``, ``19.99`` and ``1,234`` stay as written, so the task's
   canonical reading calls them invalid for every strategy alike.

The phrase's answers are single words (numbers, letters, one-word labels); :func:`word_slot` says which template
slots this reading is for (a ``{str}`` slot or a choice with a space in an option keeps the template's own
search).
"""

from __future__ import annotations

from typing import NamedTuple

LEADING = "*_"
TRAILING = ".,;:!?*_"


class FinalAnswer(NamedTuple):
    """Character offsets in the text read: the phrase's start, and the answer's start and end."""

    phrase_start: int
    start: int
    end: int


def final_answer(text: str, phrase: str) -> FinalAnswer | None:
    """Where the answer after the last ``phrase`` lies in ``text`` (see the module docstring), or None when the
    phrase does not occur. An empty answer (the phrase ends the text) has ``start == end``."""
    at = text.rfind(phrase)
    if at < 0 or not phrase:
        return None
    pos = at + len(phrase)
    while pos < len(text) and text[pos].isspace():
        pos += 1
    end = pos
    while end < len(text) and not text[end].isspace():
        end += 1
    while pos < end and text[pos] in LEADING:
        pos += 1
    while end > pos and text[end - 1] in TRAILING:
        end -= 1
    return FinalAnswer(at, pos, end)


def answer_after(text: str, phrase: str) -> str | None:
    """The raw answer after the last ``phrase`` (possibly empty), or None when the phrase does not occur."""
    found = final_answer(text, phrase)
    return None if found is None else text[found.start : found.end]


def word_slot(kind: str, options: tuple[str, ...] = ()) -> bool:
    """Whether a slot's answers are single words, which this rule reads: integers, letters, and choices whose
    options hold no whitespace."""
    if kind in ("int", "letters"):
        return True
    return kind == "choice" and bool(options) and not any(any(c.isspace() for c in o) for o in options)
