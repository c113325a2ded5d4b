"""The single-pass base strategies: free, short, constrained, json (ALGORITHMS.md sections 1-3)."""

from __future__ import annotations

from typing import Any

from formtax.backends.base import Backend
from formtax.constraints.closing import start_witness
from formtax.constraints.compile import compile_grammar
from formtax.constraints.spec import JSON_SCAFFOLD, ChoiceConstraint, Constraint, JsonReasonAnswer
from formtax.decoding.loop import Policy
from formtax.strategies.base import (
    DEFAULT_RESERVE,
    Request,
    Result,
    SinglePass,
    answer_reserve,
    closing_limit,
    register,
    with_prefix,
)
from formtax.strategies.firstmass import EVENT as FIRST_MASS
from formtax.strategies.firstmass import FirstTokenMass, allowed_first_tokens
from formtax.strategies.policies import ConstrainedPolicy, FreePolicy


def constrained_policy(backend: Backend, constraint: Constraint, phase: str = "answer",
                       closing_limit: int | None = None) -> ConstrainedPolicy:
    """The constraint's policy; ``closing_limit``: closing mode over that many tokens (the row's budget after
    any forced prefix; constraints/closing.py)."""
    tok = backend.tokenizer
    compiled = compile_grammar(constraint.grammar, tok.engine)
    policy = ConstrainedPolicy(compiled.matcher(tok.n_logits), tok.eos_ids, phase=phase, closing_limit=closing_limit)
    if policy.closer is not None:
        policy.closer.start_from(start_witness(compiled, tok.n_logits))
    return policy


@register
class Free(SinglePass):
    name = "free"
    summary = "unconstrained greedy (or sampled) decoding to EOS or the budget; the answer is read from the text"
    requires_constraint = False
    constrained_answer = False

    def policy(self, backend: Backend, request: Request) -> Policy:
        return with_prefix(backend, request, FreePolicy(backend.tokenizer.eos_ids, phase="reasoning"))


@register
class Short(SinglePass):
    name = "short"
    summary = "unconstrained, stopped at the first token containing a newline; the line is the answer"
    # With a choice answer, the first step also records the probability mass outside the tokens that can begin
    # an option (stats["first_token_mass"], strategies/firstmass.py); nothing is masked.
    requires_constraint = False
    constrained_answer = False
    output_format = "answer-only"

    def policy(self, backend: Backend, request: Request) -> Policy:
        tok = backend.tokenizer
        policy: Policy = FreePolicy(tok.eos_ids, tok.newline_ids, phase="answer")
        if isinstance(request.constraint, ChoiceConstraint):  # paper 002's mechanism variable; no mask
            policy = FirstTokenMass(policy, allowed_first_tokens(tok, request.constraint.options))
        return with_prefix(backend, request, policy)

    def fill_answer(self, res: Result, request: Request, out: Any, phases: dict[str, str], constrained: bool) -> None:
        res.answer_text = phases.get("answer", "").split("\n", 1)[0]
        for event in out.events:  # the first-token masked mass, when the answer is a choice
            if FIRST_MASS in event:
                res.stats[FIRST_MASS] = event[FIRST_MASS]


@register
class Constrained(SinglePass):
    name = "constrained"
    summary = "the answer constraint from the first token (constrained greedy; no free reasoning)"
    output_format = "answer-only"

    def min_budget(self, request: Request) -> int:
        c = request.constraint
        return answer_reserve(c) if c is not None and c.max_tokens is not None else 1

    def closing_min_budget(self, backend: Backend, request: Request) -> int:
        return 1  # closing mode's own check (a completion fits) replaces the worst-case bound

    def closing_target(self, backend: Backend, request: Request) -> tuple[Constraint, int] | None:
        limit = closing_limit(backend, request)
        return None if request.constraint is None or limit is None else (request.constraint, limit)

    def policy(self, backend: Backend, request: Request) -> Policy:
        assert request.constraint is not None
        if not request.constrain:
            return with_prefix(backend, request, FreePolicy(backend.tokenizer.eos_ids, phase="answer"))
        return with_prefix(backend, request, constrained_policy(backend, request.constraint,
                                                                closing_limit=closing_limit(backend, request)))




@register
class Json(SinglePass):
    name = "json"
    summary = 'one compact JSON object {"reason": free text, "answer": typed answer}, constrained throughout'
    output_format = "json"

    @staticmethod
    def _answer_bound(c: Constraint) -> int:
        return JsonReasonAnswer.answer_bound(c, DEFAULT_RESERVE)

    def min_budget(self, request: Request) -> int:
        assert request.constraint is not None
        return JSON_SCAFFOLD + self._answer_bound(request.constraint) + 2

    def answer_overhead(self, request: Request) -> int | None:
        assert request.constraint is not None
        return JSON_SCAFFOLD + self._answer_bound(request.constraint) + 1

    def effective_constraint(self, request: Request) -> Constraint | None:
        if request.constraint is None:
            return None
        c = request.constraint
        reason = request.max_tokens - (self.answer_overhead(request) or 0)
        return JsonReasonAnswer(c, reason_tokens=max(1, reason))

    def closing_target(self, backend: Backend, request: Request) -> tuple[Constraint, int] | None:
        c, limit = self.effective_constraint(request), closing_limit(backend, request)
        return None if c is None or limit is None else (c, limit)

    def policy(self, backend: Backend, request: Request) -> Policy:
        c = self.effective_constraint(request)
        assert c is not None
        if not request.constrain:
            return with_prefix(backend, request, FreePolicy(backend.tokenizer.eos_ids, phase="answer"))
        return with_prefix(backend, request, constrained_policy(backend, c,
                                                                closing_limit=closing_limit(backend, request)))

    def fill_answer(self, res: Result, request: Request, out: Any, phases: dict[str, str], constrained: bool) -> None:
        res.answer_text = phases.get("answer")

    def after_parse(self, res: Result) -> None:
        if res.parse_ok and isinstance(res.parsed, dict):
            res.reasoning = (res.reasoning or "") + str(res.parsed.get("reason", ""))
            res.parsed = res.parsed.get("answer")
