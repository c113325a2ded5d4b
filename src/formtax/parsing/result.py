"""The outcome of parsing one model output."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

ParseStatus = Literal["ok", "no_answer", "invalid"]


@dataclass(frozen=True)
class ParseResult:
    """What a parser found.

    ``ok``: an answer in the task's answer type, ``value`` normalised by ``Task.normalize``.
    ``invalid``: the answer's place was found (``raw``) but it does not normalise (e.g. "twelve" for an integer
    task); ``value`` is None. ``no_answer``: the expected shape is missing; ``value`` and ``raw`` are None.
    Keeping ``invalid`` apart from ``no_answer`` separates format failures from answer-space failures, which is
    what the format (FC) and validity (VC) constraints respectively remove.
    """

    status: ParseStatus
    value: str | None
    raw: str | None

    @property
    def ok(self) -> bool:
        """Whether an answer was extracted."""
        return self.status == "ok"


NO_ANSWER = ParseResult("no_answer", None, None)
