"""The decode loop's vocabulary, shared by every driver of a policy.

A :class:`Policy` plans each step of one row (a :class:`Plan`) and is told the emitted token. Three drivers step
policies: the decode loop (:func:`formtax.decoding.loop.decode`), the replay of an engine's own tokens
(:func:`formtax.decoding.rowengine.replay`) and vLLM's logits processor (``backends/vllm/logits_processor.py``). They
differ only in where a token comes from; every decision around it is the step kernel's
(:mod:`formtax.decoding.step`), and so is a row's bookkeeping (``RowCursor``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import torch

from formtax.decoding.lowering import LoweredRow, Lowering
from formtax.decoding.sampling import Sampling
from formtax.tensorops import count_true, holds, ids_from_words, unpack_bitmask, word_of

if TYPE_CHECKING:
    from formtax.constraints.compile import Matcher
    from formtax.constraints.spec import Constraint


class Finish(StrEnum):
    """Why a row ended (``RowOutput.finish_reason``, ``Result.finish_reason``; records keep the value)."""

    EOS = "eos"  # the model's end token (never part of the output's text)
    NEWLINE = "newline"  # the ``short`` strategy's stop: a token containing a newline
    LENGTH = "length"  # the token budget ran out (a constrained answer was complete)
    LENGTH_INCOMPLETE = "length-incomplete"  # the budget ran out before the constraint was complete
    CONSTRAINT_COMPLETE = "constraint-complete"  # the grammar accepts and allows nothing more
    CONSTRAINT_ERROR = "constraint-error"  # the grammar engine's error state, or an engine that ignored the mask
    BACKEND_ERROR = "backend-error"  # an engine that owns its loop broke the plan (vLLM's processor)
    STOP_SEQUENCE = "stop-sequence"  # a caller's stop string appeared (formtax serve's ``stop``)
    CANCELLED = "cancelled"  # the caller went away or timed out (formtax serve); the row left its batch
    ROW_FAULT = "row-fault"  # the row's own policy or set-up raised: that row ends, its batch goes on (loop.py)
    SERVER_STOP = "stop"  # a text-only server ended the row for a reason of its own (a content filter, tool calls)
    ENGINE_ENDED = "engine-ended"  # replay: the engine stopped before the policy did (its caller names the finish)


ERROR_FINISHES = frozenset({Finish.CONSTRAINT_ERROR, Finish.LENGTH_INCOMPLETE, Finish.ROW_FAULT})
"""Finishes that leave a constrained answer incomplete: never parsed as an answer."""


class Phase(StrEnum):
    """The part of an output a token belongs to (``Step.phase``, ``Policy.phase``)."""

    MAIN = "main"
    FREE = "free"
    RC = "rc"  # a forced reasoning prefix
    REASONING = "reasoning"
    ANSWER = "answer"


class Plan:
    """What a policy wants at one step of one row.

    The allowed set comes as a bool tensor (``allowed``) or as the grammar engine's packed words (``words``: int32,
    bit ``j`` of word ``w`` = token ``32 w + j``, no bit set past the tokenizer's vocabulary; ``width``: the
    logits' width). Packed, it is unpacked only when something reads ``allowed``: a greedy row whose top token
    the set holds, a device round and an engine's batched mask read the words alone, and unpacking a 49k-token
    set costs more than the engine took to compute it (``bench/loop_overhead.py``). That is why this class is
    written by hand rather than as a dataclass: ``allowed`` is a property, and setting it (a policy narrowing
    the set) drops the words and count made for the old set."""

    __slots__ = ("_allowed", "_count", "_ids", "_width", "_words", "banned", "divert", "event", "forced", "measure_mass",
                 "rewind", "scores", "stop", "veto")

    def __init__(
        self,
        forced: int | None = None,  # emit this token without choosing
        allowed: torch.Tensor | None = None,  # bool [n_logits]; None (and no ``words``) = unconstrained
        banned: Sequence[int] = (),  # tokens never chosen at this step (e.g. EOS in InWriting's preamble)
        measure_mass: bool = False,  # record the probability mass outside the allowed set (exact, full distribution)
        scores: torch.Tensor | None = None,  # choose from these instead of the raw logits (Deco-G's reweighting)
        stop: str | None = None,  # finish the row now, without a token (e.g. the grammar is complete)
        event: dict[str, Any] | None = None,  # a strategy statistic to record at this step
        rewind: int | None = None,  # go back to this many generated tokens (the loop's docstring); no token now
        divert: Divert | None = None,  # if the token chosen under this plan is in ``divert.tokens``, re-plan
        veto: Veto | None = None,  # a chosen token the policy refuses is masked and the choice made again
        words: np.ndarray | None = None,  # the allowed set packed (instead of ``allowed``), ``width`` tokens wide
        width: int = 0,
        count: int | None = None,  # the allowed set's size, when the policy knows it already
    ) -> None:
        self.forced, self.banned, self.measure_mass, self.scores = forced, banned, measure_mass, scores
        self.stop, self.event, self.rewind, self.divert, self.veto = stop, event, rewind, divert, veto
        self._allowed, self._words, self._width, self._count = allowed, words, width, count
        self._ids: np.ndarray | None = None  # the packed set's ids, once unpacked (allowed_ids)

    @property
    def allowed(self) -> torch.Tensor | None:
        """The allowed set as a bool tensor [n_logits] (unpacked from ``words`` on first read); None: no mask."""
        if self._allowed is None and self._words is not None:
            w = self._words
            self._allowed = unpack_bitmask(w, self._width, min(self._width, 32 * w.shape[-1]))
        return self._allowed

    @allowed.setter
    def allowed(self, value: torch.Tensor | None) -> None:
        self._allowed, self._words, self._count, self._ids = value, None, None, None

    @property
    def has_mask(self) -> bool:
        """Whether an allowed set applies (without unpacking it)."""
        return self._allowed is not None or self._words is not None

    def base(self, logits: torch.Tensor) -> torch.Tensor:
        """What the row chooses from at this step: the policy's own scores (Deco-G's reweighting, a server's score
        edits), else the raw logits."""
        return self.scores if self.scores is not None else logits

    @property
    def width(self) -> int:
        """How many tokens wide the packed set is (the logits' width; 0 when the set is not packed)."""
        return self._width

    def packed_words(self) -> np.ndarray | None:
        """The allowed set's packed words when the policy handed them over (a device round copies those, 1 bit a
        token); None when the set is a tensor (a policy that narrows ``allowed`` drops the old words)."""
        return self._words

    def holds(self, token: int) -> bool:
        """Whether the allowed set holds ``token`` (one bit of the words when packed: nothing unpacked)."""
        w = self._words
        if w is not None:
            return word_of(w, self._width, token) != 0
        assert self._allowed is not None
        return holds(self._allowed, token)

    def allowed_ids(self) -> np.ndarray | None:
        """The allowed ids, ascending, on the host (from the words when packed: only their nonzero words are
        unpacked, once: a row's masked mass, its choice and its count read the same ids); None without a mask, or
        for a mask off the host. Read-only."""
        if self._words is not None:
            if self._ids is None:
                self._ids = ids_from_words(self._words, self._width)
            return self._ids
        a = self._allowed
        return None if a is None or a.device.type != "cpu" else np.flatnonzero(a.numpy())

    def allowed_count(self) -> int:
        """How many tokens the allowed set holds (a set of one is a forced token): the policy's count when it gave
        one, else counted (a popcount of the words when packed)."""
        if self._count is None:
            w = self._words
            if self._ids is not None:  # unpacked already: the ids below the width are the set
                self._count = int(self._ids.size)
            elif w is not None and self._width >= 32 * w.size:
                self._count = int(np.bitwise_count(w.view(np.uint32)).sum())
            else:
                assert self.allowed is not None
                self._count = count_true(self.allowed)
        return self._count

    def only(self, token: int) -> bool:
        """Whether the allowed set is ``token`` alone (``token`` being one it holds; a negative one: any single
        token). Packed, the common answer costs one word: a set of one has no other bit in ``token``'s word."""
        w = self._words
        if (self._count is None and w is not None and 0 <= token < 32 * w.size
                and int(w.item(token >> 5)) & 0xFFFFFFFF != 1 << (token & 31)):
            return False
        return self.allowed_count() == 1

    def replace(self, **changes: Any) -> Plan:
        """A copy with ``changes`` (the keyword arguments of the constructor); a new ``allowed`` drops the words."""
        fields: dict[str, Any] = {
            "forced": self.forced, "banned": self.banned, "measure_mass": self.measure_mass, "scores": self.scores,
            "stop": self.stop, "event": self.event, "rewind": self.rewind, "divert": self.divert, "veto": self.veto,
            "allowed": self._allowed, "words": self._words, "width": self._width, "count": self._count}
        if "allowed" in changes:
            fields.update(words=None, count=None)
        fields.update(changes)
        out = Plan(**fields)
        if out._words is self._words and out._width == self._width:
            out._ids = self._ids  # the same packed set: its ids, if unpacked, stand
        return out

    def __repr__(self) -> str:
        shown = {k: getattr(self, k) for k in ("forced", "banned", "measure_mass", "stop", "event", "rewind")}
        body = ", ".join(f"{k}={v!r}" for k, v in shown.items() if v not in (None, (), False, []))
        mask = "packed" if self._words is not None else ("tensor" if self._allowed is not None else None)
        extra = [f"mask={mask}"] if mask else []
        extra += [f"{k}=..." for k in ("scores", "divert", "veto") if getattr(self, k) is not None]
        return f"Plan({', '.join(x for x in (body, *extra) if x)})"


class GrammarStep(NamedTuple):
    """A row's step that is exactly its grammar's (:meth:`Policy.grammar_step`): the allowed set is the grammar
    engine's (``matcher``'s state, not computed yet: a greedy row whose top token the grammar holds never needs
    it), nothing is banned, no scores, divert, event or mass to measure; ``veto``: closing's, if it acts at this
    step. ``stop``: the grammar ends the row instead (no token)."""

    matcher: Matcher | None = None
    stop: str | None = None
    veto: Veto | None = None

    def plan(self) -> Plan:
        """The same step as a :class:`Plan` (what the policy's ``plan`` returns), for the general path: its
        allowed set computed now, or the row's stop (:func:`grammar_stop`: a dead end is found only here)."""
        m = self.matcher
        stop = self.stop if m is None else grammar_stop(m)
        return Plan(stop=stop) if stop is not None or m is None else Plan(words=m.allowed_words(), width=m.n_logits,
                                                                         veto=self.veto)


def grammar_stop(m: Matcher) -> str | None:
    """A grammar row's end before a token: the grammar is complete, or the engine is in error or at a dead end
    (nothing allowed: the one question here that computes the allowed set)."""
    if m.stopped:  # complete, or the engine's error state
        return Finish.CONSTRAINT_ERROR if m.error is not None else Finish.CONSTRAINT_COMPLETE
    return Finish.CONSTRAINT_ERROR if m.allowed_empty() else None


@dataclass
class Divert:
    """Replace a draw: when the token chosen under a plan is one of ``tokens``, it is not emitted; ``then()`` (the
    policy changing state, e.g. InWriting switching to its answer) gives the plan that chooses instead, at the
    same step from the same logits. Greedy and sampled decoding follow one rule: under greedy the draw is the
    argmax. With ``otherwise`` every draw is replaced, and the draw only says which plan replaces it (InWriting at
    the end of its preamble: the switch's reason is whether the model's argmax stops there, ``by_argmax``, so no
    random number is spent on it)."""

    tokens: frozenset[int]
    then: Callable[[], Plan]
    otherwise: Callable[[], Plan] | None = None  # a draw outside ``tokens`` is replaced by this plan's choice too
    by_argmax: bool = False  # the "draw" is the unmasked argmax even when sampling (no random number is used)

    def resolve(self, drawn: int) -> Plan | None:
        """The plan that replaces a draw of ``drawn`` (None: the draw stands)."""
        if drawn in self.tokens:
            return self.then()
        return None if self.otherwise is None else self.otherwise()


@dataclass
class Veto:
    """Refuse a chosen token after the fact: when ``accept(token)`` is False, the token is masked out and the
    choice is made again from the same logits, so greedy takes the best accepted token and sampling draws from
    the distribution conditioned on an accepted token (rejection). After ``tries`` refusals ``fallback`` is
    emitted as a forced token (``fallback()`` is asked only then). For conditions too costly to evaluate over the
    whole vocabulary (closing mode asks whether a completion still fits after the token)."""

    accept: Callable[[int], bool | None]
    fallback: Callable[[], int]
    tries: int = 8
    proves: bool = False
    """``accept`` is True only for a token the grammar allows (its proof checks the token itself, as closing's
    does), and answers None, without effect, for a token the grammar does not allow (False: allowed, and
    refused): it may be asked before the grammar, and its answer is the grammar's check too."""


class Policy(ABC):
    """Per-row strategy state. ``phase`` names the part of the output the next token belongs to.

    ``coupled``: the policy reads another row's state of the same step (suffix-beam's constrained row follows
    its free row's token). A batch with such a row is stepped row by row (plan, choose, advance, then the next
    row); every other batch plans all rows, chooses the greedy ones together, then advances them."""

    phase: str = Phase.MAIN
    coupled: bool = False

    @abstractmethod
    def plan(self, logits: torch.Tensor, step: int) -> Plan:
        """Decide what applies at ``step`` (0-based count of tokens generated so far), seeing raw logits."""

    @abstractmethod
    def advance(self, token: int) -> str | None:
        """Take the emitted token; return a finish reason to stop, or None to continue."""

    def budget_exhausted(self) -> str:
        """Finish reason when the token budget runs out (a policy can report an incomplete constraint)."""
        return Finish.LENGTH

    def advance_last(self, token: int) -> str:
        """Take the row's last token (its budget ends with it) and return the row's finish: :meth:`advance`'s,
        else the budget's. A policy may skip the state no later step reads (``ConstrainedPolicy``)."""
        return self.advance(token) or self.budget_exhausted()

    def row_stats(self) -> dict[str, Any]:
        """What the policy reports about how it decoded its row, merged into ``Result.stats`` when the row ends
        (closing mode's ``closing_changed_tokens``). A wrapping policy reports its inner policy's."""
        return {}

    def grammar_step(self, step: int) -> GrammarStep | None:
        """Instead of :meth:`plan`, when the row's step is exactly its grammar's (:class:`GrammarStep`): the host
        loop then takes a greedy row's top token where the grammar holds it without building a plan
        (:meth:`~formtax.decoding.loop._Stepper.plan_row`). The step must be what :meth:`plan` would have
        returned, with the same effects on the policy. None (the default): plan as usual."""
        return None

    def mask_matcher(self) -> Matcher | None:
        """The grammar matcher whose allowed set this row's next :meth:`plan` reads, if it is known before
        planning: the loop then computes the masks of all such rows of a step in one call to the engine
        (:func:`~formtax.constraints.compile.fill_masks`). None (the default) leaves the policy to ask its
        matcher itself; either way the plan sees the same set."""
        return None

    def lowered(self, whole: Constraint | None) -> LoweredRow:
        """What this policy becomes on an engine that owns its loop (:mod:`formtax.decoding.lowering`).
        ``whole``: the constraint that alone governs the row's output, when the strategy names one. The default
        is ``live`` (the policy is stepped); a policy that is exactly free text or exactly a grammar says so."""
        return LoweredRow(Lowering.LIVE, inner=self)


class Wrapping(Policy):
    """A policy around another one (``inner``: a forced prefix, a server's hooks, a statistic's wrapper, a vLLM
    row's seam) that hands through what it does not change: the finish at an exhausted budget and the row's
    statistics. Its own ``plan`` / ``advance`` say what it does change."""

    inner: Policy

    def budget_exhausted(self) -> str:
        return self.inner.budget_exhausted()

    def row_stats(self) -> dict[str, Any]:
        return self.inner.row_stats()


class Transparent(Wrapping):
    """A wrapping that watches or edits a row without being a phase of it (a server's hooks, a stream's tap, a
    replay's stop strings): its phase is the inner policy's (what the loop records), and the plan, the advance
    and the mask's matcher are the inner policy's unless it says otherwise."""

    @property
    def phase(self) -> str:
        return self.inner.phase

    @phase.setter
    def phase(self, value: str) -> None:
        self.inner.phase = value

    def plan(self, logits: torch.Tensor, step: int) -> Plan:
        return self.inner.plan(logits, step)

    def advance(self, token: int) -> str | None:
        return self.inner.advance(token)

    def grammar_step(self, step: int) -> GrammarStep | None:
        """The inner policy's, unless this wrapping plans its own way (then it must say when it does not)."""
        return self.inner.grammar_step(step) if type(self).plan is Transparent.plan else None

    def mask_matcher(self) -> Matcher | None:
        return self.inner.mask_matcher()


@dataclass
class Step:
    token: int
    phase: str
    forced: bool
    masked: bool


@dataclass
class RowRequest:
    prompt_ids: list[int]
    policy: Policy
    max_tokens: int
    seed: int = 0
    # the row's own sampling (temperature, top-p/k, min-p); None: the decode()'s. Rows of one batch may differ.
    sampling: Sampling | None = None
    # how to build this row's policy again in another process (vLLM's engine, which steps it there): a picklable
    # callable taking that process's Backend (its tokenizer); None: the row runs only where it was built
    recipe: Callable[[Any], Policy] | None = None


@dataclass
class RowOutput:
    prompt_ids: list[int]
    tokens: list[int] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)
    finish_reason: str = ""
    masked_mass: float | None = None
    events: list[dict[str, Any]] = field(default_factory=list)
    wall_s: float = 0.0
    forward_passes: int = 0
    fault: BaseException | None = field(default=None, repr=False, compare=False)  # why a ROW_FAULT row ended

    def phase_tokens(self, phase: str) -> list[int]:
        return [s.token for s in self.steps if s.phase == phase]

    def count(self, phase: str | None = None) -> int:
        return sum(1 for s in self.steps if phase is None or s.phase == phase)


def relay(plan: Plan, sync: Callable[[], None]) -> Plan:
    """``plan`` as a wrapping policy returns it: if it diverts, ``sync`` runs after the inner policy's switch (so
    the wrapper's ``phase`` follows the inner one's, as after any other plan)."""
    if plan.divert is None:
        return plan
    inner = plan.divert.then

    def then() -> Plan:
        replaced = inner()
        sync()
        return replaced

    otherwise = plan.divert.otherwise
    if otherwise is None:
        return plan.replace(divert=Divert(plan.divert.tokens, then, by_argmax=plan.divert.by_argmax))
    first = otherwise

    def other() -> Plan:
        replaced = first()
        sync()
        return replaced

    return plan.replace(divert=Divert(plan.divert.tokens, then, other, plan.divert.by_argmax))
