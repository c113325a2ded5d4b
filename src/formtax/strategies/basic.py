"""The single-pass base strategies: free, short, constrained, json (docs/ALGORITHMS.md sections 1-3)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from formtax.constraints.closing import ClosingParse, closing_oracle, start_search, start_witness
from formtax.constraints.compile import compile_grammar
from formtax.constraints.extent import closing_idle
from formtax.constraints.jsonkeys import KeyGuard, quote_tokens
from formtax.constraints.jsonreason import (
    JSON_SCAFFOLD,
    JsonLayout,
    JsonReasonAnswer,
    layout_tokens,
    string_value_span,
)
from formtax.constraints.jsonstrings import caps_for
from formtax.constraints.spec import ChoiceConstraint, Constraint
from formtax.decoding.engine import Backend, Capability, TokenizerInfo
from formtax.decoding.loop import Policy
from formtax.decoding.plan import Phase, RowOutput
from formtax.decoding.policies import ConstrainedPolicy, FreePolicy, JsonCapPolicy
from formtax.strategies.base import Request, Result, SinglePass, closing_limit, register, with_prefix
from formtax.strategies.firstmass import EVENT as FIRST_MASS
from formtax.strategies.firstmass import FirstTokenMass, allowed_first_tokens, prefix_first_tokens
from formtax.strategies.options import JsonOptions
from formtax.strategies.reserve import DEFAULT_RESERVE, answer_reserve, closing_room


def constrained_policy(backend: Backend, constraint: Constraint, phase: str = Phase.ANSWER,
                       closing_limit: int | None = None) -> ConstrainedPolicy:
    """The constraint's policy; ``closing_limit``: closing mode over that many tokens (the row's budget after
    any forced prefix; constraints/closing.py). Where closing provably cannot act (every completion fits:
    constraints/extent.py) the row is built without it: the same tokens, and a row that needs only its grammar
    (an engine's structured outputs may run it)."""
    idle = closing_limit is not None and closing_idle(constraint, closing_limit)
    tok = backend.tokenizer
    compiled = compile_grammar(constraint.grammar, tok.engine)
    policy = ConstrainedPolicy(compiled.matcher(tok.n_logits), tok.eos_ids, phase=phase,
                               closing_limit=None if idle else closing_limit, keys=key_guard(tok.engine, constraint))
    policy.closing_idle = idle
    if policy.closer is not None:
        closer = policy.closer
        oracle, key = closing_oracle(constraint)
        if oracle is not None:  # an approximated schema: keep to answers the oracle accepts where one fits
            w = start_search(compiled, tok.n_logits, closing_limit, oracle, key).tokens
            if w is not None and closing_limit is not None and len(w) <= closing_limit:
                closer.oracle, closer.oracle_key = oracle, key
                closer.parse = ClosingParse.ORACLE
                return policy.with_start(w)
            closer.parse = ClosingParse.GRAMMAR_ONLY  # said before decoding: only the grammar is kept
        closer.start_from(start_witness(compiled, tok.n_logits))
    return policy


def key_guard(engine: Any, constraint: Constraint) -> KeyGuard | None:
    """A :class:`KeyGuard` for a constraint whose grammar lets an object repeat a key (None otherwise)."""
    return KeyGuard(quote_tokens(engine)) if constraint.may_repeat_keys else None


@register
class Free(SinglePass):
    name = "free"
    summary = "unconstrained greedy (or sampled) decoding to EOS or the budget; the answer is read from the text"
    requires_constraint = False
    constrained_answer = False

    def policy(self, backend: Backend, request: Request) -> Policy:
        return with_prefix(backend, request, FreePolicy(backend.tokenizer.eos_ids, phase=Phase.REASONING))


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
        policy: Policy = FreePolicy(tok.eos_ids, tok.newline_ids, phase=Phase.ANSWER)
        if isinstance(request.constraint, ChoiceConstraint):  # paper 002's mechanism variable; no mask
            options = request.constraint.options
            policy = FirstTokenMass(policy, allowed_first_tokens(tok, options),
                                    wider=prefix_first_tokens(tok, options))
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
            return with_prefix(backend, request, FreePolicy(backend.tokenizer.eos_ids, phase=Phase.ANSWER))
        return with_prefix(backend, request, constrained_policy(backend, request.constraint,
                                                                closing_limit=closing_limit(backend, request)))




@register
class Json(SinglePass):
    """Paper 003's JSON strategy (constraints/jsonreason.py). ``Request.options["json_layout"]``:
    ``flexible`` (the default: JSON whitespace anywhere a parser allows it) or ``compact``. On a backend whose
    decode loop steps the policy the reason and a free-text answer accept every JSON string, escapes included,
    their caps kept by :class:`JsonCapPolicy`; on a server (a whole-output grammar only) they are escape-free."""

    name = "json"
    summary = 'one JSON object {"reason": free text, "answer": typed answer}, constrained throughout'
    output_format = "json"

    @staticmethod
    def _answer_bound(c: Constraint) -> int:
        return JsonReasonAnswer.answer_bound(c, DEFAULT_RESERVE)

    Options = JsonOptions

    def layout(self, request: Request) -> JsonLayout:
        return JsonLayout(self.options_of(request).json_layout)

    def min_budget(self, request: Request) -> int:
        return (self.answer_overhead(request) or 0) + 1

    def closing_min_budget(self, backend: Backend, request: Request) -> int:
        return 1  # closing mode's own check (the whole object fits) replaces the worst case

    def answer_overhead(self, request: Request, backend: Backend | None = None) -> int | None:
        assert request.constraint is not None
        layout = self.layout(request)
        worst = JSON_SCAFFOLD + layout_tokens(layout) + self._answer_bound(request.constraint) + 1
        if request.reserve is not None:  # planned by the runner: the same reasoning budget at every level
            return request.reserve
        if backend is None or not (request.closing and request.constrain):
            return worst
        # closing mode: the shortest whole object (empty reason) in the model's tokens, plus the slack
        shortest = JsonReasonAnswer(request.constraint, reason_tokens=1, layout=layout,
                                    escapes=self.string_escapes(backend))
        return closing_room(backend, shortest, worst)

    def effective_constraint(self, request: Request, escapes: bool = True,
                             backend: Backend | None = None) -> Constraint | None:
        if request.constraint is None:
            return None
        reason = request.max_tokens - (self.answer_overhead(request, backend) or 0)
        return JsonReasonAnswer(request.constraint, reason_tokens=max(1, reason), layout=self.layout(request),
                                escapes=escapes)

    def whole_output_constraint(self, request: Request, policy: Policy) -> Constraint | None:
        inner = super().whole_output_constraint(request, policy)
        return None if inner is None else self.effective_constraint(request, escapes=False)

    def closing_target(self, backend: Backend, request: Request) -> tuple[Constraint, int] | None:
        c, limit = self.effective_constraint(request, backend=backend), closing_limit(backend, request)
        return None if c is None or limit is None else (c, limit)

    @staticmethod
    def string_escapes(backend: Backend) -> bool:
        """Whether the JSON strings take escapes on ``backend``: where formtax's loop steps the policy (which keeps
        their caps); an engine that only takes a whole-output grammar gets the escape-free form."""
        return Capability.STEP_LOGITS in backend.capabilities

    def policy(self, backend: Backend, request: Request) -> Policy:
        c = self.effective_constraint(request, escapes=self.string_escapes(backend), backend=backend)
        assert isinstance(c, JsonReasonAnswer)
        if not request.constrain:
            return with_prefix(backend, request, FreePolicy(backend.tokenizer.eos_ids, phase=Phase.ANSWER))
        limit = closing_limit(backend, request)
        tok = backend.tokenizer
        caps = caps_for(c, tok.engine, tok.n_logits)
        if caps is None:
            return with_prefix(backend, request, constrained_policy(backend, c, closing_limit=limit))
        compiled = compile_grammar(c.grammar, tok.engine)
        policy = JsonCapPolicy(compiled.matcher(tok.n_logits), tok.eos_ids, caps, closing_limit=limit,
                               keys=key_guard(tok.engine, c))
        if policy.closer is not None:
            policy.closer.start_from(start_witness(compiled, tok.n_logits))
        return with_prefix(backend, request, policy)

    def fill_answer(self, res: Result, request: Request, out: Any, phases: dict[str, str], constrained: bool) -> None:
        res.answer_text = phases.get("answer")

    def assemble(self, backend: Backend, request: Request, out: RowOutput, batch_wall: float) -> Result:
        """The row's Result, with the tokens of the reason's string value counted as reasoning tokens (issue 49:
        the object is one answer phase to the policy, but its reason is the strategy's reasoning)."""
        res = super().assemble(backend, request, out, batch_wall)
        n = reason_tokens(backend.tokenizer, out.tokens)
        if n:
            by = res.tokens.by_phase
            answer = Phase.ANSWER.value
            by[answer] = by.get(answer, 0) - n
            by[Phase.REASONING.value] = by.get(Phase.REASONING.value, 0) + n
        return res

    def after_parse(self, res: Result) -> None:
        if res.parse_ok and isinstance(res.parsed, dict):
            res.reasoning = (res.reasoning or "") + str(res.parsed.get("reason", ""))
            res.parsed = res.parsed.get("answer")


def reason_tokens(tok: TokenizerInfo, tokens: Sequence[int], key: str = "reason") -> int:
    """How many of ``tokens`` (a json-strategy output) start inside the reason string's value: its reasoning
    tokens. Token offsets are the engine tokenizer's exact bytes per token."""
    ids = [t for t in tokens if t not in tok.eos_ids]
    pieces = [bytes(tok.engine.ll.decode_bytes([t])) for t in ids]
    text = b"".join(pieces).decode("utf-8", "replace")
    span = string_value_span(text, key)
    if span is None:
        return 0
    lo, hi = len(text[: span[0] + 1].encode()), len(text[: span[1] - 1].encode())
    count, at = 0, 0
    for piece in pieces:
        if lo <= at < hi:
            count += 1
        at += len(piece)
    return count
