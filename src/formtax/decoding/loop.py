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

import logging
import time
from collections.abc import Callable, Sequence

import torch

from formtax.constraints.compile import MaskFill, Matcher
from formtax.decoding.devicestep import Entry, device_round, to_host
from formtax.decoding.engine import Backend, Batch
from formtax.decoding.plan import (
    Divert,
    Finish,
    GrammarStep,
    Plan,
    Policy,
    RowOutput,
    RowRequest,
    Step,
    Veto,
    relay,
)
from formtax.decoding.sampling import GREEDY, Sampling, as_sampling
from formtax.decoding.step import (
    Choice,
    End,
    RowCursor,
    allowed_words,
    decide,
    draw_divert,
    flags,
    grammar_choice,
    greedy_batch,
    masked_mass,
    mass_words,
    plan_end,
    vetted,
)
from formtax.tensorops import argmax_rows

# the vocabulary lives in decoding/plan.py (re-exported here, where the strategies have always found it); every
# decision of a step is the step kernel's (decoding/step.py), imported from there
log = logging.getLogger(__name__)

__all__ = ["DEVICE_STEP", "Divert", "Plan", "Policy", "RowOutput", "RowRequest", "Step", "Veto", "decode", "relay",
           "row_generator"]


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


class _Stepper:
    """The steps of one :func:`decode` over its live rows: at each step plan each row, choose, emit and advance.

    One object for the whole decode (the rows' cursors, generators and samplings), so the loop in :func:`decode`
    reads top to bottom; the per-step fields are reset by :meth:`begin`. Planning settles forced, drawn and sampled tokens per row; greedy choices wait for
    :meth:`choose_greedy` (all greedy rows at once) unless rows are coupled.

    ``on_device``: the logits live on an accelerator (or a test asks for that path). Then nothing reads a row of
    them on the host: the unmasked argmax of the batch comes over in one copy when a row needs it before its
    choice (a free row, or a divert's draw), and every other greedy choice and masked mass is made in one device
    round (:mod:`formtax.decoding.devicestep`). On the host both are read through numpy, row by row, which is
    faster there; the tokens are the same."""

    def __init__(self, cursors: Sequence[RowCursor], gens: list[torch.Generator | None],
                 samplings: list[Sampling], batch: Batch, t0: float, together: bool, on_device: bool = False) -> None:
        self.cursors, self.gens, self.samplings, self.batch, self.t0 = cursors, gens, samplings, batch, t0
        self.together, self.on_device = together, on_device
        self.lazy = together and not on_device  # a greedy grammar row checks its top token first (_grammar_row)
        self.vocab = 0
        self.begin(torch.empty(0), 0)

    def begin(self, logits: torch.Tensor, passes: int, live: Sequence[int] = ()) -> None:
        self.logits, self.passes, self.live = logits, passes, live
        self._rows: Sequence[torch.Tensor] | None = None
        self.decided: dict[int, Choice] = {}  # pos -> the row's choice
        self.plans: dict[int, Plan] = {}
        self.ends: dict[int, End] = {}  # pos -> how the row's plan ends its step without a token (stop, rewind)
        self.greedy: list[tuple[int, Plan]] = []
        self.mass_rows: list[int] = []  # device path: rows whose masked mass the round measures
        self.keep: list[int] = []
        self.next_tokens: list[int] = []
        self._top: list[int] | None = None
        self._top_dev: torch.Tensor | None = None
        self.device_ids: tuple[torch.Tensor, list[int]] | None = None  # the round's ids, on the device and host

    @property
    def rows(self) -> Sequence[torch.Tensor]:
        """Every live row's logits as views, made at the first read of the step (one call for them all: indexing
        is not free; a step of grammar rows that take their top tokens reads none)."""
        if self._rows is None:
            self._rows = self.logits.unbind(0)
        return self._rows

    def top(self) -> list[int]:
        """The argmax of every live row's raw logits, computed once per step (at the first row that needs it)."""
        if self._top is None:
            if self.on_device:
                self._top_dev = self.logits.argmax(dim=-1)
                self._top = [int(t) for t in to_host(self._top_dev).tolist()]
            else:
                self._top = argmax_rows(self.logits)
        return self._top

    def plan_row(self, pos: int, i: int) -> None:
        """Plan row ``i`` (at ``pos``); a row whose policy raises ends alone (:meth:`fault`)."""
        try:
            cur = self.cursors[i]
            if self.lazy and self.samplings[i].greedy:
                g = cur.policy.grammar_step(cur.step)
                if g is not None:  # the grammar's own step: no plan built where the grammar holds the top token
                    self._grammar_row(pos, g)
                    return
            self._plan_row(pos, i)
        except Exception as e:  # noqa: BLE001 - one row's fault ends that row, never its batch
            self.fault(i, e)
            self.ends[pos] = End(Finish.ROW_FAULT)
            self.decided.pop(pos, None)
            self.greedy = [(p, plan) for p, plan in self.greedy if p != pos]
            self.mass_rows = [p for p in self.mass_rows if p != pos]

    def fault(self, i: int, e: BaseException) -> None:
        """Row ``i`` ends with :attr:`Finish.ROW_FAULT` and its exception (``RowOutput.fault``): its request fails
        alone, and the batch's other rows go on (a server must survive any one request)."""
        log.warning("row %d faulted: %s: %s", i, type(e).__name__, e)
        self.cursors[i].out.fault = e

    def _plan_row(self, pos: int, i: int) -> None:
        cur, gen, sampling = self.cursors[i], self.gens[i], self.samplings[i]
        row_logits = self.rows[pos]
        plan = cur.plan(row_logits)
        drawn = None
        if plan.divert is not None:  # (each test below skips a call most rows do not need: this runs per row-step)
            plan, drawn = draw_divert(plan, row_logits, sampling, gen, lambda: self.top()[pos])
        if plan.event is not None:
            cur.note(plan)
        self.plans[pos] = plan
        if plan.stop is not None or plan.rewind is not None:
            self.ends[pos] = plan_end(plan, rewinds=True)  # type: ignore[assignment]
            return
        if plan.measure_mass and cur.measures(plan):
            if self.on_device and plan.scores is None:  # measured in the step's device round
                self.mass_rows.append(pos)
            else:
                cur.measure(plan, lambda: masked_mass(row_logits, plan))
        if sampling.greedy and self.together and plan.forced is None and drawn is None:
            self.greedy.append((pos, plan))
        else:  # forced, kept from a divert, sampled (from the row's own generator), or a coupled row
            self.decided[pos] = decide(plan, drawn, row_logits, sampling, gen)

    def _grammar_row(self, pos: int, g: GrammarStep) -> None:
        """A greedy row whose step is its grammar's (:meth:`Policy.grammar_step`, on the host): the stop, or the
        choice :func:`~formtax.decoding.step.grammar_choice` makes from the step's top tokens, or its plan joins
        the greedy rows (the masked argmax of :meth:`choose_greedy`). The same token, flags and end as planning
        it: this skips building a plan for the common step, whose cost per row-step is the loop's overhead
        (``bench/loop_overhead.py``)."""
        if g.stop is not None:
            self.ends[pos] = End(g.stop)
            return
        got = grammar_choice(g, self.top()[pos], lambda: self.rows[pos])  # (the row's logits: for a re-choice)
        if isinstance(got, Choice):
            self.decided[pos] = got
            return
        self.plans[pos] = got
        if got.stop is not None:  # the grammar's dead end, found where its top token was not held
            self.ends[pos] = End(got.stop)
        else:
            self.greedy.append((pos, got))

    def choose_greedy(self) -> None:
        """The greedy rows choose together; a row whose veto refuses its choice goes on alone."""
        if self.on_device:
            self._choose_on_device()
            return
        if not self.greedy:
            return
        for (pos, plan), first in zip(self.greedy, greedy_batch(self.rows, self.greedy, self.top), strict=True):
            if plan.veto is not None:
                first = vetted(plan.base(self.rows[pos]), plan, GREEDY, None, first)
            self.decided[pos] = first

    def _choose_on_device(self) -> None:
        """The device path of :meth:`choose_greedy`: unmasked rows take the shared argmax when no round is
        needed; otherwise one round chooses for every row of the step (forced and drawn rows ride along as
        forced entries, so the round's ids can feed the next forward pass without a copy back) and measures the
        masked masses. A vetoed row also gets its ranked best ids in the same round, which its refusals walk
        (:func:`~formtax.decoding.step.vetted`): no further round."""
        simple = all(not p.has_mask and not p.banned and p.scores is None for _pos, p in self.greedy)
        if simple and not self.mass_rows:
            top = self.top() if self.greedy else None
            for pos, _plan in self.greedy:
                self.decided[pos] = Choice(top[pos], False, False)  # type: ignore[index]
            if top is not None and self._top_dev is not None:
                self.device_ids = (self._top_dev, top)
            return
        greedy = dict(self.greedy)
        order = sorted(set(greedy) | set(self.decided) | set(self.mass_rows))
        entries, bases = [], []
        for pos in order:
            plan = self.plans[pos]
            bases.append(plan.base(self.rows[pos]) if pos in greedy else self.rows[pos])
            entries.append(self._entry(len(bases) - 1, plan, pos, measure=pos in self.mass_rows))
            if pos in greedy and plan.veto is not None:
                entries[-1].ranked = plan.veto.tries
        got = device_round(bases, entries, self._vocab())
        by_pos = dict(zip(order, got.ids, strict=True))
        ranked = {pos: r for pos, r in zip(order, got.ranked, strict=True) if r is not None}
        for pos, mass in zip(order, got.masses, strict=True):
            if mass is not None:
                self.cursors[self.live[pos]].measure(self.plans[pos], lambda m=mass: m)  # type: ignore[misc]
        for pos, plan in self.greedy:
            first = flags(plan, by_pos[pos])
            if plan.veto is not None:  # the veto's re-choices walk the round's ranked ids (after the first)
                first = vetted(self.rows[pos], plan, GREEDY, None, first, ranked[pos][1:])
            self.decided[pos] = first
        if order == list(range(len(self.rows))):
            self.device_ids = (got.device_ids, got.ids)

    def _entry(self, base: int, plan: Plan, pos: int, measure: bool = False) -> Entry:
        """A row of the device round for ``plan``: its packed allowed set less its bans, its forced token (rows
        decided before the round ride along forced), and whether its masked mass is measured."""
        n_words = (max(self.logits.shape[1], self._vocab()) + 31) // 32
        # the mass outside the grammar's set (bans are not the grammar); the same words when nothing is banned
        measured = mass_words(plan, n_words) if measure else None
        words = allowed_words(plan, n_words, measured)
        forced = self.decided[pos].token if pos in self.decided else -1
        return Entry(base, words, forced, measured)

    def _vocab(self) -> int:
        if not self.vocab:
            self.vocab = int(self.logits.shape[1])
        return self.vocab

    def emit_row(self, pos: int, i: int) -> None:
        """Emit the row's token and advance its policy; then finish the row or keep it."""
        cur = self.cursors[i]
        end = self.ends.get(pos)
        if end is None:
            choice = self.decided[pos]
            try:
                end = cur.accept(choice)
            except Exception as e:  # noqa: BLE001 - the row's policy broke on its token: that row ends alone
                self.fault(i, e)
                end = End(Finish.ROW_FAULT)
            if end is None:
                self.keep.append(pos)
                self.next_tokens.append(choice.token)
                return
        if end.rewind is not None:  # nothing emitted: the row feeds its last kept token again
            self.keep.append(pos)
            self.next_tokens.append(_rewind(self.batch, pos, cur.req, cur.out, end.rewind))
            return
        assert end.reason is not None
        self._finish(cur, end.reason)

    def forward(self) -> torch.Tensor:
        """Launch the next forward pass: with the round's ids where they are already on the device and every row
        goes on with them (no copy back), else with the host's list."""
        if self.device_ids is not None:
            dev, ids = self.device_ids
            if self.keep == list(range(len(self.rows))) and self.next_tokens == ids:
                return self.batch.step_device(dev)
        return self.batch.step(self.next_tokens)

    def _finish(self, cur: RowCursor, reason: str) -> None:
        try:
            cur.finish(reason)
        except Exception as e:  # noqa: BLE001 - row_stats raised: the row still ends, with its fault
            cur.out.fault = e
            cur.out.finish_reason = Finish.ROW_FAULT
        cur.out.wall_s = time.perf_counter() - self.t0
        cur.out.forward_passes = self.passes


def row_generator(sampling: Sampling, seed: int, device: torch.device) -> torch.Generator | None:
    """A sampled row's generator, seeded with its seed, on the device its logits live on (a CUDA tensor cannot be
    drawn from with a CPU generator); None for a greedy row."""
    return None if sampling.greedy else torch.Generator(device=device).manual_seed(int(seed))


DEVICE_STEP: bool | None = None
"""The default of :func:`decode`'s ``device_step`` (None: by where the logits are); tests set it to run every
strategy through the device path on CPU."""


def decode(
    backend: Backend,
    rows: Sequence[RowRequest],
    temperature: float | Sampling = 0.0,
    on_step: Callable[[int], None] | None = None,
    device_step: bool | None = None,
    admit: Callable[[int], Sequence[RowRequest]] | None = None,
    on_finish: Callable[[int, RowOutput], None] | None = None,
) -> list[RowOutput]:
    """Decode a batch of rows to completion; every row follows its own policy. ``temperature``: a temperature
    (0 = greedy) or a full :class:`~formtax.decoding.sampling.Sampling` (top-k, top-p, min-p), for the rows that
    carry none of their own (``RowRequest.sampling``: rows of one batch may sample differently, each from its own
    generator on the logits' device).
    ``device_step``: choose on the logits' device (:class:`_Stepper`); None = wherever the logits are not on the
    host (the tests force it on CPU to count its transfers and check its tokens against the host path).

    Continuous batching (the server): ``admit(n_live)`` is asked after every step for rows to join the running
    batch (prefilled on their own, then joined: :meth:`Batch.join`; never coupled rows); ``on_finish(index,
    output)`` is told each row as it finishes (index: its position in ``rows`` then in the order admitted). The
    outputs of every row, admitted ones included, are returned at the end."""
    sampling = as_sampling(temperature)
    rows = list(rows)
    cursors = [RowCursor(r) for r in rows]
    outs = [c.out for c in cursors]
    if not rows:
        return outs
    t0 = time.perf_counter()
    batch = backend.new_batch([r.prompt_ids for r in rows])
    logits = batch.prefill()
    samplings = [r.sampling or sampling for r in rows]
    gens = [_generator(s, r, logits.device, o) for s, r, o in zip(samplings, rows, outs, strict=True)]
    passes = 1
    live = list(range(len(rows)))
    for i in live:
        if not outs[i].finish_reason and (end := cursors[i].opening()) is not None:
            outs[i].finish_reason = end.reason or ""
        if outs[i].finish_reason and on_finish is not None:
            on_finish(i, outs[i])
    live = [i for i in live if not outs[i].finish_reason]
    if len(live) != len(rows):
        if not live:
            return outs
        batch.keep(live)  # positions equal row indices before the first step
    device_step = DEVICE_STEP if device_step is None else device_step
    on_device = logits.device.type != "cpu" if device_step is None else device_step
    step = _Stepper(cursors, gens, samplings, batch, t0, together=not any(_coupled(r.policy) for r in rows),
                 on_device=on_device)
    fill = MaskFill(background=on_device and logits.device.type != "cpu")

    def masks() -> list[Matcher]:
        """The step's masks to fill ahead: not a greedy row's on the host (``step.lazy``), which checks its top
        token first (step.grammar_choice) and computes its mask only where that needs it."""
        return [m for i in live if not (step.lazy and samplings[i].greedy)
                and (m := rows[i].policy.mask_matcher()) is not None]

    fill.start(masks())
    while live:
        step.begin(logits, passes, live)
        fill.wait()  # the step's masks, computed while the device ran the forward pass
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
        if on_finish is not None:
            kept = set(step.keep)
            for pos, i in enumerate(live):
                if pos not in kept:
                    on_finish(i, outs[i])
        if not step.keep:
            break
        batch.keep(step.keep)
        live = [live[p] for p in step.keep]
        logits = step.forward()  # launched (asynchronous on a device); the next masks are filled meanwhile
        if admit is not None and batch.joinable:
            logits = _admit(backend, batch, logits, admit(len(live)), rows, cursors, outs, gens, samplings, live,
                            sampling, on_finish)
        fill.start(masks())
        passes += 1
    faults = [o.fault for o in outs if o.fault is not None]
    if faults and on_finish is None:  # a caller that gets the outputs at the end gets the first fault raised
        raise faults[0]
    return outs


def _generator(sampling: Sampling, row: RowRequest, device: torch.device, out: RowOutput) -> torch.Generator | None:
    """:func:`row_generator`, or None with the row ended as a fault (a seed the generator cannot take)."""
    try:
        return row_generator(sampling, row.seed, device)
    except (ValueError, OverflowError, RuntimeError, TypeError) as e:
        log.warning("row seed %r refused: %s", row.seed, e)
        out.fault, out.finish_reason = e, Finish.ROW_FAULT
        return None


def _admit(backend: Backend, batch: Batch, logits: torch.Tensor, new: Sequence[RowRequest], rows: list[RowRequest],
           cursors: list[RowCursor], outs: list[RowOutput], gens: list[torch.Generator | None],
           samplings: list[Sampling], live: list[int], sampling: Sampling,
           on_finish: Callable[[int, RowOutput], None] | None) -> torch.Tensor:
    """Continuous batching (:func:`decode`): ``new`` rows are prefilled on their own and join ``batch``; their
    logits follow the live rows'. A row with no budget finishes at once. Grows ``rows``, ``cursors``, ``outs``,
    ``gens``, ``samplings`` and ``live`` in place; returns the logits of every live row."""
    joining: list[RowRequest] = []
    for r in new:
        if r.policy.coupled:
            raise ValueError("a coupled row cannot join a running batch")
        i = len(rows)
        rows.append(r)
        cursors.append(RowCursor(r))
        outs.append(cursors[-1].out)
        samplings.append(r.sampling or sampling)
        gens.append(_generator(samplings[-1], r, logits.device, outs[i]))
        if not outs[i].finish_reason and (end := cursors[i].opening()) is not None:
            outs[i].finish_reason = end.reason or ""
        if outs[i].finish_reason:
            if on_finish is not None:
                on_finish(i, outs[i])
            continue
        joining.append(r)
        live.append(i)
    if not joining:
        return logits
    other = backend.new_batch([r.prompt_ids for r in joining])
    fresh = other.prefill()
    batch.join(other)
    return torch.cat([logits, fresh.to(logits.device)], dim=0)
