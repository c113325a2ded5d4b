"""Run formtax's own Policy objects inside vLLM: the decode loop's bookkeeping, driven from a v1 logits processor.

The decode loop (``formtax.decoding``) asks a row's :class:`~formtax.decoding.loop.Policy` for a plan at every step
and tells it the emitted token afterwards. vLLM owns its loop, but its v1 logits-processor interface sees every
row's full logits before sampling, in the engine (whichever process that is), and is told which request sits at
which batch index. So the SAME policy objects run here unchanged:

* :class:`EngineRow` holds one row's :class:`~formtax.decoding.step.RowCursor` (the loop's bookkeeping, shared
  with the loop and the replay). At each engine step it first *catches up* with the tokens the engine emitted,
  then it *plans*: ``policy.plan(raw logits row, step)`` becomes an edit of that row, made by the step kernel
  (:func:`~formtax.decoding.step.edit_row`), one path for every row. What vLLM's sampler cannot decide is decided
  there exactly as the loop decides it (:func:`~formtax.decoding.step.draw_divert`,
  :func:`~formtax.decoding.step.decide`: a forced token, the divert's draw, the veto) and forced, so the row
  knows that token before the engine emits it. A row that **chooses** (formtax's own backend: ``chooses=True``)
  decides every token so, greedy or from its own seeded generator, and is finished, with its whole RowOutput,
  when its last token is chosen (``on_done`` then reports it: backends/vllm/row_reports.py). A row that does not
  (a client of a stock ``vllm serve``) leaves the other tokens to vLLM's sampler, on logits edited to the allowed
  set, the bans and any replacement scores.
* A row that must finish without a token (``Plan.stop``) or whose policy returned a finish reason gets EOS forced
  on the next step; that EOS is an engine artefact and is never recorded, exactly as the loop never emits it.
* rows the engine decodes on its own (free text, a whole-output grammar) are rebuilt afterwards by
  ``rowengine.replay``.

vLLM is imported only inside :func:`processor_class`, so this module imports (and type-checks) without it.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from typing import Any

import torch

from formtax.constraints.compile import fill_masks
from formtax.decoding.devicestep import Entry, apply_entries
from formtax.decoding.plan import Finish, Policy, RowOutput, RowRequest
from formtax.decoding.sampling import Sampling, as_sampling
from formtax.decoding.step import DRAWN, Choice, End, RowCursor, draw_divert, edit_row, masked_mass, plan_end
from formtax.tensorops import argmax

log = logging.getLogger(__name__)


class EngineRow:
    """One row of formtax's decode loop, stepped from inside an engine's logits processor (module docstring)."""

    def __init__(self, req: RowRequest, eos_id: int, n_logits: int, sampling: Sampling | float = 0.0,
                 chooses: bool = False, on_done: Callable[[EngineRow], None] | None = None) -> None:
        self.req = req
        self.chooses = chooses  # the row draws every token itself (module docstring)
        self.on_done = on_done  # told once, when the row finishes
        self.key: str | None = None  # the request's row key (formtax's own backend)
        self.on_token: Callable[[int, str], None] | None = None  # the row's tokens and phases, as the engine takes them
        self.sampling = as_sampling(sampling)
        # the row's own draws (a divert's, a veto's, a choosing row's), seeded per row like the loop's generator
        self.gen = None if self.sampling.greedy else torch.Generator().manual_seed(int(req.seed))
        self.cursor = RowCursor(req)  # the loop's own bookkeeping of the row
        self.policy = req.policy
        self.eos_id = eos_id
        self.n_logits = n_logits
        self.out = self.cursor.out
        self.n_seen = 0  # engine tokens handled so far (recorded ones plus artefacts after the finish)
        self.n_planned = 0  # plans that expect one engine token each
        self.pending: Choice | None = None  # the flags of the token the engine draws (its token: DRAWN)
        self.done = False
        self.error: str | None = None
        # a stock client's row that fails writes why (tokens from ``explain``) before its EOS (rows.py)
        self.explain: Callable[[str], list[int]] | None = None
        self.trailer: list[int] = []
        # the row's policy built afresh: a partial prefill's discarded first sample is planned again from it
        self.rebuild: Callable[[], Policy] | None = None

    # -- the loop's bookkeeping -------------------------------------------------------------------------------
    def finish(self, reason: str, error: str | None = None) -> None:
        if not self.done:
            self.done = True
            self.cursor.finish(reason)
            if error is not None:
                self.error = error
                if self.explain is not None and not self.chooses:
                    self.trailer = list(self.explain(error))
            if self.on_done is not None:
                self.on_done(self)

    def end(self, end: End | None) -> None:
        """Act on the kernel's :class:`~formtax.decoding.step.End` (None: the row goes on; no rewind here)."""
        if end is not None:
            self.finish(end.reason or Finish.BACKEND_ERROR, end.error)

    def fail(self, error: Exception | str) -> None:
        """The row's policy raised (or the engine broke its contract): this row alone ends, with the reason."""
        text = error if isinstance(error, str) else f"{type(error).__name__}: {' '.join(str(error).split())}"
        self.finish(Finish.BACKEND_ERROR, text)

    def restart(self) -> None:
        """Plan the row again from its first step with a fresh policy: its first sample was discarded (a partial
        prefill under chunked prefill never appends its token)."""
        assert self.rebuild is not None
        self.req = dataclasses.replace(self.req, policy=self.rebuild())
        self.cursor = RowCursor(self.req)
        self.policy = self.req.policy
        self.out = self.cursor.out
        self.n_planned, self.pending = 0, None
        self.gen = None if self.sampling.greedy else torch.Generator().manual_seed(int(self.req.seed))

    def catch_up(self, tokens: Sequence[int]) -> None:
        """Hand the engine's new tokens to the row: a token the row took at its plan (forced) is checked, a token
        the engine drew is taken now, the way the loop takes each one after choosing it."""
        while self.n_seen < len(tokens):
            token = int(tokens[self.n_seen])
            k = self.n_seen
            self.n_seen += 1
            if k < len(self.out.tokens):  # taken at its plan: check that the engine emitted it
                if token != self.out.tokens[k]:
                    self.finish(Finish.BACKEND_ERROR, f"the engine emitted {token} where {self.out.tokens[k]} was forced")
                elif self.on_token is not None:  # streamed once the engine took it
                    self.on_token(token, self.out.steps[k].phase)
                continue
            if self.done:
                continue  # the EOS forced after a finish: not part of the output
            if self.pending is None:
                self.finish(Finish.BACKEND_ERROR, "the engine emitted a token no plan was made for")
                continue
            choice, self.pending = self.pending._replace(token=token), None
            self.take(choice)  # the phase is still the planned one
            if self.on_token is not None and k < len(self.out.steps):
                self.on_token(token, self.out.steps[k].phase)

    def take(self, choice: Choice) -> None:
        """Emit the row's token and advance its policy; the row ends where the kernel says."""
        self.end(self.cursor.accept(choice))

    def apply(self, row: torch.Tensor, view: torch.Tensor | None = None) -> None:
        """Plan this step and edit the logits row in place (``row`` is the raw float32 row of this request;
        ``view``, its copy on the host when the processor moved the batch's rows there at once). One row's
        :func:`apply_rows`."""
        apply_rows(row.unsqueeze(0), [(self, 0, view)])

    def edit(self, row: torch.Tensor, view: torch.Tensor | None, index: int) -> Entry | None:
        """Plan this step: the edit of the row at ``index`` of the batch's logits (None: leave it), as the step
        kernel makes it (:func:`~formtax.decoding.step.edit_row`). A token the kernel decides (forced, a divert's or
        a veto's, every token of a choosing row) is taken now and forced, so the row knows it before the engine
        emits it; a token the engine draws is taken when it comes (:meth:`catch_up`). Replacement scores are
        copied into ``row`` here; masks, bans and forced tokens are applied for the whole batch."""
        if self.n_planned > self.n_seen and not self.done:  # a plan whose token never came
            if self.n_seen == 0 and self.rebuild is not None:  # a partial prefill's discarded sample: plan again
                self.restart()
            else:
                self.finish(Finish.BACKEND_ERROR, "the engine skipped a planned step (asynchronous scheduling?)")
        if self.done:
            return Entry(index, forced=self.trailer.pop(0) if self.trailer else self.eos_id)
        if row.shape[-1] != self.n_logits:
            self.finish(Finish.BACKEND_ERROR, f"logits width {row.shape[-1]} != the tokenizer's {self.n_logits}")
            return Entry(index, forced=self.eos_id)
        if view is None:  # policies compute on CPU, as in the loop
            view = row if row.device.type == "cpu" else row.detach().cpu()
        cur, host = self.cursor, view
        plan, drawn = draw_divert(cur.plan(host), host, self.sampling, self.gen, lambda: argmax(host))
        cur.note(plan)
        end = plan_end(plan, rewinds=False)
        if end is not None:
            self.end(end)
            return Entry(index, forced=self.eos_id)
        cur.measure(plan, lambda: masked_mass(host, plan))
        choice, entry = edit_row(row, index, plan, drawn, host, self.sampling, self.gen, draws=not self.chooses)
        self.n_planned += 1
        if choice.token == DRAWN:
            self.pending = choice
        else:
            self.take(choice)
        return entry

    def finalize(self, tokens: Sequence[int], engine_finish: str | None) -> RowOutput:
        """After the engine is done with the request: take its last tokens and name the finish."""
        self.catch_up(tokens)
        if not self.done:  # the engine stopped on its own: at an EOS the policy let through, or for its own reason
            self.end(self.cursor.engine_end(engine_finish, self.eos_id))
        self.out.forward_passes = len(tokens)
        return self.out


def apply_rows(logits: torch.Tensor, rows: Sequence[tuple[EngineRow, int, torch.Tensor | None]]) -> None:
    """Plan every row's step (``(row, its index in logits, its host copy or None)``) and edit the batch's logits
    in place with one batched application (:func:`~formtax.decoding.devicestep.apply_entries`): the mask fill and
    the edit cost the same few device operations at any batch size."""
    entries = []
    for row, index, view in rows:
        try:
            e = row.edit(logits[index], view, index)
        except Exception as err:  # noqa: BLE001 - one row's fault ends that row alone, never the engine's step
            log.warning("formtax: a row's policy raised (%s); that request ends with the error", err)
            row.fail(err)
            e = row.edit(logits[index], view, index)
        if e is not None:
            entries.append(e)
    apply_entries(logits, entries, rows[0][0].n_logits if rows else 0)


_PROCESSOR: type | None = None


def processor_class() -> type:
    """The vLLM v1 logits processor class that steps registered EngineRows (defined on first use: needs vllm)."""
    global _PROCESSOR
    if _PROCESSOR is not None:
        return _PROCESSOR
    from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor, MoveDirectionality

    class EngineRowProcessor(LogitsProcessor):
        """Steps formtax policies for the requests :meth:`row_for` gives a row; leaves all others alone."""

        def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool) -> None:
            self.by_index: dict[int, tuple[EngineRow, list[int], Any]] = {}  # row, its engine tokens, its params

        def is_argmax_invariant(self) -> bool:
            return False  # it changes what greedy decoding picks: vLLM must call it for greedy rows too

        def row_for(self, params: Any, prompt_ids: Sequence[int] | None) -> EngineRow | None:
            """The row a newly added request steps (None: not formtax's); formtax.vllm_plugin builds it from the
            request's arguments."""
            return None

        def row_removed(self, row: EngineRow, params: Any) -> None:
            """A row left the batch (finished, aborted, or preempted: it may be added again)."""

        def update_state(self, batch_update: BatchUpdate | None) -> None:
            if batch_update is None:
                return
            for index in batch_update.removed:
                entry = self.by_index.pop(index, None)
                if entry is not None:
                    self.row_removed(entry[0], entry[2])
            for index, params, prompt, output in batch_update.added:
                row = self.row_for(params, prompt)
                if row is None:
                    self.by_index.pop(index, None)
                else:
                    self.by_index[index] = (row, output, params)  # ``output``: the engine's live list of its tokens
            for a, b, direction in batch_update.moved:
                entry_a = self.by_index.pop(a, None)
                entry_b = self.by_index.pop(b, None)
                if entry_a is not None:
                    self.by_index[b] = entry_a
                if direction == MoveDirectionality.SWAP and entry_b is not None:
                    self.by_index[a] = entry_b

        def apply(self, logits: torch.Tensor) -> torch.Tensor:
            """The batch's step as the loop takes it: every row catches up, the grammar masks of all rows are
            computed in one call to the engine, the rows' logits move to the host in one transfer (on a GPU),
            each row plans, and one batched application edits the logits (:func:`apply_rows`)."""
            items = list(self.by_index.items())
            for _index, (row, output, _p) in items:
                try:
                    row.catch_up(output)
                except Exception as err:  # noqa: BLE001 - that row alone ends (apply_rows)
                    log.warning("formtax: a row's policy raised on its token (%s); that request ends", err)
                    row.fail(err)
            try:
                fill_masks([m for _i, (row, _o, _p) in items
                            if not row.done and (m := row.policy.mask_matcher()) is not None])
            except Exception as err:  # noqa: BLE001 - each row then computes its own mask (and fails alone)
                log.warning("formtax: the batched mask fill failed (%s); rows compute their own", err)
            views: list[torch.Tensor | None] = [None] * len(items)
            if items and logits.device.type != "cpu":
                host = logits[[index for index, _ in items]].detach().cpu()
                views = list(host.unbind(0))
            apply_rows(logits, [(row, index, view) for (index, (row, _o, _p)), view in zip(items, views, strict=True)])
            return logits

    _PROCESSOR = EngineRowProcessor
    return _PROCESSOR
