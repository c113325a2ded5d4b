"""The step kernel: one implementation of each decision a driver makes for a row at one step.

Every driver of a row (the decode loop on the host or a device, formtax's rows inside vLLM's engine, replay of an
engine's tokens) asks the same questions at a step, and each is answered here once:

* which scores a row picks from (:meth:`Plan.base`: a policy's own scores, else the raw logits);
* the flags of an emitted token (:class:`Choice`: ``masked``, ``forced``; :func:`flags`);
* the allowed set less the bans, as llguidance's packed words (:func:`allowed_words`), for a device round or an
  engine's batched mask;
* greedy or sampled choice under a mask and bans (:func:`choose`), the veto's re-choice (:func:`vetted`, also
  from a device round's ranked ids), a batch of greedy rows at once (:func:`greedy_batch`);
* a divert's draw and the plan that stands (:func:`draw_divert`, :func:`decide`);
* for an engine that samples on its own, the edit of a row's logits (:func:`edit_row`: what the engine cannot decide,
  a veto, a divert, a forced token, is decided here and forced);
* whether a step ends the row (:class:`End`: a plan's stop or rewind, :func:`plan_end`; the policy's finish and
  the budget, :meth:`RowCursor.accept`; an engine that stopped first, :meth:`RowCursor.engine_end`);
* whether a token an engine emitted is one the plan admits (:func:`admits`, replay);
* the masked mass (:func:`masked_mass`).

:class:`RowCursor` is one row's bookkeeping around those decisions (its events, its masked mass, its tokens and
their flags, its finish), the same for every driver. The loop (loop.py) keeps only the order of things: plan
every row, choose, emit, advance, rewind or finish.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np
import torch

from formtax.constraints.compile import HELD_NOT_ALONE, REFUSED
from formtax.decoding.devicestep import Entry, clear_bits, device_round, pack_bool
from formtax.decoding.plan import Finish, GrammarStep, Plan, RowOutput, RowRequest, Step
from formtax.decoding.sampling import GREEDY, Sampling
from formtax.tensorops import (
    answered_picks,
    argmax,
    ids_from_words,
    masked_argmax,
    ranked_held,
    ranked_in_words,
    ranked_masked,
)

__all__ = ["DRAWN", "Choice", "End", "RowCursor", "admits", "allowed_words", "choose", "choose_vetted", "decide",
           "draw_divert", "edit_row", "flags", "grammar_choice", "greedy_batch", "mass_words", "masked_mass",
           "plan_end", "rechosen", "rejudged", "vetted"]


class Choice(NamedTuple):
    """A row's token at one step, and how it came: ``masked`` (a mask or bans applied), ``forced`` (no choice: a
    forced token, a one-token allowed set, or the veto's fallback). An engine that draws the token itself gets a
    choice whose token is :data:`DRAWN` (the flags are known before the draw)."""

    token: int
    masked: bool
    forced: bool


DRAWN = -1
"""The token of a :class:`Choice` an engine draws after the edit (:func:`edit_row`): known only once it is emitted."""


class End(NamedTuple):
    """How a step ends a row, the one answer every driver acts on (:func:`plan_end`, :meth:`RowCursor.accept`,
    :meth:`RowCursor.opening`, :meth:`RowCursor.engine_end`): finish with ``reason`` (``error``: why an engine's
    row failed, its client's text), or, with ``rewind``, emit nothing and go back to that many tokens."""

    reason: str | None = None
    rewind: int | None = None
    error: str | None = None


def plan_end(plan: Plan, rewinds: bool) -> End | None:
    """Whether a plan ends its row's step without a token: a stop (the grammar is complete, a policy's finish), or
    a rewind, which a driver that cannot crop its cache (``rewinds=False``: an engine's row) turns into an
    error. None: the step emits a token."""
    if plan.stop is not None:
        return End(plan.stop)
    if plan.rewind is not None:
        if rewinds:
            return End(rewind=plan.rewind)
        return End(Finish.BACKEND_ERROR, error="a row inside an engine cannot rewind (no KV crop)")
    return None


def flags(plan: Plan, token: int) -> Choice:
    """The :class:`Choice` of ``token`` chosen under ``plan``'s mask and bans (not its forced token)."""
    masked = plan.has_mask
    return Choice(token, masked or bool(plan.banned), masked and plan.only(token))


def allowed_words(plan: Plan, n_words: int, allowed: np.ndarray | None = None) -> np.ndarray | None:
    """The plan's allowed set less its bans as packed int32 words (llguidance's layout; None: nothing masked).
    ``allowed``: the allowed set's words when the caller has them already (:func:`mass_words`)."""
    words = mass_words(plan, n_words) if allowed is None else allowed
    if plan.banned:
        words = clear_bits(words if words is not None else np.full(n_words, -1, dtype=np.int32), plan.banned)
    return words


def mass_words(plan: Plan, n_words: int) -> np.ndarray | None:
    """The plan's allowed set alone (before its bans: the masked mass is the grammar's) as packed words."""
    if not plan.has_mask:
        return None
    words = plan.packed_words()
    return pack_bool(plan.allowed, n_words) if words is None else words  # type: ignore[arg-type]


def admits(plan: Plan, token: int) -> bool:
    """Whether ``token``, emitted by an engine that was given this plan, is one the plan allows (replay: a divert
    cannot be replayed, so a diverting plan admits none of its divert tokens, and none when every draw diverts)."""
    if plan.forced is not None:
        return token == plan.forced
    return not ((plan.has_mask and not plan.holds(token)) or token in plan.banned
                or (plan.divert is not None
                    and (token in plan.divert.tokens or plan.divert.otherwise is not None)))


def _pick(logits: torch.Tensor, plan: Plan, sampling: Sampling, gen: torch.Generator | None) -> int:
    """The token chosen under the plan's mask and bans: the masked argmax, or a draw from the masked, warped
    distribution with the row's generator."""
    if plan.has_mask or plan.banned:
        logits = logits.clone()
        if plan.allowed is not None:  # (unpacked here: a sampled or re-chosen row reads the whole set)
            logits.masked_fill_(~plan.allowed.to(logits.device), float("-inf"))
        if plan.banned:
            logits[list(plan.banned)] = float("-inf")
    if sampling.greedy:
        return argmax(logits)
    probs = torch.softmax(sampling.warp(logits), dim=-1)  # the filters act on the masked distribution
    return int(torch.multinomial(probs, 1, generator=gen).item())


def choose(logits: torch.Tensor, plan: Plan, sampling: Sampling, gen: torch.Generator | None) -> Choice:
    """Pick a token under the plan's mask and bans (greedy, or sampled from the row's generator)."""
    return flags(plan, _pick(logits, plan, sampling, gen))


def choose_vetted(
    logits: torch.Tensor, plan: Plan, sampling: Sampling, gen: torch.Generator | None
) -> Choice:
    """Pick a token under a plan that may carry a :class:`Veto`."""
    return vetted(logits, plan, sampling, gen, choose(logits, plan, sampling, gen))


def vetted(logits: torch.Tensor, plan: Plan, sampling: Sampling, gen: torch.Generator | None, first: Choice,
           ranked: Sequence[int] | None = None) -> Choice:
    """The plan's veto applied to a first choice (the rest of :func:`choose_vetted`): a refused token is masked
    and the choice made again, up to the veto's ``tries`` choices in all, then its fallback is forced.

    Greedy re-choices walk the row's ranked ids (what the repeated masked argmax gives, refusals banned one by
    one): ``ranked``, the next ids after ``first`` when a device round ranked them already, else ranked here
    on the host without a masked copy of the row; sampled ones draw again from the row's generator."""
    veto = plan.veto
    if veto is None or veto.accept(first.token):
        return first
    return rechosen(logits, plan, sampling, gen, [first.token], ranked)


def rechosen(logits: torch.Tensor, plan: Plan, sampling: Sampling, gen: torch.Generator | None,
             refused: Sequence[int], ranked: Sequence[int] | None = None) -> Choice:
    """:func:`vetted` after its veto refused the first choice and any re-choices after it, ``refused`` in order
    (not asked again: a refusal may have searched); ``ranked``: the ids after them."""
    veto = plan.veto
    assert veto is not None
    refused = list(refused)
    tries = veto.tries - len(refused)
    if ranked is None and sampling.greedy:
        words = plan.packed_words()
        if words is not None:  # a dense set by repeated argmax (a sparse one gives up: by its ids, below)
            ranked = ranked_in_words(logits, words, plan.width, [*plan.banned, *refused], tries)
        if ranked is None:
            ids = plan.allowed_ids() if plan.has_mask else None  # (None for a mask off the host: the tensor)
            ranked = ranked_masked(logits, plan.allowed if ids is None else None, [*plan.banned, *refused],
                                   tries, ids)
    for k in range(tries):
        if ranked is not None:
            token = ranked[k]
        else:
            token = _pick(logits, plan.replace(banned=[*plan.banned, *refused]), sampling, gen)
        if veto.accept(token):
            return Choice(token, True, False)
        refused.append(token)
    return Choice(veto.fallback(), True, True)


def grammar_choice(g: GrammarStep, token: int, logits: Callable[[], torch.Tensor]) -> Choice | Plan:
    """The greedy choice of a row whose step is its grammar's (:class:`GrammarStep`), given its top token: that
    token where the grammar holds it and the veto (closing's) accepts it, with :func:`flags`' flags, the choice
    :func:`greedy_batch` and :func:`vetted` make under ``g.plan()``, without building it. Otherwise the plan:
    a refused top token is re-chosen here (:func:`rechosen`: the veto is not asked twice; in a state that forces
    no bytes its re-choices are ranked by the engine's check of each token, that state's mask bit, so no mask is
    computed, or, for a proving veto, asked of the veto alone: :func:`rejudged`), and a top token the grammar does
    not hold gives the state's forced token where the engine names one
    (:meth:`~formtax.constraints.compile.Matcher.forced_token`: the set is that token alone; vetted as
    :func:`vetted` vets a first choice), else the plan (or the row's stop, at a dead end), for the masked argmax of
    :func:`greedy_batch` (``logits()``: the row's logits, read only for a re-choice).

    The top token is checked first, alone, and the allowed set is computed only where that check fails or the
    flags need it (a held token proved not alone by :meth:`~formtax.constraints.compile.Matcher.not_alone` is
    not forced; else the set is counted). Exact for greedy: the first maximal index overall, when allowed, is
    the first maximal index among the allowed ones. (llama.cpp's sampler checks its grammar the same way,
    sampled token first.) A veto whose proof checks the token itself (``Veto.proves``: closing's) is asked
    first, in a state that forces no bytes, and its acceptance is the grammar's check too (one engine call)."""
    m, veto = g.matcher, g.veto
    assert m is not None
    if veto is None:  # the grammar's check alone (and its proof the token is not alone, in the same call)
        held = m.check(token)
        if held:
            return Choice(token, True, held != HELD_NOT_ALONE and g.plan().only(token))
        forced = m.forced_token()  # a set of one token: its masked argmax, forced
        return Choice(forced, True, True) if forced is not None else g.plan()
    got = m.check_proved(token, veto.accept) if veto.proves else None
    if got is not None:  # a state that forces no bytes: the veto's proof is the grammar's check too (one check)
        if got > 0:
            return Choice(token, True, got != HELD_NOT_ALONE and g.plan().only(token))
        # refused: re-chosen by the veto's own checks; not the grammar's: its masked argmax (a state that forces no
        # bytes names no forced token)
        return rejudged(logits(), g, token) if got == REFUSED else g.plan()
    held = m.holds(token)
    kept = held and veto.accept(token)
    if kept:
        return Choice(token, True, not m.not_alone(token) and g.plan().only(token))
    if not held:
        forced = m.forced_token()  # a set of one token: its masked argmax, vetted as vetted() does
        if forced is None:
            return g.plan()
        if veto.accept(forced):
            return Choice(forced, True, True)
        token = forced
    if not m.forces():  # the veto refused it: its re-choices ranked by the engine's checks (the mask's bits here)
        ranked = ranked_held(logits(), m.holds, [token], veto.tries - 1)
        if ranked is not None:
            return rechosen(logits(), Plan(veto=veto), GREEDY, None, [token], ranked)
    return rechosen(logits(), g.plan(), GREEDY, None, [token])


def rejudged(logits: torch.Tensor, g: GrammarStep, token: int) -> Choice:
    """The re-choices of a row whose proving veto (``Veto.proves``: closing's) refused its top token ``token``,
    in a state that forces no bytes (there the engine's check of one token is its mask bit): the row's picks, in
    the masked argmax's order, are each asked of the veto alone. Its None passes over a token the grammar does not
    allow (as the mask does), its False is one of its tries, and after ``tries`` refusals comes its fallback: the
    choice :func:`rechosen` makes from the ranked allowed tokens, with one engine call a pick instead of the
    grammar's check and then the veto's. Where the picks give out (more than :data:`DENSE_SPARE` passed over: a
    sparse set; or a row off the host's fast path), :func:`rechosen` goes on by the mask, the refusals so far
    banned."""
    veto = g.veto
    assert veto is not None
    refused = [token]
    walk = answered_picks(logits, veto.accept, refused, veto.tries + 1) if veto.tries > 1 else None
    for j, verdict in walk or ():
        if j < 0:  # nothing finite left: the mask's ranking pads as the masked argmax does
            break
        if verdict:
            return Choice(j, True, False)
        refused.append(j)
        if len(refused) == veto.tries:
            break
    if len(refused) == veto.tries:
        return Choice(veto.fallback(), True, True)
    return rechosen(logits, g.plan(), GREEDY, None, refused)


def draw_divert(plan: Plan, logits: torch.Tensor, sampling: Sampling, gen: torch.Generator | None,
                top: Callable[[], int]) -> tuple[Plan, int | None]:
    """The plan that stands at a step, and the draw it keeps: a diverting plan draws first (``top()``: the row's
    unmasked argmax, asked only when the draw is that), and a draw among its divert tokens is replaced by the next
    plan's choice (:class:`Divert`). Every driver takes a step through this and :func:`decide` (or :func:`edit_row`,
    for an engine that draws after the edit: a divert is then settled here and its token forced)."""
    if plan.divert is None:
        return plan, None
    base = plan.base(logits)
    unmasked = plan.scores is None and not plan.has_mask and not plan.banned
    if (sampling.greedy or plan.divert.by_argmax) and unmasked:
        drawn = top()
    elif plan.divert.by_argmax:
        drawn = _pick(base, plan, GREEDY, None)
    else:
        drawn = _pick(base, plan, sampling, gen)
    replaced = plan.divert.resolve(drawn)
    return (plan, drawn) if replaced is None else (replaced, None)


def decide(plan: Plan, drawn: int | None, logits: torch.Tensor, sampling: Sampling,
           gen: torch.Generator | None) -> Choice:
    """The token of a plan that stands (after :func:`draw_divert`)."""
    if plan.forced is not None:
        return Choice(plan.forced, plan.has_mask, True)
    if drawn is not None:  # kept from the diverting plan: its divert tokens were in effect masked
        return Choice(drawn, True, False)
    return choose_vetted(plan.base(logits), plan, sampling, gen)


def edit_row(row: torch.Tensor, index: int, plan: Plan, drawn: int | None, view: torch.Tensor, sampling: Sampling,
         gen: torch.Generator | None, draws: bool) -> tuple[Choice, Entry | None]:
    """A step of a row of an engine that samples on its own (vLLM's logits processor): the row's choice and the
    edit of its logits (``row``, at ``index`` of the batch's logits; ``view``: the same row on the host).

    Whatever the engine cannot decide is decided here, as :func:`decide` decides it, and forced: a forced token,
    a draw a divert kept, a veto's choice, and every token of a row that chooses its own (``draws=False``:
    formtax's own backend, whose rows draw from their own generators). Otherwise (``draws``) the engine draws
    from the edited row: the plan's scores copied into ``row`` here, its allowed set less its bans as a batch
    entry (:func:`~formtax.decoding.devicestep.apply_entries`), bans alone set here on the host; the choice's
    token is then :data:`DRAWN`. None: the row's logits stand as they are."""
    if not draws or plan.forced is not None or drawn is not None or plan.veto is not None:
        choice = decide(plan, drawn, view, sampling, gen)
        return choice, Entry(index, forced=choice.token)
    choice = flags(plan, DRAWN)
    if plan.scores is not None:
        row.copy_(plan.scores.to(device=row.device, dtype=row.dtype))
    if not choice.masked:
        return choice, None
    if not plan.has_mask and row.device.type == "cpu":
        # bans alone (InWriting's reasoning phase bans EOS) on the host: set those few scores here. Same edit as
        # the batched application, which would unpack a whole-vocabulary mask for this row (issue 44's
        # profile: most of InWriting's plugin time at 64 rows)
        row[torch.tensor(sorted(plan.banned), dtype=torch.long)] = float("-inf")
        return choice, None
    return choice, Entry(index, allowed_words(plan, (row.shape[-1] + 31) // 32))


def greedy_batch(logits: Sequence[torch.Tensor], chosen: list[tuple[int, Plan]], top: Callable[[], list[int]]
                 ) -> list[Choice]:
    """The greedy choice of several rows at once; token for token what :func:`choose` gives row by row.

    ``top()`` is the argmax of every row of the step's raw logits, computed once for the step (one host
    transfer); ``logits`` are the step's rows (views). A row without a mask takes its top token. A masked row
    whose top token is allowed and not banned takes it too: the first maximal index overall, when allowed, is
    the first maximal index among the allowed ones, so this is exactly the masked argmax, without touching the
    logits. The other masked rows (and rows choosing from their own scores) take the first maximal index among
    their allowed ids, read on the host (:func:`~formtax.tensorops.masked_argmax`); off the host's fast path (a
    device, a dtype numpy cannot read), one :func:`~formtax.decoding.devicestep.device_round` for them all. Allowed sets are counted (a set of one is a forced token) by
    :meth:`Plan.allowed_count`."""
    out: list[Choice] = [Choice(0, False, False)] * len(chosen)
    rest: list[int] = []
    for k, (pos, plan) in enumerate(chosen):
        if plan.scores is not None:
            rest.append(k)
            continue
        token = top()[pos]
        if (not plan.has_mask or plan.holds(token)) and token not in plan.banned:
            out[k] = flags(plan, token)
        else:
            rest.append(k)
    if not rest:
        return out
    slow: list[int] = []
    for k in rest:  # on the host: each row's argmax over its allowed ids, without a copy of its logits
        pos, plan = chosen[k]
        if plan.has_mask:
            ids = plan.allowed_ids()  # (only the nonzero words unpacked: the sets of these rows are often small)
            found = None if ids is None else masked_argmax(plan.base(logits[pos]), None, plan.banned, ids)
        else:
            found = masked_argmax(plan.base(logits[pos]), None, plan.banned)
        if found is None:
            slow.append(k)
            continue
        out[k] = flags(plan, found)
    if not slow:
        return out
    rows = [chosen[k] for k in slow]  # on a device: one round, as the device step chooses (devicestep.py)
    bases = [plan.base(logits[pos]) for pos, plan in rows]
    width = int(bases[0].shape[-1])
    n_words = (width + 31) // 32
    got = device_round(bases, [Entry(j, allowed_words(plan, n_words)) for j, (_pos, plan) in enumerate(rows)],
                       width)
    for j, k in enumerate(slow):
        out[k] = flags(rows[j][1], got.ids[j])
    return out


SHIFT_FREE = 600.0
"""Scores whose maximum lies within this of 0 are exponentiated as they are by :func:`masked_mass` (float64's exp
is finite to 709 and normal from -708; a term 600 below the maximum is 1e-261 of it), others less their maximum."""


def masked_mass(logits: torch.Tensor, plan: Plan) -> float:
    """Probability mass the unconstrained model puts outside the plan's allowed set (softmax of raw logits, in
    float64).

    On the host through numpy (ours, and why: the same float64 softmax without torch's intra-op threads, which
    on a busy machine made this one row 50-70 ms instead of 0.3), the scores exponentiated unshifted where that
    is exact (:data:`SHIFT_FREE`; the mass is a ratio); a packed set is summed over its smaller side, the allowed
    ids (the plan's, which its choice reads too) or the rest (no whole-vocabulary mask is unpacked or
    multiplied); elsewhere with torch."""
    words = plan.packed_words()
    allowed = plan.allowed if words is None else None
    if (logits.device.type == "cpu" and not logits.requires_grad
            and logits.dtype in (torch.float32, torch.float64, torch.float16)
            and (allowed is None or allowed.device.type == "cpu")):
        x = logits.numpy()
        top = float(x.max())
        if -SHIFT_FREE < top < SHIFT_FREE:  # exp of the scores themselves stays normal: the same ratios, one pass less
            d = np.exp(x, dtype=np.float64)
        else:
            d = np.subtract(x, top, dtype=np.float64)
            np.exp(d, out=d)
        total = float(d.sum())
        width = int(x.shape[-1])
        if words is not None:
            ids = plan.allowed_ids()
            assert ids is not None
            if 2 * ids.size <= width or 32 * words.size < width:
                return 1.0 - float(d[ids].sum()) / total
            return float(d[ids_from_words(~words, width)].sum()) / total  # a dense set: the few ids outside it
        assert allowed is not None
        return 1.0 - float(np.dot(d, allowed.numpy().astype(np.float64))) / total  # 1/0 weights: one dot
    allowed = plan.allowed
    assert allowed is not None
    p = torch.softmax(logits.double(), dim=-1)
    return float(1.0 - p[allowed.to(p.device)].sum().item())


class RowCursor:
    """One row being decoded, the same for every driver: its request, its output, and the bookkeeping of a step.

    A driver asks :meth:`plan`, settles the plan (:func:`draw_divert`), calls :meth:`note` (the final plan's
    event), acts on :func:`plan_end` (a stop or a rewind: no token), calls :meth:`measure`, decides the token its
    own way, then :meth:`accept` it and acts on the :class:`End` that returns; :meth:`finish` names the finish."""

    def __init__(self, req: RowRequest) -> None:
        self.req = req
        self.policy = req.policy
        self.out = RowOutput(prompt_ids=list(req.prompt_ids))

    @property
    def step(self) -> int:
        """Tokens generated so far: the index of the step being planned."""
        return len(self.out.tokens)

    def plan(self, logits: torch.Tensor) -> Plan:
        return self.policy.plan(logits, self.step)

    def note(self, plan: Plan) -> None:
        """Record the plan's event at this step."""
        if plan.event is not None:
            self.out.events.append({"step": self.step, **plan.event})

    def measure(self, plan: Plan, mass: Callable[[], float | None]) -> None:
        """The masked mass of the row's first measured, masked step (``mass`` is asked only then)."""
        if self.measures(plan):
            self.out.masked_mass = mass()

    def measures(self, plan: Plan) -> bool:
        """Whether :meth:`measure` records this plan's masked mass (the row's first measured, masked step)."""
        return plan.measure_mass and plan.has_mask and self.out.masked_mass is None

    def opening(self) -> End | None:
        """A row with no budget ends before its first step, as its policy names an exhausted budget."""
        return End(self.policy.budget_exhausted()) if self.req.max_tokens <= 0 else None

    def accept(self, choice: Choice) -> End | None:
        """Emit the choice's token and advance the policy: the row's end (the policy's finish, e.g. a stop
        string, then the budget's), or None to go on."""
        out, policy = self.out, self.policy
        token, masked, forced = choice
        out.tokens.append(token)
        out.steps.append(Step(token, policy.phase, forced, masked))
        if len(out.tokens) >= self.req.max_tokens:  # the budget's last token
            return End(policy.advance_last(token))
        reason = policy.advance(token)
        return None if reason is None else End(reason)

    def engine_end(self, engine_finish: str | None, eos_id: int | None = None) -> End:
        """The end of a row whose engine stopped before its policy ended it. A live row (``eos_id``: the EOS its
        policy may let through) ends at that EOS, else the engine broke its plan; a replayed row ends with its
        policy's own stop when its next plan makes one, else with the engine's reason."""
        if eos_id is None:
            stop = self.plan(torch.empty(0)).stop
            return End(stop or Finish.ENGINE_ENDED)  # the caller names the finish (Finish values only)
        last = self.out.tokens[-1] if self.out.tokens else None
        if engine_finish == "stop" and last == eos_id:
            return End(Finish.EOS)
        return End(Finish.BACKEND_ERROR, error=f"the engine stopped the row ({engine_finish}) before its policy did")

    def finish(self, reason: str) -> None:
        self.out.finish_reason = reason
        stats = self.policy.row_stats()
        if stats:
            self.out.events.append({"step": self.step, "stats": stats})
