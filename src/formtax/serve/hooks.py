"""Per-request controls of ``formtax serve`` that act inside the decode loop: cancellation, ``stop`` strings,
``logprobs``, ``presence_penalty`` / ``frequency_penalty`` and ``logit_bias``.

Each row's policy is wrapped in a :class:`Hooked` policy (as :class:`formtax.streaming.Tap` wraps it to stream):
the strategy's own policy decides everything else, so a request without any of these controls decodes token
for token as ``formtax.generate``. The semantics (ours where OpenAI leaves them open):

* **cancellation**: once :attr:`RequestHooks.cancel` is set (the client disconnected, or the request timed out),
  the row's next plan stops it (finish ``cancelled``) and it leaves the batch at that step;
* **stop**: the decoded text of the row is checked after every token; when a stop string appears the row
  finishes (``stop-sequence``) and the server cuts the content before it, as OpenAI and vLLM do (one rule for every
  route: :mod:`formtax.decoding.stops`; on vLLM's engine vLLM's own ``stop`` ends the row). It applies to free text
  only (a constrained answer ends where its grammar does);
* **logprobs**: the model's own log-probabilities (the raw distribution, before masks, penalties and temperature)
  of each emitted token, and its ``top_logprobs`` most likely tokens;
* **penalties and logit_bias**: added to the scores the row chooses from (OpenAI's formula: ``presence`` once per
  token already generated, ``frequency`` per occurrence); masks and forced tokens still apply after them;
* **vLLM's** ``repetition_penalty`` (a positive score of a token in the prompt or the output is divided by it, a
  negative one multiplied) and ``min_tokens`` (EOS scores -inf until that many tokens are out).
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from formtax.decoding.engine import TokenizerInfo
from formtax.decoding.plan import Finish, GrammarStep, Plan, Policy, Transparent
from formtax.decoding.stops import StopScan, stop_cut


@dataclass
class TokenLogprob:
    token: int
    logprob: float
    top: list[tuple[int, float]]


@dataclass
class RequestHooks:
    """What one request asks of its row, and what its row recorded (logprobs)."""

    stops: tuple[str, ...] = ()
    logprobs: bool = False
    top_logprobs: int = 0
    presence: float = 0.0
    frequency: float = 0.0
    bias: dict[int, float] = field(default_factory=dict)
    repetition: float = 1.0  # vLLM's repetition_penalty (prompt and output tokens)
    min_tokens: int = 0  # EOS is kept away until this many tokens are out (free text)
    prompt_ids: tuple[int, ...] = ()  # set where the row is built (the repetition penalty reads them)
    cancel: threading.Event = field(default_factory=threading.Event)
    sink: Callable[[int, str], None] | None = None  # every emitted token and its phase (live streaming)
    recorded: list[TokenLogprob] = field(default_factory=list)
    times: list[float] = field(default_factory=list)  # time.monotonic() of each emitted token (the metrics)

    @property
    def edits_scores(self) -> bool:
        return bool(self.presence or self.frequency or self.bias or self.repetition != 1.0 or self.min_tokens)

    def wrap(self, policy: Policy, tok: TokenizerInfo) -> Policy:
        return Hooked(policy, self, tok)


class Hooked(Transparent):
    """``inner`` under one request's :class:`RequestHooks` (module docstring)."""

    def __init__(self, inner: Policy, hooks: RequestHooks, tok: TokenizerInfo) -> None:
        self.inner, self.hooks, self.tok = inner, hooks, tok
        self.coupled = inner.coupled
        self.generated: list[int] = []
        self.counts: Counter[int] = Counter()
        self._logp: torch.Tensor | None = None
        self._stops = StopScan(tok, hooks.stops)

    def plan(self, logits: torch.Tensor, step: int) -> Plan:
        if self.hooks.cancel.is_set():
            return Plan(stop=Finish.CANCELLED)
        plan = self.inner.plan(logits, step)
        if self.hooks.logprobs:
            self._logp = torch.log_softmax(logits.double(), dim=-1)
        if self.hooks.edits_scores and plan.forced is None and plan.stop is None and plan.rewind is None:
            plan = plan.replace(scores=self._edited(plan.base(logits)))
        return plan

    def grammar_step(self, step: int) -> GrammarStep | None:
        """The inner policy's grammar step where :meth:`plan` would hand its plan through unchanged: not cancelled,
        no log-probabilities to record, no score edits."""
        h = self.hooks
        if h.cancel.is_set() or h.logprobs or h.edits_scores:
            return None
        return self.inner.grammar_step(step)

    def _edited(self, base: torch.Tensor) -> torch.Tensor:
        scores = base.clone()
        h = self.hooks
        if self.counts and (h.presence or h.frequency):
            ids = torch.tensor(list(self.counts), device=scores.device)
            n = torch.tensor([float(c) for c in self.counts.values()], device=scores.device, dtype=scores.dtype)
            scores[ids] -= h.presence + h.frequency * n
        if h.repetition != 1.0:
            seen = sorted({t for t in (*h.prompt_ids, *self.generated) if 0 <= t < scores.shape[-1]})
            if seen:
                ids = torch.tensor(seen, device=scores.device, dtype=torch.long)
                vals = scores[ids]
                scores[ids] = torch.where(vals > 0, vals / h.repetition, vals * h.repetition)
        if h.min_tokens and len(self.generated) < h.min_tokens:
            eos = [t for t in self.tok.eos_ids if 0 <= t < scores.shape[-1]]
            scores[torch.tensor(eos, device=scores.device, dtype=torch.long)] = float("-inf")
        if h.bias:
            ids = torch.tensor([t for t in h.bias if 0 <= t < scores.shape[-1]], device=scores.device, dtype=torch.long)
            vals = torch.tensor([h.bias[int(t)] for t in ids.tolist()], device=scores.device, dtype=scores.dtype)
            scores[ids] += vals
        return scores

    def advance(self, token: int) -> str | None:
        h = self.hooks
        if self._logp is not None:
            top = torch.topk(self._logp, h.top_logprobs) if h.top_logprobs else None
            h.recorded.append(TokenLogprob(token, float(self._logp[token]), [] if top is None else
                                           list(zip(top.indices.tolist(), top.values.tolist(), strict=True))))
        h.times.append(time.monotonic())
        if h.sink is not None:
            h.sink(token, self.inner.phase)
        self.generated.append(token)
        self.counts[token] += 1
        reason = self.inner.advance(token)
        if reason is None and self._stops.seen(token):
            return Finish.STOP_SEQUENCE
        return reason

    def mask_matcher(self) -> Any:
        return None if self.hooks.cancel.is_set() else self.inner.mask_matcher()

    def __getattr__(self, name: str) -> Any:  # strategies may read their policy's own state
        return getattr(self.inner, name)


def cut_at_stop(text: str, stops: tuple[str, ...]) -> str:
    """``text`` up to the stop string that completes first in it (OpenAI and vLLM leave the stop string out)."""
    cut = stop_cut(text, stops)
    return text if cut is None else text[:cut]
