"""InWriting (docs/ALGORITHMS.md section 4; paper 003, Litelines semantics made exact)."""

from __future__ import annotations

from typing import Any

from formtax.backends.base import Backend
from formtax.constraints.spec import Constraint
from formtax.decoding.loop import Policy
from formtax.errors import ConfigError
from formtax.strategies.base import (
    Request,
    Result,
    SinglePass,
    answer_reserve,
    register,
    request_reserve,
    with_prefix,
)
from formtax.strategies.basic import constrained_policy
from formtax.strategies.policies import FreePolicy, InWritingPolicy


def trigger_ids(backend: Backend, triggers: tuple[str, ...] | list[str] | Any) -> frozenset[int]:
    """Trigger strings must each be exactly one token of this tokenizer (e.g. ``</think>``)."""
    tok = backend.tokenizer
    out: set[int] = set()
    for t in triggers:
        ids = tok.encode(t)
        if len(ids) != 1:
            raise ConfigError(f"trigger {t!r} is {len(ids)} tokens for this tokenizer; a trigger must be one token")
        out.add(ids[0])
    return frozenset(out)


@register
class InWriting(SinglePass):
    name = "inwriting"
    summary = "free preamble (EOS masked), then the constraint when the model wants to stop or a trigger appears"

    def min_budget(self, request: Request) -> int:
        return answer_reserve(request.constraint) + 1

    def answer_overhead(self, request: Request) -> int | None:
        # the preamble is max_tokens minus this; a forced RC prefix is reasoning text, so it counts inside it
        return answer_reserve(request.constraint)

    def closing_min_budget(self, backend: Backend, request: Request) -> int:
        return request_reserve(backend, request) + 1

    def closing_target(self, backend: Backend, request: Request) -> tuple[Constraint, int] | None:
        # the answer's limit is what the preamble leaves; at the latest switch that is the reserve
        return None if request.constraint is None else (request.constraint, request_reserve(backend, request))

    def policy(self, backend: Backend, request: Request) -> Policy:
        assert request.constraint is not None
        tok = backend.tokenizer
        if not request.constrain:
            return with_prefix(backend, request, FreePolicy(tok.eos_ids, phase="reasoning"))
        stop_ids = frozenset(tok.eos_ids | {tok.pad_id})
        rc = len(tok.encode(request.reasoning_prefix)) if request.reasoning_prefix else 0
        preamble = request.max_tokens - request_reserve(backend, request) - rc
        inner = InWritingPolicy(
            constrained_policy(backend, request.constraint,
                               closing_limit=request.max_tokens - rc if request.closing else None),
            stop_ids=stop_ids,
            triggers=trigger_ids(backend, list(request.triggers)),
            preamble_budget=max(0, preamble),
        )
        return with_prefix(backend, request, inner)

    def fill_answer(self, res: Result, request: Request, out: Any, phases: dict[str, str], constrained: bool) -> None:
        res.answer_text = phases.get("answer", "") if constrained else None
