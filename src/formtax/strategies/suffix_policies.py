"""The suffix strategies' answer, bifurcation rule and per-row policies (strategies/suffix.py runs them; paper 000).

:class:`SuffixAnswer` is the template T' (optional leading whitespace, then T) with its start mask; :func:`bifurcation`
and :func:`choose_branch` are the branching rule; :class:`FreePass` records a free run's per-step penalties,
:class:`LazySuffixPolicy` branches back into it (the lazy form, equal to the naive one), and the two beam policies
run suffix-beam's free and constrained hypotheses side by side.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import llguidance
import torch

from formtax.cache import LRU
from formtax.constraints.compile import compile_grammar
from formtax.constraints.spec import Constraint, TemplateConstraint
from formtax.decoding.engine import TokenizerInfo
from formtax.decoding.loop import Plan, Policy
from formtax.decoding.plan import Finish, Phase
from formtax.decoding.policies import ConstrainedPolicy
from formtax.errors import ConstraintError

LEADING_WHITESPACE = (" ", "\n")  # what may precede a template (the T' of the module docstring)


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
        raise ConstraintError(f"no token of this tokenizer can begin the answer {constraint.brief()!r}")
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


class FreeRun(Policy):
    """The free pass alone, as a row of an engine that owns its loop (vLLM): it ends where the free run ends, and
    reports the run's penalties (:meth:`row_stats`) so the caller picks t* and completes T in a second request
    on ``prompt + y<t*`` (whose prefix the engine's cache already holds)."""

    def __init__(self, free: FreePass) -> None:
        self.free = free
        self.phase = free.phase_at(0)

    def plan(self, logits: torch.Tensor, step: int) -> Plan:
        plan = self.free.observe(logits, step)
        if plan is None:
            return Plan(stop=self.free.end_reason)
        self.phase = self.free.phase_at(step)
        return plan

    def advance(self, token: int) -> str | None:
        self.free.advance(token)
        return self.free.end_reason if self.free.end is not None else None  # a sampled EOS ends the run

    def row_stats(self) -> dict[str, object]:
        f = self.free
        return {"suffix_free": {"deltas": f.deltas, "mass": f.mass, "end": f.end, "end_reason": f.end_reason}}

    def restore(self, stats: dict[str, object], tokens: Sequence[int]) -> None:
        """Take the free run's record from a row that ran elsewhere (its :meth:`row_stats` and tokens)."""
        f = self.free
        f.deltas, f.mass = list(stats["deltas"]), list(stats["mass"])  # type: ignore[call-overload]
        f.end, f.end_reason = stats["end"], str(stats["end_reason"])  # type: ignore[assignment]
        f.tokens = [t for t in tokens if t not in f.eos_ids]
