"""The step kernel: one implementation of each decision a driver makes for a row at one step.

Every driver of a row (the decode loop on the host or a device, formtax's rows inside vLLM's engine, replay of an
engine's tokens) asks the same questions at a step, and each is answered here once:

* which scores a row picks from (:meth:`Plan.base`: a policy's own scores, else the raw logits);
* the flags of an emitted token (:class:`Choice`: ``masked``, ``forced``; :func:`flags`);
* the allowed set less the bans, as llguidance's packed words (:func:`allowed_words`), for a device round or an
  engine's batched mask;
* greedy or sampled choice under a mask and bans (:func:`choose`), the veto's re-choice (:func:`choose_vetted`),
  a batch of greedy rows at once (:func:`greedy_batch`);
* a divert's draw and the plan that stands (:func:`draw_divert`, :func:`decide`), or, for an engine that samples
  on its own, the divert resolved before it draws (:func:`resolve_divert`);
* whether a token an engine emitted is one the plan admits (:func:`admits`, replay);
* the masked mass (:func:`masked_mass`).

The loop (loop.py) keeps only the order of things: plan every row, choose, emit, advance, rewind or finish.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np
import torch

from formtax.decoding.devicestep import clear_bits, pack_bool
from formtax.decoding.plan import Plan
from formtax.decoding.sampling import GREEDY, Sampling, as_sampling
from formtax.tensorops import argmax, argmax_rows, holds, masked_argmax, ranked_masked

__all__ = ["Choice", "admits", "allowed_words", "choose", "choose_vetted", "decide", "draw_divert", "flags",
           "greedy_batch", "masked_mass", "resolve_divert", "vetted"]


class Choice(NamedTuple):
    """A row's token at one step, and how it came: ``masked`` (a mask or bans applied), ``forced`` (no choice: a
    forced token, a one-token allowed set, or the veto's fallback)."""

    token: int
    masked: bool
    forced: bool


def flags(plan: Plan, token: int) -> Choice:
    """The :class:`Choice` of ``token`` chosen under ``plan``'s mask and bans (not its forced token)."""
    return Choice(token, plan.allowed is not None or bool(plan.banned),
                  plan.allowed is not None and plan.allowed_count() == 1)


def allowed_words(plan: Plan, n_words: int) -> np.ndarray | None:
    """The plan's allowed set less its bans as packed int32 words (llguidance's layout; None: nothing masked)."""
    words = plan.packed_words() if plan.allowed is not None else None
    if plan.allowed is not None and words is None:
        words = pack_bool(plan.allowed, n_words)
    if plan.banned:
        words = clear_bits(words if words is not None else np.full(n_words, -1, dtype=np.int32), plan.banned)
    return words


def admits(plan: Plan, token: int) -> bool:
    """Whether ``token``, emitted by an engine that was given this plan, is one the plan allows (replay: a divert
    cannot be replayed, so a diverting plan admits none of its divert tokens, and none when every draw diverts)."""
    if plan.forced is not None:
        return token == plan.forced
    return not ((plan.allowed is not None and not bool(plan.allowed[token])) or token in plan.banned
                or (plan.divert is not None
                    and (token in plan.divert.tokens or plan.divert.otherwise is not None)))


def resolve_divert(plan: Plan, logits: torch.Tensor, sampling: Sampling | float, gen: torch.Generator | None
                   ) -> Plan:
    """A diverting plan as one an engine that samples on its own can apply (vLLM's logits processor).

    Greedy (or a divert decided by the argmax): the replacement plan if the argmax is a divert token, else the
    ``otherwise`` plan if there is one, else the plan with those tokens banned (whose argmax is the same token).
    Sampled: the replacement with probability ``p(divert tokens)``, else as above, from which the engine's draw
    is distributed as the loop's kept draw (the model's distribution conditioned on not drawing a divert token).
    So the outputs have the loop's distribution; the random stream is the engine's.
    """
    assert plan.divert is not None
    s = as_sampling(sampling)
    d = plan.divert
    if s.greedy or d.by_argmax:
        hit = int(torch.argmax(logits).item()) in d.tokens
    else:
        p = torch.softmax(s.warp(logits).double(), dim=-1)
        hit = float(torch.rand((), generator=gen, dtype=torch.float64).item()) < float(p[sorted(d.tokens)].sum())
    if hit:
        return d.then()
    if d.otherwise is not None:
        return d.otherwise()
    return dataclasses.replace(plan, divert=None, banned=sorted(set(plan.banned) | d.tokens))


def choose(
    logits: torch.Tensor, plan: Plan, sampling: Sampling, gen: torch.Generator | None
) -> tuple[int, bool]:
    """Pick a token under the plan; returns (token, masked)."""
    masked = plan.allowed is not None or bool(plan.banned)
    if masked:
        logits = logits.clone()
        if plan.allowed is not None:
            logits.masked_fill_(~plan.allowed.to(logits.device), float("-inf"))
        if plan.banned:
            logits[list(plan.banned)] = float("-inf")
    if sampling.greedy:
        return argmax(logits), masked
    probs = torch.softmax(sampling.warp(logits), dim=-1)  # the filters act on the masked distribution
    return int(torch.multinomial(probs, 1, generator=gen).item()), masked


def choose_vetted(
    logits: torch.Tensor, plan: Plan, sampling: Sampling, gen: torch.Generator | None
) -> Choice:
    """Pick a token under a plan that may carry a :class:`Veto`; returns (token, masked, forced)."""
    token, masked = choose(logits, plan, sampling, gen)
    forced = plan.allowed is not None and plan.allowed_count() == 1
    return vetted(logits, plan, sampling, gen, token, masked, forced)


def vetted(logits: torch.Tensor, plan: Plan, sampling: Sampling, gen: torch.Generator | None, token: int,
           masked: bool, forced: bool) -> Choice:
    """The plan's veto applied to a first choice ``token`` (the rest of :func:`choose_vetted`)."""
    veto = plan.veto
    if veto is None or veto.accept(token):
        return Choice(token, masked, forced)
    refused = [token]
    ranked = ranked_masked(logits, plan.allowed, [*plan.banned, token], veto.tries - 1) if sampling.greedy else None
    for k in range(veto.tries - 1):
        if ranked is not None:  # greedy on the host: the same tokens, ranked once without a masked copy of the row
            token = ranked[k]
        else:
            token, _m = choose(logits, dataclasses.replace(plan, banned=[*plan.banned, *refused]), sampling, gen)
        if veto.accept(token):
            return Choice(token, True, False)
        refused.append(token)
    return Choice(veto.fallback, True, True)


def draw_divert(plan: Plan, logits: torch.Tensor, sampling: Sampling, gen: torch.Generator | None,
                top: Callable[[], int]) -> tuple[Plan, tuple[int, bool] | None]:
    """The plan that stands at a step, and the draw it keeps: a diverting plan draws first (``top()``: the row's
    unmasked argmax, asked only when the draw is that), and a draw among its divert tokens is replaced by the next
    plan's choice (:class:`Divert`). Every driver that chooses tokens itself (the loop, formtax's rows inside
    vLLM) takes a step through this and :func:`decide`."""
    if plan.divert is None:
        return plan, None
    base = plan.base(logits)
    unmasked = plan.scores is None and plan.allowed is None and not plan.banned
    if (sampling.greedy or plan.divert.by_argmax) and unmasked:
        drawn = (top(), False)
    elif plan.divert.by_argmax:
        drawn = choose(base, plan, GREEDY, None)
    else:
        drawn = choose(base, plan, sampling, gen)
    replaced = plan.divert.resolve(drawn[0])
    return (plan, drawn) if replaced is None else (replaced, None)


def decide(plan: Plan, drawn: tuple[int, bool] | None, logits: torch.Tensor, sampling: Sampling,
           gen: torch.Generator | None) -> Choice:
    """The token of a plan that stands (after :func:`draw_divert`): (token, masked, forced)."""
    if plan.forced is not None:
        return Choice(plan.forced, plan.allowed is not None, True)
    if drawn is not None:  # kept from the diverting plan: its divert tokens were in effect masked
        return Choice(drawn[0], True, False)
    return choose_vetted(plan.base(logits), plan, sampling, gen)


def greedy_batch(logits: Sequence[torch.Tensor], chosen: list[tuple[int, Plan]], top: Callable[[], list[int]]
                 ) -> list[Choice]:
    """The greedy choice of several rows at once; token for token what :func:`choose` gives row by row.

    ``top()`` is the argmax of every row of the step's raw logits, computed once for the step (one host
    transfer); ``logits`` are the step's rows (views). A row without a mask takes its top token. A masked row
    whose top token is allowed and not banned takes it too: the first maximal index overall, when allowed, is
    the first maximal index among the allowed ones, so this is exactly the masked argmax, without touching the
    logits. The other masked rows (and rows choosing from their own scores) take the first maximal index among
    their allowed ids, read on the host (:func:`~formtax.tensorops.masked_argmax`); on a device, one masked fill
    over their stacked logits and one argmax. Allowed sets are counted (a set of one is a forced token) by
    :meth:`Plan.allowed_count`."""
    out: list[Choice] = [Choice(0, False, False)] * len(chosen)
    rest: list[int] = []
    for k, (pos, plan) in enumerate(chosen):
        if plan.scores is not None:
            rest.append(k)
            continue
        token = top()[pos]
        if plan.allowed is None and not plan.banned:
            out[k] = Choice(token, False, False)
        elif (plan.allowed is None or holds(plan.allowed, token)) and token not in plan.banned:
            out[k] = flags(plan, token)
        else:
            rest.append(k)
    if not rest:
        return out
    slow: list[int] = []
    for k in rest:  # on the host: each row's argmax over its allowed ids, without a copy of its logits
        pos, plan = chosen[k]
        found = masked_argmax(plan.base(logits[pos]), plan.allowed, plan.banned)
        if found is None:
            slow.append(k)
            continue
        out[k] = flags(plan, found)
    if not slow:
        return out
    rows = [chosen[k] for k in slow]  # on a device: one masked fill over the stacked rows, one argmax
    base = torch.stack([plan.base(logits[pos]) for pos, plan in rows])
    with_allowed = [j for j, (_, plan) in enumerate(rows) if plan.allowed is not None]
    if with_allowed:
        allowed = torch.stack([rows[j][1].allowed for j in with_allowed])  # type: ignore[misc]
        sub = base[with_allowed] if len(with_allowed) != len(rows) else base
        sub.masked_fill_(~allowed.to(base.device, non_blocking=True), float("-inf"))
        if sub is not base:
            base[with_allowed] = sub
    for j, (_, plan) in enumerate(rows):
        if plan.banned:
            base[j, list(plan.banned)] = float("-inf")
    tokens = argmax_rows(base)
    for j, k in enumerate(slow):
        out[k] = flags(rows[j][1], tokens[j])
    return out

def masked_mass(logits: torch.Tensor, allowed: torch.Tensor) -> float:
    """Probability mass the unconstrained model puts outside ``allowed`` (softmax of raw logits)."""
    p = torch.softmax(logits.double(), dim=-1)
    return float(1.0 - p[allowed].sum().item())
