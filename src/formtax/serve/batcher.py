"""Batching across HTTP requests: concurrent clients share the model's batches.

Requests wait in a queue; one worker thread (the model is used from one thread, as the decode loop expects)
takes the oldest, then everything *compatible* with it that arrives within ``window_s`` (same strategy, answer,
budget, sampling and prompt kind, since ``generate_batch`` runs one strategy and constraint per call), up to
``max_batch`` rows, and answers each request's future. Hand-written because it is this small and is tied to
formtax's own batch call; an asyncio queue in front of a thread is the usual shape.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from formtax.api import generate_batch
from formtax.decoding.engine import Backend
from formtax.strategies.base import Prompt, Result

log = logging.getLogger(__name__)


@dataclass
class Job:
    prompt: Prompt
    key: tuple[Any, ...]  # what must be equal for jobs to share a batch
    kwargs: dict[str, Any]
    future: Future[Result] = field(default_factory=Future)


class Batcher:
    def __init__(self, backend: Backend, max_batch: int = 16, window_s: float = 0.01) -> None:
        self.backend = backend
        self.max_batch = max_batch
        self.window_s = window_s
        self._q: queue.Queue[Job | None] = queue.Queue()
        self._held: list[Job] = []
        self._thread = threading.Thread(target=self._work, name="formtax-batcher", daemon=True)
        self._thread.start()
        self.batches: list[int] = []  # rows per batch run (for tests and the benchmark)

    def submit(self, prompt: Prompt, key: tuple[Any, ...], **kwargs: Any) -> Future[Result]:
        """Queue one generation; ``key``: a hashable description of ``kwargs`` (jobs with equal keys share a batch)."""
        job = Job(prompt, key, kwargs)
        self._q.put(job)
        return job.future

    async def run(self, prompt: Prompt, key: tuple[Any, ...], timeout_s: float | None = None,
                  **kwargs: Any) -> Result:
        fut = self.submit(prompt, key, **kwargs)
        return await asyncio.wait_for(asyncio.wrap_future(fut), timeout_s)

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
            try:
                results: Sequence[Result] = generate_batch(self.backend, [j.prompt for j in live], **live[0].kwargs)
            except Exception as e:  # a bad request fails its batch's futures, never the worker
                for j in live:
                    j.future.set_exception(e)
                continue
            for j, r in zip(live, results, strict=True):
                j.future.set_result(r)
