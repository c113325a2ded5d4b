"""The one decode loop.

Every strategy runs through :func:`decode`. A strategy contributes a small per-row :class:`Policy` that says, at
each step, what applies now (a forced token, an allowed set, banned tokens, whether to measure the probability
mass outside the allowed set) and what to do after a token (continue or stop). The loop does the rest, the same
way for every strategy: prefill, pick tokens (greedy at temperature 0, seeded sampling otherwise), record per
step whether the token was chosen or forced and whether a mask applied, drop finished rows from the batch.

A policy may also *rewind* its row (``Plan.rewind = n``): the loop forgets the row's tokens after the first ``n``,
crops the row's cache to match, and feeds the last kept token again (the prompt's last token when ``n = 0``), so
that at the next step the policy sees p(. | prompt, first n tokens) and plans step ``n`` again. Nothing is emitted
on a rewind step. The suffix strategies use it to branch back into an earlier point of a free run.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence

import torch

from formtax.constraints.compile import fill_masks
from formtax.decoding.engine import Backend, Batch
from formtax.decoding.plan import Divert, Plan, Policy, RowCursor, RowOutput, RowRequest, Step, Veto, relay
from formtax.decoding.sampling import Sampling, as_sampling
from formtax.tensorops import argmax, argmax_rows, holds, masked_argmax

# the vocabulary lives in decoding/plan.py; re-exported here, where the strategies have always found it
__all__ = ["Divert", "Plan", "Policy", "RowCursor", "RowOutput", "RowRequest", "Step", "Veto", "choose_vetted",
           "decode", "masked_mass", "relay", "resolve_divert"]


def resolve_divert(plan: Plan, logits: torch.Tensor, sampling: Sampling | float, gen: torch.Generator | None
                   ) -> Plan:
    """A diverting plan as one an engine that samples on its own can apply (vLLM's logits processor).

    Greedy: the replacement plan if the argmax is a divert token, else the plan with those tokens banned (whose
    argmax is the same token). Sampled: the replacement with probability ``p(divert tokens)``, else the plan with
    them banned, from which the engine's draw is distributed as the loop's kept draw (the model's distribution
    conditioned on not drawing a divert token). So the outputs have the loop's distribution; the random stream
    is the engine's.
    """
    assert plan.divert is not None
    s = as_sampling(sampling)
    tokens = plan.divert.tokens
    if s.greedy:
        hit = int(torch.argmax(logits).item()) in tokens
    else:
        p = torch.softmax(s.warp(logits).double(), dim=-1)
        hit = float(torch.rand((), generator=gen, dtype=torch.float64).item()) < float(p[sorted(tokens)].sum())
    if hit:
        return plan.divert.then()
    return dataclasses.replace(plan, divert=None, banned=sorted(set(plan.banned) | tokens))


def _choose(
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
) -> tuple[int, bool, bool]:
    """Pick a token under a plan that may carry a :class:`Veto`; returns (token, masked, forced)."""
    token, masked = _choose(logits, plan, sampling, gen)
    forced = plan.allowed is not None and plan.allowed_count() == 1
    return _vetted(logits, plan, sampling, gen, token, masked, forced)


def _vetted(logits: torch.Tensor, plan: Plan, sampling: Sampling, gen: torch.Generator | None, token: int,
            masked: bool, forced: bool) -> tuple[int, bool, bool]:
    """The plan's veto applied to a first choice ``token`` (the rest of :func:`choose_vetted`)."""
    veto = plan.veto
    if veto is None or veto.accept(token):
        return token, masked, forced
    refused = [token]
    for _ in range(veto.tries - 1):
        token, _m = _choose(logits, dataclasses.replace(plan, banned=[*plan.banned, *refused]), sampling, gen)
        if veto.accept(token):
            return token, True, False
        refused.append(token)
    return veto.fallback, True, True


def _greedy_batch(logits: Sequence[torch.Tensor], chosen: list[tuple[int, Plan]], top: Callable[[], list[int]]
                  ) -> list[tuple[int, bool, bool]]:
    """The greedy choice of several rows at once; token for token what :func:`_choose` gives row by row.

    ``top()`` is the argmax of every row of the step's raw logits, computed once for the step (one host
    transfer); ``logits`` are the step's rows (views). A row without a mask takes its top token. A masked row
    whose top token is allowed and not banned takes it too: the first maximal index overall, when allowed, is
    the first maximal index among the allowed ones, so this is exactly the masked argmax, without touching the
    logits. The other masked rows (and rows choosing from their own scores) take the first maximal index among
    their allowed ids, read on the host (:func:`~formtax.tensorops.masked_argmax`); on a device, one masked fill
    over their stacked logits and one argmax. Allowed sets are counted (a set of one is a forced token) by
    :meth:`Plan.allowed_count`."""
    out: list[tuple[int, bool, bool]] = [(0, False, False)] * len(chosen)
    rest: list[int] = []
    for k, (pos, plan) in enumerate(chosen):
        if plan.scores is not None:
            rest.append(k)
            continue
        token = top()[pos]
        if plan.allowed is None and not plan.banned:
            out[k] = (token, False, False)
        elif (plan.allowed is None or holds(plan.allowed, token)) and token not in plan.banned:
            out[k] = _masked_choice(plan, token)
        else:
            rest.append(k)
    if not rest:
        return out
    slow: list[int] = []
    for k in rest:  # on the host: each row's argmax over its allowed ids, without a copy of its logits
        pos, plan = chosen[k]
        found = masked_argmax(plan.scores if plan.scores is not None else logits[pos], plan.allowed, plan.banned)
        if found is None:
            slow.append(k)
            continue
        out[k] = _masked_choice(plan, found)
    if not slow:
        return out
    rows = [chosen[k] for k in slow]  # on a device: one masked fill over the stacked rows, one argmax
    base = torch.stack([plan.scores if plan.scores is not None else logits[pos] for pos, plan in rows])
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
        out[k] = _masked_choice(rows[j][1], tokens[j])
    return out


def _masked_choice(plan: Plan, token: int) -> tuple[int, bool, bool]:
    """(token, masked, forced) for a token chosen under a plan with a mask or bans."""
    return token, plan.allowed is not None or bool(plan.banned), plan.allowed is not None and plan.allowed_count() == 1


def _rewind(batch: Batch, pos: int, req: RowRequest, out: RowOutput, n: int) -> int:
    """Cut the row back to its first ``n`` generated tokens; return the token to feed again.

    The cache keeps one token fewer than the row (``n - 1`` generated; ``-1`` drops the prompt's last token), so
    feeding that token again yields exactly p(. | prompt, first n tokens) at the next step.
    """
    if not 0 <= n <= len(out.tokens):
        raise ValueError(f"cannot rewind a row to {n} tokens (it has {len(out.tokens)})")
    again = out.tokens[n - 1] if n > 0 else req.prompt_ids[-1]
    del out.tokens[n:]
    del out.steps[n:]
    batch.crop(pos, n - 1)
    return again


def _coupled(policy: Policy) -> bool:
    """Whether a row's policy, or one it wraps, reads another row's state (:attr:`Policy.coupled`)."""
    seen = 0
    p: object = policy
    while isinstance(p, Policy) and seen < 8:
        if p.coupled:
            return True
        p = getattr(p, "inner", None) or getattr(p, "answer", None)
        seen += 1
    return False


def masked_mass(logits: torch.Tensor, allowed: torch.Tensor) -> float:
    """Probability mass the unconstrained model puts outside ``allowed`` (softmax of raw logits)."""
    p = torch.softmax(logits.double(), dim=-1)
    return float(1.0 - p[allowed].sum().item())


class _Step:
    """One step of :func:`decode` over the live rows: plan each row, choose, emit and advance each row.

    Kept as an object so the loop in :func:`decode` reads top to bottom; the per-step fields are reset by
    :meth:`begin`. Planning settles forced, drawn and sampled tokens per row; greedy choices wait for
    :meth:`choose_greedy` (all greedy rows at once) unless rows are coupled."""

    def __init__(self, cursors: Sequence[RowCursor], gens: list[torch.Generator | None],
                 sampling: Sampling, batch: Batch, t0: float, together: bool) -> None:
        self.cursors, self.gens, self.sampling, self.batch, self.t0 = cursors, gens, sampling, batch, t0
        self.together = together
        self.begin(torch.empty(0), 0)

    def begin(self, logits: torch.Tensor, passes: int) -> None:
        self.logits, self.passes = logits, passes
        self.rows: Sequence[torch.Tensor] = logits.unbind(0)  # one call for every row's view (indexing is not free)
        self.decided: dict[int, tuple[int, bool, bool]] = {}  # pos -> (token, masked, forced)
        self.plans: dict[int, Plan] = {}
        self.greedy: list[tuple[int, Plan]] = []
        self.keep: list[int] = []
        self.next_tokens: list[int] = []
        self._top: list[int] | None = None

    def top(self) -> list[int]:
        """The argmax of every live row's raw logits, computed once per step (at the first row that needs it)."""
        if self._top is None:
            self._top = argmax_rows(self.logits)
        return self._top

    def plan_row(self, pos: int, i: int) -> None:
        cur, gen = self.cursors[i], self.gens[i]
        row_logits = self.rows[pos]
        plan = cur.plan(row_logits)
        drawn: tuple[int, bool] | None = None
        if plan.divert is not None:  # draw first; a diverted token is replaced by the next plan's choice
            if self.sampling.greedy and plan.scores is None and plan.allowed is None and not plan.banned:
                drawn = (self.top()[pos], False)  # the unmasked greedy draw: the step's shared argmax
            else:
                drawn = _choose(plan.scores if plan.scores is not None else row_logits, plan, self.sampling, gen)
            if drawn[0] in plan.divert.tokens:
                plan, drawn = plan.divert.then(), None
        cur.note(plan)
        self.plans[pos] = plan
        if plan.stop is not None or plan.rewind is not None:
            return
        cur.measure(plan, lambda: masked_mass(row_logits, plan.allowed))  # type: ignore[arg-type]
        if plan.forced is not None:
            self.decided[pos] = (plan.forced, plan.allowed is not None, True)
        elif drawn is not None:  # kept from the diverting plan: its divert tokens were in effect masked
            self.decided[pos] = (drawn[0], True, False)
        elif self.sampling.greedy and self.together:
            self.greedy.append((pos, plan))
        else:  # sampled (each row from its own generator), or a coupled row
            base = plan.scores if plan.scores is not None else row_logits
            self.decided[pos] = choose_vetted(base, plan, self.sampling, gen)

    def choose_greedy(self) -> None:
        """The greedy rows choose together; a row whose veto refuses its choice goes on alone."""
        if not self.greedy:
            return
        for (pos, plan), first in zip(self.greedy, _greedy_batch(self.rows, self.greedy, self.top), strict=True):
            if plan.veto is not None:
                base = plan.scores if plan.scores is not None else self.rows[pos]
                first = _vetted(base, plan, self.sampling, None, *first)
            self.decided[pos] = first

    def emit_row(self, pos: int, i: int) -> None:
        """Emit the row's token and advance its policy; then finish the row or keep it."""
        cur = self.cursors[i]
        plan = self.plans[pos]
        if plan.stop is not None:
            self._finish(cur, plan.stop)
            return
        if plan.rewind is not None:  # nothing emitted: the row feeds its last kept token again
            self.keep.append(pos)
            self.next_tokens.append(_rewind(self.batch, pos, cur.req, cur.out, plan.rewind))
            return
        token, masked, forced = self.decided[pos]
        reason = cur.accept(token, forced, masked)
        if reason is not None:
            self._finish(cur, reason)
            return
        self.keep.append(pos)
        self.next_tokens.append(token)

    def _finish(self, cur: RowCursor, reason: str) -> None:
        cur.finish(reason)
        cur.out.wall_s = time.perf_counter() - self.t0
        cur.out.forward_passes = self.passes


def decode(
    backend: Backend,
    rows: Sequence[RowRequest],
    temperature: float | Sampling = 0.0,
    on_step: Callable[[int], None] | None = None,
) -> list[RowOutput]:
    """Decode a batch of rows to completion; every row follows its own policy. ``temperature``: a temperature
    (0 = greedy) or a full :class:`~formtax.decoding.sampling.Sampling` (top-k, top-p, min-p)."""
    sampling = as_sampling(temperature)
    cursors = [RowCursor(r) for r in rows]
    outs = [c.out for c in cursors]
    if not rows:
        return outs
    gens: list[torch.Generator | None] = [None] * len(rows)
    if not sampling.greedy:
        gens = [torch.Generator().manual_seed(int(r.seed)) for r in rows]
    t0 = time.perf_counter()
    batch = backend.new_batch([r.prompt_ids for r in rows])
    logits = batch.prefill()
    passes = 1
    live = list(range(len(rows)))
    for i in live:
        if rows[i].max_tokens <= 0:
            outs[i].finish_reason = rows[i].policy.budget_exhausted()
    live = [i for i in live if not outs[i].finish_reason]
    if len(live) != len(rows):
        if not live:
            return outs
        batch.keep(live)  # positions equal row indices before the first step
    step = _Step(cursors, gens, sampling, batch, t0, together=not any(_coupled(r.policy) for r in rows))
    while live:
        step.begin(logits, passes)
        fill_masks([m for i in live if (m := rows[i].policy.mask_matcher()) is not None])
        if not step.together:  # coupled rows: each row plans, chooses and advances before the next one plans
            for pos, i in enumerate(live):
                step.plan_row(pos, i)
                step.emit_row(pos, i)
        else:  # every row plans, the greedy ones choose together, then every row advances
            for pos, i in enumerate(live):
                step.plan_row(pos, i)
            step.choose_greedy()
            for pos, i in enumerate(live):
                step.emit_row(pos, i)
        if on_step is not None:
            on_step(len(step.keep))
        if not step.keep:
            break
        batch.keep(step.keep)
        live = [live[p] for p in step.keep]
        logits = batch.step(step.next_tokens)
        passes += 1
    return outs
