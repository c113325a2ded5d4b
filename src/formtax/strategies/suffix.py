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

``suffix-beam`` runs two rows per request in the same batch, both advancing one token per step: the free
hypothesis, which also decides (from its own deltas) when a new branch replaces the constrained hypothesis, and
the constrained hypothesis. The backend protocol has no way to copy one row's cache into another, so a replaced
constrained row crops itself back to its old branch point and replays the free tokens up to the new one (forced
tokens), and a finished constrained row waits by feeding its last token again: the decisions and the output are
those of the beam (equal to ``suffix-last`` / ``suffix-min``); the cost is a beam's, somewhat inflated by the
replays. It exists to measure what the lazy form saves.

Our choice, where the paper leaves it open (documented as such): **S and leading whitespace.** Free text rarely
ends where a template can start byte for byte (SmolLM2 writes ``" The"``, not ``"The"``), so for a template T the
completion follows T' = ``[ \\n]? T``: one optional space or newline, then T. S is the union of the engine's
start sets of T, ``" " + T`` and ``"\\n" + T``, each grammar compiled on its own, less the bare ``" "`` / ``"\\n"``
tokens of the two variants. Separately, because the engine admits only the canonical tokens of the bytes a grammar
forces (``" The"``, never ``" T"`` + ``"he"``), while one union grammar forces nothing at its start and would let
such splits into S. Without bare separators, because a line break says nothing about wanting to answer: counting
it would make delta zero at every line break. The completion runs the union grammar T' with its first step masked
to exactly S, so every completion is a sentence of T' whose first token is in S. The optional whitespace goes to
the reasoning; the answer text (what the oracle validates) is T alone. Constraints other than templates (regex,
JSON, choice, Lark) are used as they are, without whitespace variants.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import llguidance
import numpy as np
import torch

from formtax.cache import LRU
from formtax.constraints.compile import compile_grammar
from formtax.constraints.spec import Constraint, TemplateConstraint
from formtax.decoding.engine import Backend, Capability, TokenizerInfo
from formtax.decoding.loop import Plan, Policy, RowOutput, RowRequest, decode
from formtax.decoding.plan import ERROR_FINISHES, Finish, Phase
from formtax.decoding.policies import ConstrainedPolicy
from formtax.errors import ConstraintError
from formtax.strategies.base import (
    Request,
    Result,
    Strategy,
    TokenCounts,
    answer_reserve,
    batch_sampling,
    call_info,
    finish_error,
    phase_texts,
    prefix_ids,
    read_answer,
    register,
)
from formtax.strategies.basic import Free
from formtax.strategies.options import SuffixBeamOptions, SuffixOptions

LEADING_WHITESPACE = (" ", "\n")  # what may precede a template (the T' of the module docstring)

# -- the template's start set S ------------------------------------------------------------------------------


@dataclass(frozen=True)
class SuffixAnswer:
    """The answer language as the suffix strategies use it: T' (grammar) and S (start set, bool [n_logits])."""

    grammar: str
    start: torch.Tensor
    leading_whitespace: bool  # True when T' = [ \\n]? T (templates); False: T as given


def suffix_grammar(constraint: Constraint) -> tuple[str, bool]:
    """T' for a template (an optional leading space or newline, then T); any other constraint as it is."""
    if not isinstance(constraint, TemplateConstraint):
        return constraint.grammar, False
    head, _, rules = constraint.template.lark().partition("\n")
    if not head.startswith("start: "):
        raise AssertionError(f"unexpected template grammar layout: {head!r}")
    body = head[len("start: ") :]
    return llguidance.grammar_from("lark", f'start: (" " | "\\n")? {body}\n{rules}'), True


_START_CACHE: LRU[tuple[str, str, int], SuffixAnswer] = LRU(256)  # one template per item stays bounded


def suffix_answer(constraint: Constraint, tok: TokenizerInfo) -> SuffixAnswer:
    """Compile T' and compute S for this tokenizer (cached); ConstraintError when no token can begin T."""
    key = (constraint.grammar, tok.engine.key, tok.n_logits)
    hit = _START_CACHE.get(key)
    if hit is not None:
        return hit
    grammar, ws = suffix_grammar(constraint)
    start = _start_mask(constraint.grammar, tok)
    if ws:
        assert isinstance(constraint, TemplateConstraint)
        for w in LEADING_WHITESPACE:
            variant = _start_mask(TemplateConstraint(w + constraint.source).grammar, tok)
            for i in variant.nonzero().flatten().tolist():
                if tok.decode([i]) != w:  # a bare separator carries no byte of T
                    start[i] = True
    if not bool(start.any()):
        raise ConstraintError(f"no token of this tokenizer can begin the answer {constraint.describe()!r}")
    return _START_CACHE.put(key, SuffixAnswer(grammar, start, ws))


def _start_mask(grammar: str, tok: TokenizerInfo) -> torch.Tensor:
    return compile_grammar(grammar, tok.engine).matcher(tok.n_logits).allowed_mask().clone()


def bifurcation(logits: torch.Tensor, start: torch.Tensor) -> tuple[float, float]:
    """(delta, mass of S) at one step, from the unmasked softmax of the raw logits (float64)."""
    p = torch.softmax(logits.double(), dim=-1)
    in_s = p[start]
    return float(p.max() - in_s.max()), float(in_s.sum())


def choose_branch(deltas: Sequence[float | None], end: int, rule: str, tau: float) -> int:
    """t* from the deltas of steps 0..end (None: a forced step, never a branch point); the end always counts."""
    if rule == "pipeline":
        return end
    cands = [(t, d) for t, d in enumerate(deltas[: end + 1]) if d is not None]
    if rule == "last":
        below = [t for t, d in cands if d <= tau]
        return below[-1] if below else end
    if rule == "min":
        best = min(d for _, d in cands)
        return max(t for t, d in cands if d == best)
    raise ValueError(f"unknown rule {rule!r}")


# -- policies ------------------------------------------------------------------------------------------------


class FreePass:
    """The free greedy run with its bifurcation penalties; shared by the lazy policy and the beam's free row.

    The run ends at the step where the model's unmasked argmax is EOS (the EOS is not emitted: the template
    starts there instead), where a sampled EOS was emitted (sampling only), or where its budget is spent. A forced
    reasoning prefix (RC) comes first; its steps get no delta, so no branch falls inside it.
    """

    def __init__(self, start: torch.Tensor, eos_ids: frozenset[int], prefix: Sequence[int], budget: int) -> None:
        self.start = start
        self.eos_ids = eos_ids
        self.prefix = list(prefix)
        self.budget = budget
        self.tokens: list[int] = []
        self.deltas: list[float | None] = []
        self.mass: list[float | None] = []
        self.end: int | None = None
        self.end_reason = ""

    def phase_at(self, step: int) -> str:
        return Phase.RC if step < len(self.prefix) else Phase.REASONING

    def observe(self, logits: torch.Tensor, step: int) -> Plan | None:
        """The plan of free step ``step``, or None when the run ends here (nothing emitted)."""
        if step < len(self.prefix) and step < self.budget:
            self.deltas.append(None)
            self.mass.append(None)
            return Plan(forced=self.prefix[step])
        delta, mass = bifurcation(logits, self.start)
        self.deltas.append(delta)
        self.mass.append(mass)
        if step >= self.budget:
            self.end, self.end_reason = step, "budget"
            return None
        if int(torch.argmax(logits).item()) in self.eos_ids:
            self.end, self.end_reason = step, Finish.EOS
            return None
        return Plan()

    def advance(self, token: int) -> None:
        if token in self.eos_ids:  # only under sampling: greedy ends in observe() first
            self.end, self.end_reason = len(self.tokens), Finish.EOS
            return
        self.tokens.append(token)

    def candidates(self, tau: float) -> int:
        """Candidate branch points: the steps before the end with delta <= tau, plus the end."""
        assert self.end is not None
        return 1 + sum(1 for d in self.deltas[: self.end] if d is not None and d <= tau)


class Completion(ConstrainedPolicy):
    """complete_T: constrained greedy with T', its first token restricted to S (see the module docstring)."""

    def __init__(self, answer: SuffixAnswer, tok: TokenizerInfo) -> None:
        matcher = compile_grammar(answer.grammar, tok.engine).matcher(tok.n_logits)
        super().__init__(matcher, tok.eos_ids, phase=Phase.ANSWER, measure=False)
        self.s = answer.start

    def plan(self, logits: torch.Tensor, step: int) -> Plan:
        first = self.first
        plan = super().plan(logits, step)
        if first and plan.allowed is not None:
            plan.allowed = plan.allowed & self.s
            if not bool(plan.allowed.any()):
                return Plan(stop=Finish.CONSTRAINT_ERROR)
        return plan


class LazySuffixPolicy(Policy):
    """The exact lazy form: one free pass, then rewind to t* (unless t* is this very step) and complete once."""

    def __init__(self, free: FreePass, answer: SuffixAnswer, tok: TokenizerInfo, rule: str, tau: float) -> None:
        self.free = free
        self.answer_lang = answer
        self.tok = tok
        self.rule = rule
        self.tau = tau
        self.answer: Completion | None = None
        self.t_star: int | None = None
        self.phase = free.phase_at(0)

    def plan(self, logits: torch.Tensor, step: int) -> Plan:
        if self.answer is not None:
            return self.answer.plan(logits, step)
        if self.free.end is None:
            plan = self.free.observe(logits, step)
            if plan is not None:
                self.phase = self.free.phase_at(step)
                return plan
        assert self.free.end is not None
        self.t_star = choose_branch(self.free.deltas, self.free.end, self.rule, self.tau)
        self.answer = Completion(self.answer_lang, self.tok)
        self.phase = Phase.ANSWER
        if self.t_star == step:  # the row already holds x + y<t*: these logits are p(. | x, y<t*)
            return self.answer.plan(logits, step)
        return Plan(rewind=self.t_star)

    def advance(self, token: int) -> str | None:
        if self.answer is not None:
            return self.answer.advance(token)
        self.free.advance(token)  # a sampled EOS ends the free run; the next plan rewinds past it
        return None

    def budget_exhausted(self) -> str:
        return self.answer.budget_exhausted() if self.answer is not None else Finish.LENGTH_INCOMPLETE


class BeamState:
    """What the two rows of one beam request share: the free run and the current branch point."""

    def __init__(self, free: FreePass, rule: str, tau: float) -> None:
        self.free = free
        self.rule = rule
        self.tau = tau
        self.branch: int | None = None
        self.best = math.inf
        self.branches = 0  # constrained hypotheses started (the first one included)

    def offer(self, t: int, delta: float, at_end: bool) -> None:
        """Step t's branch replaces the constrained hypothesis when the rule says so (the end always counts)."""
        if self.branch == t:
            return
        if self.rule == "last":
            take = delta <= self.tau or (at_end and self.branch is None)
        else:  # min: ties go to the later step
            take = self.branch is None or delta <= self.best
        if take:
            self.branch, self.best = t, delta
            self.branches += 1


class BeamFreePolicy(Policy):
    """Row 1 of a beam request: the free hypothesis; it stops at the end of the free run."""

    coupled = True  # its constrained row reads this row's token and branch decision of the same step

    def __init__(self, state: BeamState) -> None:
        self.state = state
        self.phase = state.free.phase_at(0)

    def plan(self, logits: torch.Tensor, step: int) -> Plan:
        free = self.state.free
        plan = free.observe(logits, step)
        delta = free.deltas[step]
        if delta is not None:
            self.state.offer(step, delta, at_end=plan is None)
        if plan is None:
            return Plan(stop="free-end")
        self.phase = free.phase_at(step)
        return plan

    def advance(self, token: int) -> str | None:
        free = self.state.free
        free.advance(token)
        if free.end is not None:  # a sampled EOS: the end point is offered once more, now as the end
            delta = free.deltas[free.end]
            assert delta is not None
            self.state.offer(free.end, delta, at_end=True)
            return "free-end"
        return None


class BeamConstrainedPolicy(Policy):
    """Row 2 of a beam request: the constrained hypothesis, one token per step alongside the free row.

    It must come after its free row in the batch (the loop plans rows in order), so at every step it sees the free
    row's token and branch decision of that same step. Until the first branch it shadows the free row (forced
    tokens, same logits); at the branch point it completes T; when replaced it crops back to its branch point and
    replays the free tokens up to the new one; once complete it waits for the free row to end.
    """

    coupled = True  # it follows its free row's token of the same step

    def __init__(self, state: BeamState, answer: SuffixAnswer, tok: TokenizerInfo) -> None:
        self.state = state
        self.answer_lang = answer
        self.tok = tok
        self.answer: Completion | None = None
        self.answer_at: int | None = None
        self.done: str | None = None
        self.phase = state.free.phase_at(0)

    def plan(self, logits: torch.Tensor, step: int) -> Plan:
        st = self.state
        if self.answer_at is not None and self.answer_at != st.branch:  # replaced by a later branch
            stale = self.answer_at
            self.answer, self.answer_at, self.done = None, None, None
            if step > stale:
                return Plan(rewind=stale)
        if self.answer is None:
            if st.branch is None or step < st.branch:  # shadow / replay the free run
                self.phase = st.free.phase_at(step)
                return Plan(forced=st.free.tokens[step])
            self.answer, self.answer_at = Completion(self.answer_lang, self.tok), step
            self.phase = Phase.ANSWER
        if self.done is None:
            plan = self.answer.plan(logits, step)
            if plan.stop is None:
                return plan
            self.done = plan.stop
        if st.free.end is not None:  # the free row has ended, so this branch is final
            return Plan(stop=self.done)
        return Plan(rewind=step)  # complete: wait (the same sequence, fed again)

    def advance(self, token: int) -> str | None:
        if self.answer is None:
            return None
        reason = self.answer.advance(token)
        if reason is None:
            return None
        self.done = reason
        return reason if self.state.free.end is not None else None

    def budget_exhausted(self) -> str:
        return self.answer.budget_exhausted() if self.answer is not None else Finish.LENGTH_INCOMPLETE


# -- strategies ----------------------------------------------------------------------------------------------


@dataclass
class _Row:
    """One request's part of the batch: its rows, and the objects its result is read from."""

    rows: list[RowRequest]
    free: FreePass
    rule: str
    tau: float
    answer: SuffixAnswer
    beam: BeamState | None = None
    lazy: LazySuffixPolicy | None = None


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

    def run(self, backend: Backend, requests: Sequence[Request]) -> list[Result]:
        self.check(backend, requests)
        results: list[Result | None] = [None] * len(requests)
        free_idx = [k for k, r in enumerate(requests) if not r.constrain]
        if free_idx:  # the unconstrained level: the same prompt and budget, free decoding
            for k, res in zip(free_idx, Free().run(backend, [requests[k] for k in free_idx]), strict=True):
                res.strategy = self.name
                results[k] = res
        plans: list[tuple[int, _Row]] = []
        for k, r in enumerate(requests):
            if not r.constrain:
                continue
            try:
                plans.append((k, self.rows(backend, r)))
            except ConstraintError as e:
                results[k] = self.error_result(backend, e)
        t0 = time.perf_counter()
        outs = decode(backend, [row for _, p in plans for row in p.rows], temperature=batch_sampling(requests))
        wall = time.perf_counter() - t0
        at = 0
        for k, p in plans:
            mine = outs[at : at + len(p.rows)]
            at += len(p.rows)
            results[k] = self.assemble(backend, requests[k], p, mine, wall)
        return [r for r in results if r is not None]

    def start(self, backend: Backend, request: Request) -> tuple[FreePass, SuffixAnswer, str, float]:
        assert request.constraint is not None
        tok = backend.tokenizer
        rule, tau = self.options(request)
        answer = suffix_answer(request.constraint, tok)
        budget = request.max_tokens - self.reserve(request.constraint)
        return FreePass(answer.start, tok.eos_ids, prefix_ids(backend, request), budget), answer, rule, tau

    def rows(self, backend: Backend, request: Request) -> _Row:
        free, answer, rule, tau = self.start(backend, request)
        ids = backend.tokenizer.prompt_ids(request.prompt)
        policy = LazySuffixPolicy(free, answer, backend.tokenizer, rule, tau)
        return _Row([RowRequest(ids, policy, request.max_tokens, request.seed)], free, rule, tau, answer, lazy=policy)

    def t_star(self, p: _Row) -> int | None:
        if p.lazy is not None:
            return p.lazy.t_star
        assert p.beam is not None
        return p.beam.branch

    def assemble(self, backend: Backend, request: Request, p: _Row, outs: list[RowOutput], wall: float) -> Result:
        tok = backend.tokenizer
        out = outs[-1]  # the row that holds the output (the beam's constrained row)
        free = p.free
        t_star = self.t_star(p)
        if t_star is None or free.end is None:  # cannot happen: the end of the free run is always a branch
            raise AssertionError(f"{self.name}: the free run ended without a branch point")
        answer_ids = out.tokens[t_star:]
        answer_full = tok.decode_text(answer_ids)
        lead = ""
        c = request.constraint
        assert c is not None
        if p.answer.leading_whitespace and answer_full[:1] in LEADING_WHITESPACE and not c.validate(answer_full).ok:
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
            "rule": p.rule,
            "tau": p.tau,
            "t_star": t_star,
            "free_end": free.end,
            "free_end_reason": free.end_reason,
            "n_candidates": free.candidates(p.tau),
            "delta_at_t_star": delta,
            "deltas": [None if d is None else round(d, 4) for d in free.deltas[: free.end + 1]],
            "answer_lead": lead,
            "forward_passes": max(o.forward_passes for o in outs),  # sequential model calls of the request
            "row_passes": sum(o.forward_passes for o in outs),  # summed over its rows (the beam has two)
        })
        if p.beam is not None:
            res.stats["branches"] = p.beam.branches
        read_answer(res, c, constrained=True)
        if out.finish_reason in ERROR_FINISHES:
            res.error = finish_error(out.finish_reason)
        return res


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

    def rows(self, backend: Backend, request: Request) -> _Row:
        free, answer, rule, tau = self.start(backend, request)
        tok = backend.tokenizer
        state = BeamState(free, rule, tau)
        ids = tok.prompt_ids(request.prompt)
        rows = [
            RowRequest(ids, BeamFreePolicy(state), request.max_tokens, request.seed),
            RowRequest(ids, BeamConstrainedPolicy(state, answer, tok), request.max_tokens,
                       constrained_row_seed(request.seed)),
        ]
        return _Row(rows, free, rule, tau, answer, beam=state)

