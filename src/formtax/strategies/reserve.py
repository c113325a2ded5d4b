"""The answer's reserve and the budget it needs: how many of a request's ``max_tokens`` its answer takes, and the
refusals, before any model call, of a budget no answer fits (closing mode).

Apart from the strategies (strategies/base.py) because it is arithmetic over a constraint and a tokenizer that every
strategy shares, and no strategy's behaviour: the runner gives every constraint level of a strategy the same
reasoning budget (``max_tokens = R + answer_overhead``), and each strategy's ``answer_overhead`` is built from
:func:`answer_reserve` and, under closing mode, :func:`closing_room`.
"""

from __future__ import annotations

from typing import Protocol

from formtax.constraints.closing import START_MS, closing_oracle, start_search, start_witness
from formtax.constraints.closing_bound import min_json_bytes
from formtax.constraints.compile import compile_grammar
from formtax.constraints.shortest import longest_token
from formtax.constraints.spec import ChoiceConstraint, Constraint, JsonConstraint
from formtax.decoding.engine import Backend
from formtax.errors import ConfigError


class Asked(Protocol):
    """What the reserve reads of a request (:class:`~formtax.strategies.base.Request` is one)."""

    constraint: Constraint | None
    closing: bool


DEFAULT_RESERVE = 64  # answer budget for constraints whose length has no bound (user regex, JSON, Lark)


def answer_reserve(constraint: Constraint | None) -> int:
    """Tokens reserved for the answer: the constraint's bound plus one for EOS."""
    if constraint is None:
        return 0
    bound = constraint.max_tokens
    return (bound if bound is not None else DEFAULT_RESERVE) + 1


def request_reserve(backend: Backend, request: Asked) -> int:
    """The answer's reserve for this request. With closing mode a choice reserves its *likely* length, the
    longest option's canonical tokenisation (``positive|negative|neutral``: 1-2 tokens, where the byte-level
    worst case is 8): if the model starts an option in smaller pieces, closing mode steers it to finish inside
    the reserve. Without closing, and for every other constraint, the bound of :func:`answer_reserve`."""
    c = request.constraint
    if request.closing and isinstance(c, ChoiceConstraint):
        return closing_room(backend, c, answer_reserve(c))  # the longest option's own tokenisation, + 1
    return answer_reserve(c)


PLAUSIBLE_SLACK = 16
"""Closing mode's room for an answer past its shortest form, in tokens (ours; see :func:`closing_room`)."""


def closing_room(backend: Backend, constraint: Constraint, worst: int) -> int:
    """Closing mode's reserve for an answer (issue 45): what it plausibly takes, not the byte-level worst case.

    Closing already guarantees that the answer finishes inside the budget whenever a completion fits, so a reserve
    only has to leave the answer room to be written as the model would write it: the shortest completion of its
    grammar in the model's own tokens (closing's start witness, canonically tokenised) plus
    :data:`PLAUSIBLE_SLACK` tokens and one for EOS; a choice reserves its longest option's own tokenisation. Never
    more than ``worst`` (the bound without closing). An answer longer than its room still completes: closing then
    shortens it where the reasoning took the rest, and counts what it changed (``closing_changed_tokens``)."""
    tok = backend.tokenizer
    if isinstance(constraint, ChoiceConstraint):
        return min(worst, max(len(tok.encode(o)) for o in constraint.options) + 1)
    w = start_witness(compile_grammar(constraint.grammar, tok.engine), tok.n_logits)
    return worst if w is None else min(worst, len(w) + PLAUSIBLE_SLACK + 1)


def refuse_below_bound(backend: Backend, constraint: Constraint, limit: int) -> None:
    """Closing mode: a JSON schema whose every instance takes more bytes than ``limit`` tokens can carry is refused
    at once, before its grammar is compiled (constraints/closing_bound.py)."""
    if isinstance(constraint, JsonConstraint):
        need, most = min_json_bytes(constraint.schema), longest_token(backend.tokenizer.engine)
        if need > limit * most:
            raise ConfigError(f"closing mode: no completion of {constraint.brief()!r} fits in {limit} tokens (every "
                              f"instance takes at least {need} bytes and one token carries at most {most}); raise "
                              "max_tokens")


def refuse_no_completion(backend: Backend, constraint: Constraint, limit: int) -> None:
    """Closing mode, before any model call: the answer must have a completion within ``limit`` tokens. A JSON
    schema whose every instance takes more bytes than ``limit`` tokens can carry is refused at once
    (constraints/closing_bound.py); otherwise the start witness decides, its search bounded in time (a request
    whose search runs out of time is refused with that reason, never left to search for a minute)."""
    tok = backend.tokenizer
    what = f"closing mode: no completion of {constraint.brief()!r} fits in {limit} tokens"
    refuse_below_bound(backend, constraint, limit)
    oracle, key = closing_oracle(constraint)
    w = start_search(compile_grammar(constraint.grammar, tok.engine), tok.n_logits, limit, oracle, key)
    if (w.tokens is None or len(w.tokens) > limit) and oracle is not None:  # no answer the oracle accepts found:
        w = start_search(compile_grammar(constraint.grammar, tok.engine), tok.n_logits, limit)  # the grammar's own
    if w.timed_out:
        raise ConfigError(f"closing mode: closing could not prove a completion of {constraint.brief()!r} within "
                          f"{START_MS} ms (budget {limit} tokens); raise max_tokens or turn closing off")
    if w.tokens is None or len(w.tokens) > limit:
        found = "none found" if w.tokens is None else f"the shortest found takes {len(w.tokens)}"
        raise ConfigError(f"{what} ({found}); raise max_tokens")
