"""The most bytes any completion of a constraint can take, where that is cheap to know (issue 56, item 4).

Closing mode (constraints/closing.py) only ever acts where what is left of the budget cannot hold a completion. If
every string the grammar accepts takes at most ``n`` bytes, a token is at least one byte and EOS one more token,
then a row of ``n + 1`` tokens or more can never reach that point: closing is provably idle, and the row needs only
its grammar (vLLM's structured outputs can then run it). The bound must never be too small (closing would be
skipped where it could act), so it errs high (ours):

* ``choice``: the longest option, in UTF-8;
* ``regex``: Python's own parse of the pattern gives its longest match in characters (the grammar engine reads the
  same pattern: spec.py refuses the dialect differences), at 4 bytes a character;
* anything else (templates, JSON Schema, Lark): unknown (None), so closing stays live.
"""

from __future__ import annotations

from formtax.constraints.spec import ChoiceConstraint, Constraint, RegexConstraint

UTF8_MAX = 4  # bytes in the longest UTF-8 character


def longest_bytes(constraint: Constraint) -> int | None:
    """An upper bound on the bytes of any string ``constraint`` accepts, or None when unbounded or unknown."""
    if isinstance(constraint, ChoiceConstraint):
        return max(len(o.encode()) for o in constraint.options)
    if isinstance(constraint, RegexConstraint):
        import re._constants as sre_constants
        import re._parser as sre_parse

        try:
            _, most = sre_parse.parse(constraint.source).getwidth()
        except Exception:  # noqa: BLE001 - a pattern Python parses differently: unknown, so closing stays live
            return None
        return None if most >= sre_constants.MAXREPEAT else most * UTF8_MAX
    return None


def closing_idle(constraint: Constraint, limit: int) -> bool:
    """Whether closing mode can never act on a row of ``limit`` tokens for ``constraint`` (see the module
    docstring): every completion, one byte a token at worst, and its EOS fit."""
    most = longest_bytes(constraint)
    return most is not None and most + 1 <= limit
