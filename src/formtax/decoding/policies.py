"""Per-step policies: the building blocks strategies compose (docs/ALGORITHMS.md sections 1, 2, 4 and the RC prefix)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch

from formtax.constraints.closing import Closer
from formtax.constraints.compile import Matcher
from formtax.constraints.jsonkeys import KeyGuard
from formtax.constraints.jsonstrings import StringCaps
from formtax.decoding.loop import Divert, Plan, Policy, Veto, relay
from formtax.decoding.lowering import LoweredRow, Lowering
from formtax.decoding.plan import Finish, GrammarStep, Phase, Wrapping, grammar_stop
from formtax.tensorops import any_true

if TYPE_CHECKING:
    from formtax.constraints.spec import Constraint


class FreePolicy(Policy):
    """Unconstrained decoding; stops at EOS, or at the first token containing a newline when ``stop_ids`` say so."""

    def __init__(self, eos_ids: frozenset[int], stop_ids: frozenset[int] = frozenset(), phase: str = Phase.FREE) -> None:
        self.eos_ids = eos_ids
        self.stop_ids = stop_ids
        self.phase = phase

    def plan(self, logits: torch.Tensor, step: int) -> Plan:
        return Plan()

    def advance(self, token: int) -> str | None:
        if token in self.eos_ids:
            return Finish.EOS
        if token in self.stop_ids:
            return Finish.NEWLINE
        return None

    def lowered(self, whole: Constraint | None) -> LoweredRow:
        if type(self) is not FreePolicy:  # a subclass may change what the plan means: stepped
            return super().lowered(whole)
        return LoweredRow(Lowering.FREE, stop_ids=self.eos_ids | self.stop_ids, inner=self)


KEY_SLACK = 2
"""Tokens of room past a completion that repeats a key within which closing trusts the key can be written on
into a new one (one more character and its token boundary); ours, see :meth:`ConstrainedPolicy._keyed_accept`."""


class ConstrainedPolicy(Policy):
    """Constrained greedy (section 1): mask to the grammar's allowed set; EOS only where the grammar accepts.

    The matcher's errors never raise here: they end the row with a finish reason that names them, and the
    strategy turns that into an error result. With ``closing_limit`` (closing mode, constraints/closing.py) a
    token after which no completion fits in what is left of those ``closing_limit`` tokens is refused.
    """

    def __init__(self, matcher: Matcher, eos_ids: frozenset[int], phase: str = Phase.ANSWER, measure: bool = True,
                 closing_limit: int | None = None, keys: KeyGuard | None = None) -> None:
        self.matcher = matcher
        self.keys = keys  # bans a token that would repeat a key of its JSON object (constraints/jsonkeys.py)
        self.eos_ids = eos_ids
        self.phase = phase
        self._measure = measure
        self.first = True
        self.closer = None if closing_limit is None else Closer(matcher, closing_limit, eos_ids)
        self.closing_idle = False  # closing mode is on but can never act (constraints/extent.py): no closer built
        # closing's veto, the same every step (the closer holds the step's tokens left); a key guard's is per step
        self._veto = None if self.closer is None else Veto(self.closer.vet, self.closer.fallback, proves=True)
        self._step: GrammarStep | None = None  # grammar_step's last: the same while closing's veto is

    def plan(self, logits: torch.Tensor, step: int) -> Plan:
        stop = self._stop()
        if stop is not None:
            return Plan(stop=stop)
        m = self.matcher
        measure = self._measure and self.first
        self.first = False
        plan = Plan(words=m.allowed_words(), width=m.n_logits, measure_mass=measure)
        if self.keys is not None:
            banned = self.keys.banned(plan.allowed)
            if banned and len(banned) >= plan.allowed_count():
                banned = []  # only repeats remain: leave the choice to the grammar (the oracle refuses it)
            plan.banned = banned
        plan.veto = self._closing(step, plan.banned)
        return plan

    def grammar_step(self, step: int) -> GrammarStep | None:
        """:meth:`plan` without a :class:`Plan`, where the step is the grammar's alone: not for the key guard or
        the string caps (a subclass), nor at the step whose masked mass is measured. The allowed set is left to
        the step (:func:`~formtax.decoding.step.grammar_choice`): a dead end is found there, where it is needed."""
        if type(self) is not ConstrainedPolicy or self.keys is not None or (self._measure and self.first):
            return None
        m = self.matcher
        if m.stopped:
            return GrammarStep(stop=grammar_stop(m))
        self.first = False
        closer = self.closer
        veto = self._veto if closer is not None and closer.begin_step(step) else None  # _closing's, without keys
        if self._step is None or self._step.veto is not veto:  # made again only where the veto changes
            self._step = GrammarStep(m, None, veto)
        return self._step

    def _stop(self) -> str | None:
        """The row's end before a token (:func:`~formtax.decoding.plan.grammar_stop`)."""
        return grammar_stop(self.matcher)

    def _closing(self, step: int, banned: Sequence[int]) -> Veto | None:
        """Closing's veto at ``step`` (None where closing is off or knows no witness: nothing to keep)."""
        closer = self.closer
        if closer is None or not closer.begin_step(step):
            return None
        if self.keys is not None:  # closing and the key guard together: no completion may repeat a key
            return Veto(self._keyed_accept(frozenset(banned), closer.left), closer.fallback)
        return self._veto

    def _keyed_accept(self, banned: frozenset[int], left: int) -> Callable[[int], bool]:
        """Closing's acceptance for a guarded row: the token repeats no key, a completion fits after it, and that
        completion repeats no key either, or leaves :data:`KEY_SLACK` tokens to write the key on. Where the budget
        binds, every witness the row follows is then free of repeats, so closing's fallback (the witness's next
        token) does not repeat a key."""
        closer, keys, ll = self.closer, self.keys, self.matcher.tokenizer.ll
        assert closer is not None and keys is not None

        def accept(t: int) -> bool:
            if t in banned or not closer.vet(t):
                return False
            after = closer.witness_after(t)
            if after is None or not keys.repeats_in(ll.decode_bytes([t, *after])):
                return True
            # the shortest completion repeats a key (it closes a key the model is writing, which repeats one):
            # with KEY_SLACK tokens to spare the key can still be written on into a new one, so the model's own
            # choice stands (closing stays invisible where the answer fits); only where the budget binds is it
            # refused
            return len(after) + KEY_SLACK <= left

        return accept

    def advance(self, token: int) -> str | None:
        if token in self.eos_ids:
            return Finish.EOS
        if not self.matcher.consume(token):
            return Finish.CONSTRAINT_ERROR
        if self.closer is not None:
            self.closer.advance(token)
        if self.keys is not None:
            self.keys.advance(self.matcher.tokenizer.ll.decode_bytes([token]))
        return None

    def budget_exhausted(self) -> str:
        return Finish.LENGTH if self.matcher.accepting else Finish.LENGTH_INCOMPLETE

    def advance_last(self, token: int) -> str:
        """:meth:`advance` then :meth:`budget_exhausted`, without the grammar engine's consume: nothing reads the
        matcher after the row's last token, and llguidance's consume of a token that completes the grammar costs
        it about 50 us, where closing's rows end (at their budget). One engine check of the token and EOS after it
        answers the same (EOS is allowed only where the grammar accepts); the matcher stays before the token. A
        subclass or a key guard advances as it does at every step."""
        if type(self) is not ConstrainedPolicy or self.keys is not None:
            return super().advance_last(token)
        if token in self.eos_ids:
            return Finish.EOS
        taken = self.matcher.takes_then_eos(token)
        if not taken:
            return Finish.CONSTRAINT_ERROR
        if self.closer is not None:
            self.closer.advance(token)
        return Finish.LENGTH if taken == 2 else Finish.LENGTH_INCOMPLETE

    def with_start(self, witness: list[int]) -> ConstrainedPolicy:
        """Closing mode begins from ``witness`` (a completion of the start state); returns the policy."""
        assert self.closer is not None
        self.closer.start_from(witness)
        return self

    def row_stats(self) -> dict[str, Any]:
        if self.closer is None:  # closing off, or on and provably idle (strategies/basic.py): it changed nothing
            return {"closing_changed_tokens": 0} if self.closing_idle else {}
        out: dict[str, Any] = {"closing_changed_tokens": self.closer.changed}
        if self.closer.parse is not None:  # an approximated schema: what closing's guarantee covers
            out["closing_parse"] = str(self.closer.parse)
        return out

    def mask_matcher(self) -> Matcher | None:
        return self.matcher

    def lowered(self, whole: Constraint | None) -> LoweredRow:
        if whole is None or type(self) is not ConstrainedPolicy or self.keys is not None or self.closer is not None:
            return super().lowered(whole)  # a row that could repeat a key, or that closing may steer, stays live
        return LoweredRow(Lowering.GRAMMAR, stop_ids=self.eos_ids, constraint=whole, inner=self)


class JsonCapPolicy(ConstrainedPolicy):
    """A constrained policy that also keeps the token caps of JSON string values the grammar leaves uncapped
    (the json strategy's reason and free-text answer when they may hold escapes; constraints/jsonstrings.py):
    the allowed set is the grammar's and the caps' together, so greedy takes the best token both allow and
    sampling draws from the distribution masked by both."""

    def __init__(self, matcher: Matcher, eos_ids: frozenset[int], caps: StringCaps, phase: str = Phase.ANSWER,
                 closing_limit: int | None = None, keys: KeyGuard | None = None) -> None:
        super().__init__(matcher, eos_ids, phase=phase, closing_limit=closing_limit, keys=keys)
        self.caps = caps

    def plan(self, logits: torch.Tensor, step: int) -> Plan:
        plan = super().plan(logits, step)
        extra = self.caps.allowed()
        if extra is None or plan.allowed is None:
            return plan
        allowed = plan.allowed & extra[: plan.allowed.shape[0]]
        if not any_true(allowed):
            return Plan(stop=Finish.CONSTRAINT_ERROR)
        plan.allowed = allowed
        return plan

    def advance(self, token: int) -> str | None:
        reason = super().advance(token)
        if reason is None:
            self.caps.advance(self.matcher.tokenizer.ll.decode_bytes([token]))
        return reason


class InWritingPolicy(Policy):
    """InWriting (section 4): a free preamble in which EOS/PAD are never emitted, then the constraint.

    Switch when (a) the token drawn from the model's *unmasked* distribution is EOS/PAD: the draw is not
    emitted, and the first answer token is chosen instead from the masked distribution at this same step
    (:class:`~formtax.decoding.loop.Divert`). Under greedy decoding the draw is the argmax, which is the rule of
    the paper's Litelines implementation; under sampling a sampled EOS switches (``p(EOS) = 0.47`` switches
    about half the time at that step), and any other draw is kept, so the preamble is exactly the model's
    distribution conditioned on not stopping. (b) The previous token is a trigger (it stays in the preamble and
    is not fed to the grammar). (c) The preamble budget is spent: recorded as ``budget`` whatever the model
    wanted there (a switch the budget forced is never reported as the model's own ``eos``; issue 49).
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
        self.phase = Phase.REASONING
        self.switched: tuple[int, str] | None = None
        self.last: int | None = None
        self.n_preamble = 0

    def plan(self, logits: torch.Tensor, step: int) -> Plan:
        if self.switched is None:
            if self.last is not None and self.last in self.triggers:
                return self._switch(logits, step, "trigger")
            eos = Divert(self.stop_ids, lambda: self._switch(logits, step, "eos"))
            if self.n_preamble >= self.preamble_budget:  # the budget forces the switch, whatever is drawn
                def forced() -> Plan:
                    return self._switch(logits, step, "budget")

                return Plan(divert=Divert(eos.tokens, forced, forced, by_argmax=True))
            return Plan(divert=eos)
        return self.answer.plan(logits, step)

    def grammar_step(self, step: int) -> GrammarStep | None:
        """The answer's own grammar step, once switched (the answer's plan is then this policy's)."""
        if self.switched is None or type(self).plan is not InWritingPolicy.plan:
            return None
        return self.answer.grammar_step(step)

    def _switch(self, logits: torch.Tensor, step: int, reason: str) -> Plan:
        self.switched = (step, reason)
        self.phase = Phase.ANSWER
        plan = self.answer.plan(logits, step)
        plan.event = {"switch": reason}
        return plan

    def advance(self, token: int) -> str | None:
        if self.switched is None:
            self.last = token
            self.n_preamble += 1
            return None
        return self.answer.advance(token)

    def budget_exhausted(self) -> str:
        return self.answer.budget_exhausted() if self.switched else Finish.LENGTH_INCOMPLETE

    def row_stats(self) -> dict[str, Any]:
        return self.answer.row_stats()

    def mask_matcher(self) -> Matcher | None:
        return self.answer.mask_matcher() if self.switched else None


class ForcedPrefix(Wrapping):
    """A reasoning constraint (RC): force a prefix such as "Let's think step by step", then hand over."""

    def __init__(self, prefix: Sequence[int], inner: Policy) -> None:
        self.prefix = list(prefix)
        self.inner = inner
        self.k = 0
        self.phase = Phase.RC if self.prefix else inner.phase

    def plan(self, logits: torch.Tensor, step: int) -> Plan:
        if self.k < len(self.prefix):
            return Plan(forced=self.prefix[self.k])
        self.phase = self.inner.phase
        plan = self.inner.plan(logits, step - len(self.prefix))
        self.phase = self.inner.phase
        return relay(plan, self._sync)

    def _sync(self) -> None:
        self.phase = self.inner.phase

    def grammar_step(self, step: int) -> GrammarStep | None:
        """The inner policy's grammar step once the prefix is written (as :meth:`plan` hands over)."""
        if self.k < len(self.prefix) or type(self).plan is not ForcedPrefix.plan:
            return None
        self.phase = self.inner.phase
        got = self.inner.grammar_step(step - len(self.prefix))
        self.phase = self.inner.phase
        return got

    def lowered(self, whole: Constraint | None) -> LoweredRow:
        """The inner policy's lowering with the prefix joining the prompt (one level of prefix only)."""
        if type(self) is not ForcedPrefix or type(self.inner) is ForcedPrefix:
            return super().lowered(whole)
        plan = self.inner.lowered(whole)
        if plan.kind is Lowering.LIVE:
            return super().lowered(whole)
        return dataclasses.replace(plan, prefix=[*self.prefix, *plan.prefix])

    def advance(self, token: int) -> str | None:
        if self.k < len(self.prefix):
            self.k += 1
            if self.k == len(self.prefix):
                self.phase = self.inner.phase
            return None
        return self.inner.advance(token)

    def budget_exhausted(self) -> str:
        return self.inner.budget_exhausted() if self.k >= len(self.prefix) else Finish.LENGTH

    def mask_matcher(self) -> Matcher | None:
        return self.inner.mask_matcher() if self.k >= len(self.prefix) else None
