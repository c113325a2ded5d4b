"""Suffix-constrained greedy search (docs/ALGORITHMS.md section 6; paper 000).

The output is free text followed by the answer template T. Free greedy decoding runs first; at every step t the
*bifurcation penalty* ``delta_t = max_v p(v) - max_{v in S} p(v)`` (softmax of the raw logits, float64) measures
what it would cost to start T right there, S being the tokens that can begin T. A rule picks the branch point t*
and the output is ``y<t* + complete_T(x + y<t*)`` (constrained greedy, section 1):

* ``suffix-pipeline``: t* = the end of the free run (where it wants EOS, or where its budget ends);
* ``suffix-last``: the latest t with ``delta_t <= tau`` (``tau`` = 0 by default), else the end;
* ``suffix-min``: the latest t of minimal ``delta_t`` (the end is a candidate with its own delta);
* ``suffix-beam``: the paper's step-synchronous beam of 2 (rule ``last`` or ``min``), executed as such.

The first three run the *exact lazy form*, one row per request: one free pass records every delta, the policy
picks t*, rewinds its row to t* (``Plan.rewind``: the cache is cropped, the last kept token fed again) and
completes T once. The end of the free run is always a candidate branch point; there the template starts in place
of the EOS, which is never emitted. Its budget is ``max_tokens`` minus the answer's reserve, so the completion
always fits.

On an engine that owns its loop (vLLM) a row cannot rewind, so the lazy form runs as two requests: the free pass
(:class:`~formtax.strategies.suffix_policies.FreeRun`, stepped live in the engine, which reports its penalties),
then t* is chosen here and T is completed by a request on ``x + y<t*``, whose prefix the engine's prefix cache
already holds. Greedy outputs equal the one-row form's (the logits are those of the same prefixes). ``suffix-beam``
runs there as this lazy form too: its output is the beam's (see below); what a beam costs is not measured there.

``suffix-beam`` runs two rows per request in the same batch, both advancing one token per step: the free
hypothesis, which also decides (from its own deltas) when a new branch replaces the constrained hypothesis, and
the constrained hypothesis. The backend protocol has no way to copy one row's cache into another, so a replaced
constrained row crops itself back to its old branch point and replays the free tokens up to the new one (forced
tokens), and a finished constrained row waits by feeding its last token again: the decisions and the output are
those of the beam (equal to ``suffix-last`` / ``suffix-min``); the cost is a beam's, somewhat inflated by the
replays. It exists to measure what the lazy form saves.

Our choice, where the paper leaves it open (documented as such): **S and leading whitespace.** Free text rarely
ends where a template can start byte for byte (SmolLM2 writes ``" The"``, not ``"The"``), so for a template T the
completion follows T' = ``[ \n]? T``: one optional space or newline, then T. S is the union of the engine's
start sets of T, ``" " + T`` and ``"\n" + T``, each grammar compiled on its own, less the bare ``" "`` / ``"\n"``
tokens of the two variants. Separately, because the engine admits only the canonical tokens of the bytes a grammar
forces (``" The"``, never ``" T"`` + ``"he"``), while one union grammar forces nothing at its start and would let
such splits into S. Without bare separators, because a line break says nothing about wanting to answer: counting
it would make delta zero at every line break. The completion runs the union grammar T' with its first step masked
to exactly S, so every completion is a sentence of T' whose first token is in S. The optional whitespace goes to
the reasoning; the answer text (what the oracle validates) is T alone. Constraints other than templates (regex,
JSON, choice, Lark) are used as they are, without whitespace variants.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from formtax.constraints.spec import Constraint, TemplateConstraint
from formtax.decoding.engine import Backend, Capability, require
from formtax.decoding.loop import Policy, RowOutput, RowRequest, decode
from formtax.decoding.lowering import Lowering
from formtax.decoding.plan import ERROR_FINISHES
from formtax.decoding.rowengine import RowEngine
from formtax.errors import CapabilityError, ConstraintError
from formtax.strategies.base import (
    Request,
    Result,
    Strategy,
    TokenCounts,
    batch_sampling,
    call_info,
    engine_results,
    finish_error,
    phase_texts,
    prefix_ids,
    read_answer,
    register,
    request_sampling,
)
from formtax.strategies.basic import Free
from formtax.strategies.options import SuffixBeamOptions, SuffixOptions
from formtax.strategies.reserve import answer_reserve
from formtax.strategies.suffix_policies import (
    LEADING_WHITESPACE,
    BeamConstrainedPolicy,
    BeamFreePolicy,
    BeamState,
    Completion,
    FreePass,
    FreeRun,
    LazySuffixPolicy,
    SuffixAnswer,
    choose_branch,
    suffix_answer,
)


@dataclass
class _Part:
    """One request's part of the batch: its rows, and the objects its result is read from."""

    rows: list[RowRequest]
    free: FreePass
    rule: str
    tau: float
    answer: SuffixAnswer
    beam: BeamState | None = None
    lazy: LazySuffixPolicy | None = None
    branch: int | None = None  # t*, where the caller chose it (the two-request form on an engine)


class SuffixStrategy(Strategy):
    """Shared machinery of the suffix strategies: options, budget, rows, and the result."""

    needs = frozenset({Capability.STEP_LOGITS, Capability.KV_CROP})
    rule: ClassVar[str]
    Options: ClassVar[type[SuffixOptions]] = SuffixOptions

    def options(self, request: Request) -> tuple[str, float]:
        """(rule, tau) of a request: suffix-beam's rule is an option, the others' is their own."""
        o = self.options_of(request)
        return getattr(o, "rule", self.rule), float(o.tau)

    def check(self, backend: Backend, requests: Sequence[Request]) -> None:
        super().check(backend, requests)
        for r in requests:
            self.options(r)

    @staticmethod
    def reserve(constraint: Constraint) -> int:
        """The answer's reserve, plus one token for T's optional leading whitespace."""
        return answer_reserve(constraint) + (1 if isinstance(constraint, TemplateConstraint) else 0)

    def min_budget(self, request: Request) -> int:
        assert request.constraint is not None
        return self.reserve(request.constraint)

    def check_on_engine(self, engine: RowEngine, requests: Sequence[Request]) -> None:
        """On an engine that owns its loop: the two-request lazy form, whose rows are stepped live."""
        require(engine, self.needs - {Capability.STEP_LOGITS, Capability.KV_CROP}, self.name)
        if Lowering.LIVE not in engine.lowerings:
            raise CapabilityError(f"strategy {self.name!r} cannot run on backend {engine.name!r}: its free pass "
                                  "reads the logits of every step, which this engine does not expose")
        engine.check_rows(self.name, {Lowering.LIVE}, [request_sampling(r) for r in requests])

    def run(self, backend: Backend, requests: Sequence[Request], checked: bool = False) -> list[Result]:
        if not checked:
            self.check(backend, requests)
        if isinstance(backend, RowEngine):
            return engine_results(backend, self.run_on_engine(backend, requests))
        results: list[Result | None] = [None] * len(requests)
        free_idx = [k for k, r in enumerate(requests) if not r.constrain]
        if free_idx:  # the unconstrained level: the same prompt and budget, free decoding
            for k, res in zip(free_idx, Free().run(backend, [requests[k] for k in free_idx]), strict=True):
                res.strategy = self.name
                results[k] = res
        parts: list[tuple[int, _Part]] = []
        for k, r in enumerate(requests):
            if not r.constrain:
                continue
            try:
                parts.append((k, self.rows(backend, r)))
            except ConstraintError as e:
                results[k] = self.error_result(backend, e)
        t0 = time.perf_counter()
        outs = decode(backend, [row for _, part in parts for row in part.rows], temperature=batch_sampling(requests))
        wall = time.perf_counter() - t0
        at = 0
        for k, part in parts:
            mine = outs[at : at + len(part.rows)]
            at += len(part.rows)
            results[k] = self.assemble(backend, requests[k], part, mine, wall)
        return [r for r in results if r is not None]

    def run_on_engine(self, engine: RowEngine, requests: Sequence[Request]) -> list[Result]:
        """The lazy form as two requests per request (module docstring): the free pass, then T from t*."""
        results: list[Result | None] = [None] * len(requests)
        free_idx = [k for k, r in enumerate(requests) if not r.constrain]
        if free_idx:
            for k, res in zip(free_idx, Free().run(engine, [requests[k] for k in free_idx]), strict=True):
                res.strategy = self.name
                results[k] = res
        todo: list[tuple[int, FreeRun, SuffixAnswer, str, float]] = []
        for k, r in enumerate(requests):
            if not r.constrain:
                continue
            try:
                free, answer, rule, tau = self.start(engine, r)
            except ConstraintError as e:
                results[k] = self.error_result(engine, e)
                continue
            todo.append((k, FreeRun(free), answer, rule, tau))
        sampling = batch_sampling(requests)
        tok = engine.tokenizer
        t0 = time.perf_counter()
        prompts = [tok.prompt_ids(requests[k].prompt) for k, *_ in todo]
        first = engine.decode_rows(engine, [
            RowRequest(p, run, run.free.budget + 1, requests[k].seed,
                       recipe=functools.partial(_free_run, self, _portable(requests[k])))
            for p, (k, run, *_) in zip(prompts, todo, strict=True)], sampling, [None] * len(todo))
        branches = []
        for (_k, run, _answer, rule, tau), out in zip(todo, first, strict=True):
            stats = next(e["stats"]["suffix_free"] for e in out.events if "suffix_free" in e.get("stats", {}))
            run.restore(stats, out.tokens)
            assert run.free.end is not None
            branches.append(choose_branch(run.free.deltas, run.free.end, rule, tau))
        second = engine.decode_rows(engine, [
            RowRequest(p + out.tokens[:t], Completion(answer, tok), requests[k].max_tokens - t, requests[k].seed,
                       recipe=functools.partial(_completion, requests[k].constraint))
            for p, (k, _run, answer, _rule, _tau), out, t in zip(prompts, todo, first, branches, strict=True)],
            sampling, [None] * len(todo))
        wall = time.perf_counter() - t0
        for p, (k, run, answer, rule, tau), o1, o2, t in zip(prompts, todo, first, second, branches, strict=True):
            out = RowOutput(prompt_ids=p, tokens=o1.tokens[:t] + o2.tokens, steps=o1.steps[:t] + o2.steps,
                            finish_reason=o2.finish_reason, wall_s=wall,
                            forward_passes=o1.forward_passes + o2.forward_passes)
            part = _Part([], run.free, rule, tau, answer, branch=t)
            results[k] = self.assemble(engine, requests[k], part, [out], wall)
        return [r for r in results if r is not None]

    def start(self, backend: Backend, request: Request) -> tuple[FreePass, SuffixAnswer, str, float]:
        assert request.constraint is not None
        tok = backend.tokenizer
        rule, tau = self.options(request)
        answer = suffix_answer(request.constraint, tok)
        budget = request.max_tokens - self.reserve(request.constraint)
        return FreePass(answer.start, tok.eos_ids, prefix_ids(backend, request), budget), answer, rule, tau

    def rows(self, backend: Backend, request: Request) -> _Part:
        free, answer, rule, tau = self.start(backend, request)
        ids = backend.tokenizer.prompt_ids(request.prompt)
        policy = LazySuffixPolicy(free, answer, backend.tokenizer, rule, tau)
        return _Part([RowRequest(ids, policy, request.max_tokens, request.seed)], free, rule, tau, answer, lazy=policy)

    def t_star(self, part: _Part) -> int | None:
        if part.lazy is not None:
            return part.lazy.t_star
        if part.beam is not None:
            return part.beam.branch
        return part.branch

    def assemble(self, backend: Backend, request: Request, part: _Part, outs: list[RowOutput], wall: float) -> Result:
        tok = backend.tokenizer
        out = outs[-1]  # the row that holds the output (the beam's constrained row)
        free = part.free
        t_star = self.t_star(part)
        if t_star is None or free.end is None:  # cannot happen: the end of the free run is always a branch
            raise AssertionError(f"{self.name}: the free run ended without a branch point")
        answer_ids = out.tokens[t_star:]
        answer_full = tok.decode_text(answer_ids)
        lead = ""
        c = request.constraint
        assert c is not None
        if part.answer.leading_whitespace and answer_full[:1] in LEADING_WHITESPACE and not c.validate(answer_full).ok:
            lead = answer_full[0]
        phases = phase_texts(backend, out)
        by_phase: dict[str, int] = {}
        for s in out.steps:
            by_phase[s.phase] = by_phase.get(s.phase, 0) + 1
        mass = free.mass[t_star]
        res = Result(
            strategy=self.name,
            model=backend.model_id,
            text=tok.decode_text(out.tokens),
            reasoning=tok.decode_text(out.tokens[:t_star]) + lead,
            answer_text=answer_full[len(lead) :],
            finish_reason=out.finish_reason,
            tokens=TokenCounts(
                prompt=len(out.prompt_ids),
                total=len(out.tokens),
                # replayed reasoning tokens of the beam are forced only mechanically; count the RC and the grammar's
                forced=sum(1 for s in out.steps if s.forced and s.phase != "reasoning"),
                by_phase=by_phase,
            ),
            timings={"wall_s": max(o.wall_s for o in outs), "batch_wall_s": wall},
            masked_mass=None if mass is None else 1.0 - mass,
            phases=phases,
            calls=[call_info(out)],
            token_ids=list(out.tokens),
        )
        delta = free.deltas[t_star]
        res.stats.update({
            "rule": part.rule,
            "tau": part.tau,
            "t_star": t_star,
            "free_end": free.end,
            "free_end_reason": free.end_reason,
            "n_candidates": free.candidates(part.tau),
            "delta_at_t_star": delta,
            "deltas": [None if d is None else round(d, 4) for d in free.deltas[: free.end + 1]],
            "answer_lead": lead,
            "forward_passes": max(o.forward_passes for o in outs),  # sequential model calls of the request
            "row_passes": sum(o.forward_passes for o in outs),  # summed over its rows (the beam has two)
        })
        if part.beam is not None:
            res.stats["branches"] = part.beam.branches
        read_answer(res, c, constrained=True)
        if out.finish_reason in ERROR_FINISHES:
            res.error = finish_error(out.finish_reason)
        return res


def _portable(request: Request) -> Request:
    """What a recipe carries of a request (the second call's prompt builder and the caller's notes stay)."""
    return dataclasses.replace(request, conversion=None, meta={})


def _free_run(strategy: SuffixStrategy, request: Request, backend: Backend) -> Policy:
    """The free pass's row recipe (``RowRequest.recipe``), built by the engine's backend."""
    return FreeRun(strategy.start(backend, request)[0])


def _completion(constraint: Constraint | None, backend: Backend) -> Policy:
    """complete_T's row recipe, built by the engine's backend."""
    assert constraint is not None
    return Completion(suffix_answer(constraint, backend.tokenizer), backend.tokenizer)


@register
class SuffixPipeline(SuffixStrategy):
    name = "suffix-pipeline"
    summary = "free greedy to EOS or the budget, then the answer template appended (paper 000's pipeline)"
    rule = "pipeline"


@register
class SuffixLast(SuffixStrategy):
    name = "suffix-last"
    summary = "free greedy, then the template from the latest step whose bifurcation penalty is <= tau (default 0)"
    rule = "last"


@register
class SuffixMin(SuffixStrategy):
    name = "suffix-min"
    summary = "free greedy, then the template from the step of minimal bifurcation penalty (ties: the latest)"
    rule = "min"


def constrained_row_seed(seed: int) -> int:
    """The beam's constrained row draws from its own generator, not a copy of the free row's: with the same seed,
    its completion would reuse the uniforms the free row spent on the tokens after the branch point, which also
    decide where the branch finally lands, so (branch, completion) would not have the lazy form's law. A seed
    derived by ``numpy.random.SeedSequence`` keeps it reproducible and independent."""
    return int(np.random.SeedSequence([int(seed), 0x5EED]).generate_state(1, np.uint64)[0] >> 1)


@register
class SuffixBeam(SuffixStrategy):
    name = "suffix-beam"
    summary = "the step-synchronous beam of 2 (free + constrained hypothesis; rule last or min), run as a beam"
    rule = "last"
    Options = SuffixBeamOptions  # the rule is an option here

    def rows(self, backend: Backend, request: Request) -> _Part:
        free, answer, rule, tau = self.start(backend, request)
        tok = backend.tokenizer
        state = BeamState(free, rule, tau)
        ids = tok.prompt_ids(request.prompt)
        rows = [
            RowRequest(ids, BeamFreePolicy(state), request.max_tokens, request.seed),
            RowRequest(ids, BeamConstrainedPolicy(state, answer, tok), request.max_tokens,
                       constrained_row_seed(request.seed)),
        ]
        return _Part(rows, free, rule, tau, answer, beam=state)
