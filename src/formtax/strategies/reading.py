"""Reading an answer back out of a strategy's text: ``formtax.parse`` (the text a vLLM client got from formtax's
plugin, a stored output) and every Result formtax assembles read the answer with the same code.

A strategy's Result knows its phases (which tokens were reasoning and which the answer); a text alone does not, so
:func:`answer_span` finds the answer where the strategy writes it: the whole text (constrained, json), its first
line (short), the text searched for the answer (free), or, for InWriting, the suffix after the line break where
the answer starts (``Result.text`` and the plugin's text put InWriting's answer on its own line). The span is then
read by :meth:`SinglePass.read` (the oracle's validation, a JSON answer's ``answer`` field), as in assembly.
"""

from __future__ import annotations

from formtax.constraints.spec import Constraint
from formtax.strategies.base import Request, Result, SinglePass, get_strategy

READABLE = ("constrained", "json", "inwriting", "short", "free")
TEXT_BUDGET = 1 << 20  # the budget a text is read under (no reasoning bound applies to a text already written)


def answer_span(strategy: str, text: str, constraint: Constraint | None) -> tuple[str, str | None]:
    """(the reasoning, the answer's text or None where the answer is searched for in the whole text)."""
    if strategy in ("constrained", "json"):
        return "", text
    if strategy == "short":
        return "", text.split("\n", 1)[0]
    if strategy == "free" or constraint is None:
        return "", None
    # InWriting: the leftmost start, at the text's start or after a line break, from which the rest is an answer;
    # then any other white-space boundary (a reasoning that ended in white space gets no line break)
    starts = [0, *(k + 1 for k, c in enumerate(text) if c == "\n")]
    starts += [k for k in range(1, len(text)) if text[k - 1].isspace() and k not in starts]
    for k in starts:
        if constraint.validate(text[k:]).ok:
            reasoning = text[:k]
            return (reasoning[:-1] if reasoning.endswith("\n") else reasoning), text[k:]
    cut = text.rfind("\n")
    return text[: max(cut, 0)], text[cut + 1:]


def parse_text(text: str, constraint: Constraint | None, strategy: str = "constrained",
               finish_reason: str = "") -> Result:
    """The Result of reading ``text`` as ``strategy`` wrote it (module docstring): ``parsed``, ``parse_ok``,
    ``parse_error``, ``answer_text`` and ``reasoning`` filled as formtax fills them when it decodes."""
    if strategy not in READABLE:
        raise ValueError(f"formtax.parse reads the text of {', '.join(READABLE)}; {strategy!r} is not one text")
    strat = get_strategy(strategy)
    assert isinstance(strat, SinglePass)
    reasoning, answer = answer_span(strategy, text, constraint)
    res = Result(strategy=strategy, model="", text=text, reasoning=reasoning, finish_reason=finish_reason,
                 answer_text=answer)
    strat.read(res, Request("", constraint, max_tokens=TEXT_BUDGET), strat.constrained_answer and constraint is not None)
    return res
