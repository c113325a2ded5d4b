"""InWriting (docs/ALGORITHMS.md section 4; paper 003, Litelines semantics made exact).

On an engine that steps policies live (the decode loop, vLLM's logits processor) InWriting is one row per request.
On an engine that cannot (an OpenAI-compatible server), the EOS switch is exactly two calls per row, which this
strategy owns (:meth:`InWriting.run_on_engine`): a free call on prompt + forced prefix with EOS/PAD as its stop
tokens and ``preamble_budget + 1`` tokens, whose drawn stop token (or exhausted budget) *is* the switch rule; then a
grammar call on prompt + prefix + preamble with what is left of the budget. The policy is replayed over both, so
the record is the one the decode loop would have written. Trigger switches need every step's logits: refused there.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from formtax.constraints.spec import Constraint
from formtax.decoding.engine import Backend
from formtax.decoding.loop import Policy, RowOutput, RowRequest, Step
from formtax.decoding.lowering import Lowering
from formtax.decoding.plan import Phase
from formtax.decoding.policies import ForcedPrefix, FreePolicy, InWritingPolicy
from formtax.decoding.rowengine import RowEngine
from formtax.errors import CapabilityError, ConfigError, ConstraintError
from formtax.strategies.base import (
    Request,
    Result,
    SinglePass,
    batch_sampling,
    register,
    request_sampling,
    with_prefix,
)
from formtax.strategies.basic import constrained_policy
from formtax.strategies.reserve import answer_reserve, closing_room


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


def reader_text(reasoning: str, answer: str, emitted: str) -> str:
    """``Result.text`` of a reasoning-then-answer output: the reasoning and the answer with a line break where the
    switch glued them (``...is 3.The answer is: 3`` reads ``...is 3.`` then the answer on its own line). Ours: the
    switch stands where the model would have stopped (or a trigger or the budget), so the seam is a boundary the
    model never wrote; ``token_ids`` keep exactly the emitted tokens, and ``emitted`` is returned unchanged where
    it is not reasoning + answer (or either side already has white space at the seam)."""
    if not reasoning or not answer or emitted != reasoning + answer:
        return emitted
    if reasoning[-1].isspace() or answer[0].isspace():
        return emitted
    return f"{reasoning}\n{answer}"


@register
class InWriting(SinglePass):
    name = "inwriting"
    summary = "free preamble (EOS masked), then the constraint when the model wants to stop or a trigger appears"

    def min_budget(self, request: Request) -> int:
        return answer_reserve(request.constraint) + 1

    def answer_overhead(self, request: Request, backend: Backend | None = None) -> int | None:
        # the preamble is max_tokens minus this; a forced RC prefix is reasoning text, so it counts inside it
        worst = answer_reserve(request.constraint)
        if request.reserve is not None:  # planned by the runner: the same reasoning budget at every level
            return request.reserve
        if backend is None or request.constraint is None or not (request.closing and request.constrain):
            return worst
        return closing_room(backend, request.constraint, worst)

    def closing_min_budget(self, backend: Backend, request: Request) -> int:
        return 1  # closing mode's own check (a completion fits in the answer's limit) replaces the worst case

    def closing_target(self, backend: Backend, request: Request) -> tuple[Constraint, int] | None:
        # the answer's limit is what the preamble leaves; at the latest switch that is the reserve (or less, where
        # the whole budget is smaller)
        if request.constraint is None:
            return None
        rc = len(backend.tokenizer.encode(request.reasoning_prefix)) if request.reasoning_prefix else 0
        return request.constraint, min(self.answer_overhead(request, backend) or 0, request.max_tokens - rc)

    def policy(self, backend: Backend, request: Request) -> Policy:
        assert request.constraint is not None
        tok = backend.tokenizer
        if not request.constrain:
            return with_prefix(backend, request, FreePolicy(tok.eos_ids, phase=Phase.REASONING))
        stop_ids = frozenset(tok.eos_ids | {tok.pad_id})
        rc = len(tok.encode(request.reasoning_prefix)) if request.reasoning_prefix else 0
        preamble = request.max_tokens - (self.answer_overhead(request, backend) or 0) - rc
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
        res.text = reader_text(res.reasoning, phases.get("answer", ""), res.text)


    # -- on an engine that cannot step the policy: two calls per row (see the module docstring) ---------------
    def check_on_engine(self, engine: RowEngine, requests: Sequence[Request]) -> None:
        if Lowering.LIVE in engine.lowerings:
            super().check_on_engine(engine, requests)
            return
        kinds = {Lowering.FREE}
        for r in requests:
            if not r.constrain:
                continue
            if r.triggers:
                raise CapabilityError(f"strategy {self.name!r} cannot run on backend {engine.name!r}: trigger "
                                      "switches need the logits of every step; only the EOS switch compiles into "
                                      "requests")
            kinds.add(Lowering.GRAMMAR)
        engine.check_rows(self.name, kinds, [request_sampling(r) for r in requests])

    def run_on_engine(self, engine: RowEngine, requests: Sequence[Request]) -> list[Result]:
        if Lowering.LIVE in engine.lowerings:
            return super().run_on_engine(engine, requests)
        results: list[Result | None] = [None] * len(requests)
        plain = [k for k, r in enumerate(requests) if not r.constrain]
        if plain:
            for k, res in zip(plain, self.run_rows(engine, [requests[k] for k in plain], engine.decode_rows),
                              strict=True):
                results[k] = res
        items: list[tuple[int, list[int], list[int], InWritingPolicy]] = []
        for k, r in enumerate(requests):
            if not r.constrain:
                continue
            try:
                policy = self.policy(engine, r)
            except ConstraintError as e:
                results[k] = self.error_result(engine, e)
                continue
            prefix, inner = ([*policy.prefix], policy.inner) if type(policy) is ForcedPrefix else ([], policy)
            if type(inner) is not InWritingPolicy:
                raise CapabilityError(f"unexpected InWriting policy {type(inner).__name__}")
            items.append((k, engine.tokenizer.prompt_ids(r.prompt), prefix, inner))
        sampling = batch_sampling(requests)
        t0 = time.perf_counter()
        # call 1: free, stopped at EOS/PAD (the switch rule itself, greedy or sampled: the drawn stop token)
        first = engine.decode_rows(engine, [
            RowRequest(p + pre, FreePolicy(inner.stop_ids, phase=Phase.REASONING), inner.preamble_budget + 1,
                       requests[k].seed)
            for k, p, pre, inner in items], sampling, [None] * len(items))
        switches: list[tuple[list[int], str]] = []
        for (k, _, _, inner), call1 in zip(items, first, strict=True):
            toks, budget = call1.tokens, inner.preamble_budget
            if toks and toks[-1] in inner.stop_ids and len(toks) <= budget:
                switches.append((toks[:-1], "eos"))  # the model wanted to stop here: that EOS is never emitted
            elif len(toks) > budget:  # the budget forced the switch, whatever the model drew there
                switches.append((toks[:budget], "budget"))
            else:
                raise RuntimeError(f"backend {engine.name!r}: the free call of request {k} ended with "
                                   f"{call1.finish_reason!r} after {len(toks)} tokens, neither at EOS nor at its "
                                   "budget")
        # call 2: the answer's grammar on prompt + prefix + preamble, with what is left of the budget
        second = engine.decode_rows(engine, [
            RowRequest(p + pre + preamble, inner.answer, requests[k].max_tokens - len(pre) - len(preamble),
                       requests[k].seed)
            for (k, p, pre, inner), (preamble, _) in zip(items, switches, strict=True)],
            sampling, [requests[k].constraint for k, _, _, _ in items])
        wall = time.perf_counter() - t0
        for (k, p, pre, _), (preamble, why), call1, answer in zip(items, switches, first, second, strict=True):
            out = RowOutput(prompt_ids=list(p))
            out.tokens = [*pre, *preamble, *answer.tokens]
            out.steps = ([Step(t, Phase.RC, True, False) for t in pre]
                         + [Step(t, Phase.REASONING, False, True) for t in preamble] + answer.steps)
            out.events = [{"step": len(pre) + len(preamble), "switch": why}] + answer.events
            out.finish_reason = answer.finish_reason
            out.masked_mass = answer.masked_mass
            out.wall_s = wall
            out.forward_passes = call1.forward_passes + answer.forward_passes
            results[k] = self.assemble(engine, requests[k], out, wall)
        return [r for r in results if r is not None]
