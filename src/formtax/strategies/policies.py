"""Per-step policies: the building blocks strategies compose (ALGORITHMS.md sections 1, 2, 4 and the RC prefix)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from formtax.constraints.compile import Matcher
from formtax.decoding.loop import Plan, Policy


class FreePolicy(Policy):
    """Unconstrained decoding; stops at EOS, or at the first token containing a newline when ``stop_ids`` say so."""

    def __init__(self, eos_ids: frozenset[int], stop_ids: frozenset[int] = frozenset(), phase: str = "free") -> None:
        self.eos_ids = eos_ids
        self.stop_ids = stop_ids
        self.phase = phase

    def plan(self, logits: torch.Tensor, step: int) -> Plan:
        return Plan()

    def advance(self, token: int) -> str | None:
        if token in self.eos_ids:
            return "eos"
        if token in self.stop_ids:
            return "newline"
        return None


class ConstrainedPolicy(Policy):
    """Constrained greedy (section 1): mask to the grammar's allowed set; EOS only where the grammar accepts.

    The matcher's errors never raise here: they end the row with a finish reason that names them, and the
    strategy turns that into an error result.
    """

    def __init__(self, matcher: Matcher, eos_ids: frozenset[int], phase: str = "answer", measure: bool = True) -> None:
        self.matcher = matcher
        self.eos_ids = eos_ids
        self.phase = phase
        self._measure = measure
        self.first = True

    def plan(self, logits: torch.Tensor, step: int) -> Plan:
        if self.matcher.error is not None:
            return Plan(stop="constraint-error")
        if self.matcher.stopped:
            return Plan(stop="constraint-complete")
        allowed = self.matcher.allowed_mask()
        if not bool(allowed.any()):
            return Plan(stop="constraint-error")
        measure = self._measure and self.first
        self.first = False
        return Plan(allowed=allowed, measure_mass=measure)

    def advance(self, token: int) -> str | None:
        if token in self.eos_ids:
            return "eos"
        if not self.matcher.consume(token):
            return "constraint-error"
        return None

    def budget_exhausted(self) -> str:
        return "length" if self.matcher.accepting else "length-incomplete"


class InWritingPolicy(Policy):
    """InWriting (section 4): a free preamble with EOS/PAD banned, then the constraint.

    Switch when (a) the model's unmasked argmax is EOS/PAD (at this same step: the EOS is never emitted),
    (b) the previous token is a trigger (it stays in the preamble and is not fed to the grammar), or
    (c) the preamble budget is spent.
    """

    def __init__(
        self,
        answer: ConstrainedPolicy,
        stop_ids: frozenset[int],
        triggers: frozenset[int],
        preamble_budget: int,
    ) -> None:
        self.answer = answer
        self.stop_ids = stop_ids
        self.banned = sorted(stop_ids)
        self.triggers = triggers
        self.preamble_budget = preamble_budget
        self.phase = "reasoning"
        self.switched: tuple[int, str] | None = None
        self.last: int | None = None
        self.n_preamble = 0

    def plan(self, logits: torch.Tensor, step: int) -> Plan:
        if self.switched is None:
            reason = None
            if self.last is not None and self.last in self.triggers:
                reason = "trigger"
            elif int(torch.argmax(logits).item()) in self.stop_ids:
                reason = "eos"
            elif self.n_preamble >= self.preamble_budget:
                reason = "budget"
            if reason is None:
                return Plan(banned=self.banned)
            self.switched = (step, reason)
            self.phase = "answer"
            plan = self.answer.plan(logits, step)
            plan.event = {"switch": reason}
            return plan
        return self.answer.plan(logits, step)

    def advance(self, token: int) -> str | None:
        if self.switched is None:
            self.last = token
            self.n_preamble += 1
            return None
        return self.answer.advance(token)

    def budget_exhausted(self) -> str:
        return self.answer.budget_exhausted() if self.switched else "length-incomplete"


class ForcedPrefix(Policy):
    """A reasoning constraint (RC): force a prefix such as "Let's think step by step", then hand over."""

    def __init__(self, prefix: Sequence[int], inner: Policy) -> None:
        self.prefix = list(prefix)
        self.inner = inner
        self.k = 0
        self.phase = "rc" if self.prefix else inner.phase

    def plan(self, logits: torch.Tensor, step: int) -> Plan:
        if self.k < len(self.prefix):
            return Plan(forced=self.prefix[self.k])
        self.phase = self.inner.phase
        plan = self.inner.plan(logits, step - len(self.prefix))
        self.phase = self.inner.phase
        return plan

    def advance(self, token: int) -> str | None:
        if self.k < len(self.prefix):
            self.k += 1
            if self.k == len(self.prefix):
                self.phase = self.inner.phase
            return None
        return self.inner.advance(token)

    def budget_exhausted(self) -> str:
        return self.inner.budget_exhausted() if self.k >= len(self.prefix) else "length"
