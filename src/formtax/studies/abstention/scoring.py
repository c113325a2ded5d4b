"""Deterministic scoring of tool-selection and abstention outputs (paper 002 section 3.4; no LLM judge).

An output is read by *mentions*: occurrences of the item's own candidate names and of the abstention token
``None``. The rules, and why each one is there:

- Only the item's ten candidates are matched. A tool that the item does not offer cannot be "selected", and
  matching the whole 199-tool pool would turn ordinary words in a justification into answers.
- A mention needs ASCII word boundaries on both sides (no ASCII letter, digit or underscore next to it). Tool
  names are ASCII identifiers, so ``web`` never matches inside ``web_scraper``; using ASCII rather than
  Unicode word characters lets a name followed directly by a non-Latin particle (``Zapier를``) still count.
- Names are matched longest first and a match may not overlap one already taken, so no name is ever matched
  inside a longer name (``URLTool`` inside ``PDF&URLTool``), whatever the boundary characters are.
- Matching is case-sensitive: the names are identifiers and the prompt asks for the literal ``None``; lowering
  case would read "none of these" or a sentence-initial "Now" as answers.

The decision is the first enum member (candidate or ``None``) mentioned, provided at most one distinct
candidate is mentioned. This is exactly the adopted single-match and ordering rules: an abstention item is
correct iff the output contains ``None`` and mentions no candidate or one only after ``None``; a tool-needed
item is correct iff it mentions exactly the gold tool, ahead of any ``None``. The departure from the source
rules (Lee et al. 2026b) is deliberate: two or more distinct candidates are scored wrong and counted (``D2``)
instead of being referred to a judge.

Every output falls in exactly one :class:`Category`; the categories of the wrong outputs are what the
transition analysis counts.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

ABSTAIN = "None"
"""The abstention token: the gold of every abstention item, and the extra option of the choice grammar."""

_BOUNDARY_BEFORE = r"(?<![A-Za-z0-9_])"
_BOUNDARY_AFTER = r"(?![A-Za-z0-9_])"


class Category(StrEnum):
    """What one output is, under the scoring rules (exclusive and exhaustive)."""

    CORRECT = "correct"
    D0 = "D0"
    """No readable answer: neither a candidate nor the abstention token."""
    D2 = "D2"
    """Two or more distinct candidates named: wrong, counted separately."""
    ORDER = "order"
    """The gold answer is there, but the ordering rule refuses it (``None`` and the tool in the wrong
    order)."""
    WRONG = "wrong"
    """A readable, single answer that is not the gold."""


@dataclass(frozen=True)
class Mention:
    """One occurrence of an enum member in an output: ``text[start:end] == name``."""

    name: str
    start: int
    end: int


@dataclass(frozen=True)
class AbstentionScore:
    """The verdict on one output.

    ``decision`` is the first enum member mentioned (None when the output is D0 or D2); ``named`` lists the
    distinct candidates mentioned, in order of first mention (the abstention token excluded).
    """

    correct: bool
    category: Category
    decision: str | None
    named: tuple[str, ...]
    abstained: bool
    mentions: tuple[Mention, ...]


def check_candidates(candidates: Sequence[str], gold: str) -> None:
    """Refuse an answer space the rules are not defined on, naming the problem.

    The gold must be ``None`` or one of the candidates; a gold that is neither is the symptom of taking the
    abstention file's ``tool`` field (the tool removed from the list) as the label, so it is named as such.
    """
    if not candidates:
        raise ValueError("an item needs at least one candidate tool")
    if len(set(candidates)) != len(candidates):
        raise ValueError(f"duplicate candidate names in {list(candidates)}")
    if ABSTAIN in candidates:
        raise ValueError(f"the abstention token {ABSTAIN!r} cannot also be a candidate name")
    if any(not name or name != name.strip() for name in candidates):
        raise ValueError(f"candidate names must be non-empty and unpadded: {list(candidates)}")
    if gold != ABSTAIN and gold not in candidates:
        raise ValueError(
            f"gold {gold!r} is neither {ABSTAIN!r} nor one of the item's candidates {list(candidates)}; "
            f"the gold of an abstention item is {ABSTAIN!r} (the abstention file's 'tool' field names the "
            "removed tool and is never a gold label)"
        )


def find_mentions(text: str, candidates: Sequence[str]) -> list[Mention]:
    """Every non-overlapping mention of a candidate or ``None`` in ``text``, in text order.

    Longest names claim their spans first (ties broken alphabetically, so the result never depends on the
    candidate order), then shorter names may only use what is left.
    """
    names = sorted({*candidates, ABSTAIN}, key=lambda n: (-len(n), n))
    taken: list[tuple[int, int]] = []
    found: list[Mention] = []
    for name in names:
        pattern = re.compile(_BOUNDARY_BEFORE + re.escape(name) + _BOUNDARY_AFTER)
        for m in pattern.finditer(text):
            start, end = m.span()
            if any(start < t_end and t_start < end for t_start, t_end in taken):
                continue
            taken.append((start, end))
            found.append(Mention(name, start, end))
    found.sort(key=lambda m: m.start)
    return found


def score_output(text: str, candidates: Sequence[str], gold: str) -> AbstentionScore:
    """Score one output against an item's candidates and gold (``None`` for an abstention item)."""
    check_candidates(candidates, gold)
    mentions = tuple(find_mentions(text, candidates))
    named: list[str] = []
    for m in mentions:
        if m.name != ABSTAIN and m.name not in named:
            named.append(m.name)
    abstained = any(m.name == ABSTAIN for m in mentions)
    if not mentions:
        return AbstentionScore(False, Category.D0, None, (), False, mentions)
    if len(named) >= 2:
        return AbstentionScore(False, Category.D2, None, tuple(named), abstained, mentions)
    decision = mentions[0].name
    if decision == gold:
        return AbstentionScore(True, Category.CORRECT, decision, tuple(named), abstained, mentions)
    gold_present = any(m.name == gold for m in mentions)
    category = Category.ORDER if gold_present else Category.WRONG
    return AbstentionScore(False, category, decision, tuple(named), abstained, mentions)
