"""Batching across HTTP requests: concurrent clients share the model's batches.

Requests wait in a bounded queue (a full one is refused: the server answers 429); one worker thread (the model is
used from one thread, as the decode loop expects) takes the oldest, then everything *compatible* with it that
arrives within ``window_s`` (same strategy, answer, budget, sampling and prompt kind, since one batch runs one
strategy and constraint), up to ``max_batch`` rows, and answers each request's future. Each row carries its own
:class:`~formtax.serve.hooks.RequestHooks` (seed, cancellation, stop strings, logprobs, penalties, a live token
sink): a request that times out or whose client goes away is cancelled, and its row leaves the batch at the next
step. A row joins a batch only when the batch starts; rows do not join a running decode loop (the KV caches of
a running batch are not extended), so a request that arrives mid-batch waits for it to finish.

Hand-written because it is this small and is tied to formtax's own batch call; an asyncio queue in front of a
thread is the usual shape. :attr:`Batcher.busy_since` lets ``/health`` report a worker stuck in one batch.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import queue
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from formtax.api import check_context, finish_results, requests_of
from formtax.constraints.native import as_constraint
from formtax.constraints.spec import Constraint
from formtax.decoding.engine import Backend, Capability
from formtax.decoding.loop import decode
from formtax.decoding.plan import RowOutput, RowRequest
from formtax.decoding.sampling import Sampling
from formtax.errors import FormtaxError
from formtax.serve.hooks import RequestHooks
from formtax.strategies import get_strategy
from formtax.strategies.base import Prompt, Result, SinglePass

log = logging.getLogger(__name__)


class QueueFull(FormtaxError):
    """The batcher's queue holds ``max_queue`` requests already (HTTP 429)."""


@dataclass
class Job:
    prompt: Prompt
    key: tuple[Any, ...]  # what must be equal for jobs to share a batch
    kwargs: dict[str, Any]  # formtax.generate_batch's arguments (the seed is the job's own)
    seed: int = 0
    hooks: RequestHooks = field(default_factory=RequestHooks)
    future: Future[Result] = field(default_factory=Future)


class Batcher:
    def __init__(self, backend: Backend, max_batch: int = 16, window_s: float = 0.01, max_queue: int = 256) -> None:
        self.backend = backend
        self.max_batch = max_batch
        self.window_s = window_s
        self.max_queue = max_queue
        self._q: queue.Queue[Job | None] = queue.Queue()
        self._held: list[Job] = []
        self._thread = threading.Thread(target=self._work, name="formtax-batcher", daemon=True)
        self._thread.start()
        self.batches: list[int] = []  # rows per batch run (for tests and the benchmark)
        self.busy_since: float | None = None  # time.monotonic() when the running batch started

    @property
    def waiting(self) -> int:
        return self._q.qsize() + len(self._held)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def submit(self, prompt: Prompt, key: tuple[Any, ...], seed: int = 0, hooks: RequestHooks | None = None,
               **kwargs: Any) -> Job:
        """Queue one generation; ``key``: a hashable description of ``kwargs`` (jobs with equal keys share a
        batch). Raises :class:`QueueFull` when ``max_queue`` jobs wait already."""
        if self.waiting >= self.max_queue:
            raise QueueFull(f"the server's queue is full ({self.max_queue} requests waiting); retry later")
        job = Job(prompt, key, kwargs, seed, hooks or RequestHooks())
        self._q.put(job)
        return job

    async def run(self, prompt: Prompt, key: tuple[Any, ...], timeout_s: float | None = None, seed: int = 0,
                  hooks: RequestHooks | None = None, **kwargs: Any) -> Result:
        """One job's result; on a timeout (TimeoutError) or when the awaiting task is cancelled (the client went
        away) the job is cancelled: dropped if still queued, else its row leaves the batch."""
        job = self.submit(prompt, key, seed, hooks, **kwargs)
        try:
            return await asyncio.wait_for(asyncio.wrap_future(job.future), timeout_s)
        except BaseException:
            self.cancel(job)
            raise

    @staticmethod
    def cancel(job: Job) -> None:
        job.hooks.cancel.set()
        job.future.cancel()

    def close(self) -> None:
        self._q.put(None)
        self._thread.join(timeout=30)

    def _take(self) -> list[Job] | None:
        first = self._held.pop(0) if self._held else self._q.get()
        if first is None:
            return None
        jobs = [first]
        deadline = time.monotonic() + self.window_s
        keep: list[Job] = []
        for j in self._held:  # jobs held back from an earlier batch come first
            (jobs if j.key == first.key and len(jobs) < self.max_batch else keep).append(j)
        self._held = keep
        while len(jobs) < self.max_batch:
            left = deadline - time.monotonic()
            try:
                nxt = self._q.get(timeout=max(left, 0.0)) if left > 0 else self._q.get_nowait()
            except queue.Empty:
                break
            if nxt is None:
                self._q.put(None)
                break
            (jobs if nxt.key == first.key else self._held).append(nxt)
        return jobs

    def _work(self) -> None:
        while True:
            jobs = self._take()
            if jobs is None:
                return
            live = [j for j in jobs if j.future.set_running_or_notify_cancel()]
            if not live:
                continue
            self.batches.append(len(live))
            self.busy_since = time.monotonic()
            try:
                results = run_jobs(self.backend, live)
            except Exception as e:  # a bad request fails its batch's futures, never the worker
                for j in live:
                    j.future.set_exception(e)
                continue
            finally:
                self.busy_since = None
            for j, r in zip(live, results, strict=True):
                j.future.set_result(r)


def run_jobs(backend: Backend, jobs: Sequence[Job]) -> list[Result]:
    """Decode compatible jobs as one batch: ``formtax.generate_batch``'s requests (each with its job's seed),
    each row's policy under its job's hooks where the strategy is one pass of formtax's own loop (the others run
    as ``generate_batch`` runs them: the hooks cannot reach inside their calls, and the server refuses the
    controls that need them)."""
    kw = dict(jobs[0].kwargs)
    strat = get_strategy(kw.pop("strategy", "free"))
    answer = kw.pop("answer", None)
    constraint: Constraint | None = as_constraint(answer) if answer is not None else None
    sampling = Sampling(kw.pop("temperature", 0.0), kw.pop("top_p", 1.0), kw.pop("top_k", 0), kw.pop("min_p", 0.0))
    reqs = requests_of(backend, [j.prompt for j in jobs], constraint, kw.pop("max_tokens", 256),
                       kw.pop("reasoning", None), kw.pop("triggers", ()), 0, kw.pop("constrain", True), sampling,
                       kw.pop("model_defaults", False), kw.pop("raw", False), kw.pop("closing", None), kw)
    reqs = [dataclasses.replace(r, seed=j.seed) for r, j in zip(reqs, jobs, strict=True)]
    check_context(backend, reqs)
    strat.check(backend, reqs)
    if not (isinstance(strat, SinglePass) and Capability.STEP_LOGITS in backend.capabilities):
        return finish_results(backend, strat, reqs, strat.run(backend, reqs))
    tok = backend.tokenizer

    def decoder(b: Backend, rows: Sequence[RowRequest], s: Sampling, whole: Sequence[Constraint | None]
                ) -> list[RowOutput]:
        if len(rows) == len(jobs):  # one row per request, in order (none was refused by its constraint)
            rows = [dataclasses.replace(r, policy=j.hooks.wrap(r.policy, tok)) for r, j in zip(rows, jobs,
                                                                                               strict=True)]
        return decode(b, rows, temperature=s)

    return finish_results(backend, strat, reqs, strat.run_rows(backend, reqs, decoder))
