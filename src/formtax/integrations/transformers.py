"""formtax's strategies inside your own ``model.generate(...)``: a transformers ``LogitsProcessor``.

    from transformers import LogitsProcessorList
    from formtax.integrations.transformers import FormtaxLogitsProcessor

    proc = FormtaxLogitsProcessor(model, tokenizer, "inwriting", "The answer is: {int}", max_tokens=128)
    out = model.generate(input_ids, attention_mask=mask, logits_processor=LogitsProcessorList([proc]),
                         max_new_tokens=proc.max_new_tokens, do_sample=False)
    results = proc.results(out)          # formtax Results: reasoning, answer_text, parsed, finish_reason, ...

It is the same machinery as the vLLM backend's logits processor, not a copy of it: each batch row gets the
strategy's own :class:`~formtax.decoding.loop.Policy` inside a
:class:`~formtax.backends.vllm.logits_processor.EngineRow`, which hands the tokens ``generate`` emitted since the last step
to the policy (catch up) and turns its plan for this step into an in-place edit of the row's scores (a forced
token, the allowed set, banned tokens, Deco-G's replacement scores). InWriting's switch, EOS masking and the answer
grammar are therefore exactly ``formtax.generate``'s; under greedy decoding the output is token-identical (tested on
the embedded default). When a policy finishes without a token (the answer grammar is complete) the next step forces
EOS so that ``generate`` stops; that EOS is an artefact, not part of the Result, as in the decode loop.

Supported: the single-pass strategies (free, short, constrained, json, inwriting, decog / ctrlg); suffix-* (which
rewind the KV cache) and nl2format (two calls) need formtax's own loop: use ``formtax.generate``. Rows are the
batch rows of ``input_ids`` (left-padded, as ``generate`` wants for decoder-only models); one request is repeated
over the batch, or give one per row. ``max_new_tokens`` must leave room for the final EOS (``proc.max_new_tokens``).
With ``do_sample=True`` transformers applies its own temperature / top-p after this processor; pass the same
``temperature`` here so InWriting's sampled switch draws at it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from formtax.api import from_transformers, resolve_closing, typed_result
from formtax.backends.vllm.logits_processor import EngineRow, apply_rows
from formtax.constraints.native import as_constraint
from formtax.decoding.engine import Backend
from formtax.decoding.loop import RowRequest
from formtax.errors import ConfigError
from formtax.strategies import Request, Result, get_strategy
from formtax.strategies.base import SinglePass

try:  # transformers is a dependency of the hf backend; the class is also usable without subclassing it
    from transformers import LogitsProcessor as _Base
except ImportError:  # pragma: no cover
    _Base = object  # type: ignore[assignment,misc]


class FormtaxLogitsProcessor(_Base):
    """A formtax strategy as a transformers logits processor (module docstring)."""

    def __init__(self, model: Any, tokenizer: Any = None, strategy: str = "constrained", answer: Any = None,
                 max_tokens: int = 256, reasoning: str | None = None, triggers: Sequence[str] = (),
                 temperature: float = 0.0, seed: int = 0, requests: Sequence[Request] | None = None,
                 closing: bool | None = None) -> None:
        self.backend: Backend = model if isinstance(model, Backend) else from_transformers(model, tokenizer)
        strat = get_strategy(strategy)
        if not isinstance(strat, SinglePass):
            raise ConfigError(f"strategy {strategy!r} runs more than one pass (it rewinds or calls twice); use "
                              "formtax.generate for it, or one of the single-pass strategies here")
        self.strategy = strat
        self.constraint = as_constraint(answer) if answer is not None else None
        self.requests = list(requests) if requests is not None else [
            Request("", self.constraint, max_tokens=max_tokens, seed=seed, reasoning_prefix=reasoning,
                    triggers=triggers, temperature=temperature,
                    closing=resolve_closing(self.backend, closing))]
        strat.check(self.backend, self.requests)
        self.max_tokens = max(r.max_tokens for r in self.requests)
        self.rows: list[EngineRow] | None = None
        self.start = 0

    @property
    def max_new_tokens(self) -> int:
        """What to pass to ``generate``: the budget plus the finishing EOS."""
        return self.max_tokens + 1

    def _start(self, input_ids: torch.Tensor) -> None:
        n = int(input_ids.shape[0])
        if len(self.requests) not in (1, n):
            raise ConfigError(f"{len(self.requests)} requests for a batch of {n} rows; give one, or one per row")
        reqs = self.requests * n if len(self.requests) == 1 else self.requests
        tok = self.backend.tokenizer
        eos = min(tok.eos_ids)
        self.rows = []
        for b, r in enumerate(reqs):
            policy = self.strategy.policy(self.backend, r)
            row = RowRequest(input_ids[b].tolist(), policy, r.max_tokens, r.seed)
            self.rows.append(EngineRow(row, eos, tok.n_logits, r.temperature))
        self.start = int(input_ids.shape[1])
        self._reqs = reqs

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self.rows is None:
            self._start(input_ids)
        assert self.rows is not None
        if scores.shape[0] != len(self.rows):
            raise ConfigError(f"the batch has {scores.shape[0]} rows but the processor was started with "
                              f"{len(self.rows)}; use a new processor per generate call (no beam search)")
        for b, row in enumerate(self.rows):
            row.catch_up(input_ids[b, self.start :].tolist())
        views: list[torch.Tensor | None] = [None] * len(self.rows)
        if scores.device.type != "cpu":  # the policies read the rows on the host: one copy for the batch
            views = list(scores.detach().float().cpu().unbind(0))
        apply_rows(scores, [(row, b, view) for (b, row), view in zip(enumerate(self.rows), views, strict=True)])
        return scores

    def results(self, sequences: torch.Tensor | Any) -> list[Result]:
        """The formtax Result of every row, from ``generate``'s output (its ``sequences`` or the tensor)."""
        seqs = getattr(sequences, "sequences", sequences)
        if self.rows is None:
            raise ConfigError("the processor has not run yet: pass it to model.generate(logits_processor=...) first")
        out = []
        eos = self.backend.tokenizer.eos_ids
        for b, row in enumerate(self.rows):
            tokens = [int(t) for t in seqs[b, self.start :].tolist()]
            last = tokens[-1] if tokens else None
            o = row.finalize(tokens, "stop" if last in eos else "length")
            res = self.strategy.assemble(self.backend, self._reqs[b], o, 0.0)
            if row.error is not None:
                res.error = row.error
            out.append(typed_result(res, self._reqs[b].constraint))
        return out
