"""Batching across HTTP requests: concurrent clients share the model's decode loop.

Requests wait in a bounded queue (a full one is refused: the server answers 429); one worker thread (the model is
used from one thread, as the decode loop expects) serves them:

* **continuous batching** for single-pass strategies on a backend whose loop formtax steps: one run of the decode
  loop takes the oldest request and everything queued (any strategy, answer, budget or sampling settings: each
  row has its own policy, sampling and generator), then, after every step, admits newly queued ones
  (:meth:`Batch.join`) up to ``max_batch`` live rows, and answers each request as soon as its row finishes;
* **one thread per request** on an engine that batches by itself (``RowEngine.concurrent``: vLLM's async engine):
  every request is decoded as it arrives, its rows joining the engine's running batch with their own sampling;
  the request's cancellation, token sink and stop strings travel with it
  (:data:`~formtax.decoding.rowengine.ROW_CONTROLS`), so a cancelled request is aborted in the engine, its tokens
  stream as the engine emits them and the engine ends its free row at a stop string;
* **equal-key batches** for the rest (suffix-*, nl2format, engines that decode whole rows one call at a time):
  the oldest request and what arrives within ``window_s`` with the same strategy, answer, budget and sampling,
  run as one ``generate_batch`` (with equal stop strings too, which then travel as the batch's
  :data:`~formtax.decoding.rowengine.ROW_CONTROLS` to an engine that applies them).

Each row carries its own :class:`~formtax.serve.hooks.RequestHooks` (seed, cancellation, stop strings, logprobs,
penalties, a live token sink): a request that times out or whose client goes away is cancelled, and its row leaves
the batch at the next step. :attr:`Batcher.busy_since` lets ``/health`` report a worker stuck in one batch.

Hand-written because it is this small and is tied to formtax's own loop; a queue in front of one model thread is the
usual shape (vLLM's engine core is the same idea at scale).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from formtax.api import check_context, finish_results, requests_of
from formtax.constraints.native import as_constraint
from formtax.constraints.spec import Constraint
from formtax.decoding.engine import Backend, Driver
from formtax.decoding.loop import decode
from formtax.decoding.plan import RowOutput, RowRequest
from formtax.decoding.rowengine import ROW_CONTROLS, Cancelled, RowControls, RowEngine
from formtax.decoding.sampling import Sampling
from formtax.errors import ConstraintError, FormtaxError
from formtax.serve.hooks import RequestHooks
from formtax.strategies import get_strategy
from formtax.strategies.base import Prompt, Request, Result, SinglePass, Strategy

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
    checked: bool = False  # checked before it was queued (the server's pre-queue check): not checked again


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
        self._pool: ThreadPoolExecutor | None = None  # one thread per request (an engine that batches by itself)

    @property
    def waiting(self) -> int:
        return self._q.qsize() + len(self._held)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def submit(self, prompt: Prompt, key: tuple[Any, ...], seed: int = 0, hooks: RequestHooks | None = None, *,
               checked: bool = False, **kwargs: Any) -> Job:
        """Queue one generation; ``key``: a hashable description of ``kwargs`` (jobs with equal keys share a
        batch). Raises :class:`QueueFull` when ``max_queue`` jobs wait already."""
        if self.waiting >= self.max_queue:
            raise QueueFull(f"the server's queue is full ({self.max_queue} requests waiting); retry later")
        job = Job(prompt, key, kwargs, seed, hooks or RequestHooks(), checked=checked)
        self._q.put(job)
        return job

    async def run(self, prompt: Prompt, key: tuple[Any, ...], timeout_s: float | None = None, seed: int = 0,
                  hooks: RequestHooks | None = None, *, checked: bool = False, **kwargs: Any) -> Result:
        """One job's result; on a timeout (TimeoutError) or when the awaiting task is cancelled (the client went
        away) the job is cancelled: dropped if still queued, else its row leaves the batch."""
        job = self.submit(prompt, key, seed, hooks, checked=checked, **kwargs)
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
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)

    def _next(self) -> Job | None:
        return self._held.pop(0) if self._held else self._q.get()

    def _pull(self, fits: Callable[[Job], bool], room: int, window_s: float) -> list[Job]:
        """Up to ``room`` queued jobs that ``fits`` accepts (held-back ones first), waiting up to ``window_s`` for
        them; the others are held back, in order, for a later batch."""
        jobs: list[Job] = []
        keep: list[Job] = []
        for j in self._held:
            (jobs if fits(j) and len(jobs) < room else keep).append(j)
        self._held = keep
        deadline = time.monotonic() + window_s
        while len(jobs) < room:
            left = deadline - time.monotonic()
            try:
                nxt = self._q.get(timeout=left) if left > 0 else self._q.get_nowait()
            except queue.Empty:
                break
            if nxt is None:
                self._q.put(None)
                break
            (jobs if fits(nxt) else self._held).append(nxt)
        return jobs

    def _work(self) -> None:
        while True:
            first = self._next()
            if first is None:
                return
            if isinstance(self.backend, RowEngine) and self.backend.concurrent:
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(self.max_queue, thread_name_prefix="formtax-request")
                self._pool.submit(self._solo, first)
                continue
            self.busy_since = time.monotonic()
            try:
                if continuous(self.backend, first):
                    self._session(first)
                else:
                    self._batch([first, *self._pull(same_key(first), self.max_batch - 1, self.window_s)])
            except Exception:  # never the worker: the jobs already hold their errors
                log.exception("batch failed")
            finally:
                self.busy_since = None

    def _batch(self, jobs: list[Job]) -> None:
        """One batch of equal-key jobs through :func:`run_jobs` (strategies that are not one pass of the loop, or
        an engine that decodes whole rows): their stop strings, equal too, go to the engine as the batch's
        controls (the server admits them only where the engine applies them)."""
        live = [j for j in jobs if j.future.set_running_or_notify_cancel()]
        if not live:
            return
        stops = live[0].hooks.stops
        reset = ROW_CONTROLS.set(RowControls(stops=stops)) if stops else None
        try:
            self._run_batch(live)
        finally:
            if reset is not None:
                ROW_CONTROLS.reset(reset)

    def _run_batch(self, live: list[Job]) -> None:
        """Run the batch; where it fails, each job alone (one job's fault must not fail its neighbours)."""
        self.batches.append(len(live))
        try:
            results = run_jobs(self.backend, live)
        except Exception as e:  # never the worker; and one job's fault must not fail its neighbours
            if len(live) == 1:
                live[0].future.set_exception(e)
                return
            log.warning("a batch of %d jobs failed (%s); running each alone", len(live), type(e).__name__)
            for j in live:
                try:
                    (alone,) = run_jobs(self.backend, [j])
                except Exception as e1:  # noqa: BLE001 - this job's own fault
                    j.future.set_exception(e1)
                else:
                    j.future.set_result(alone)
            return
        for j, r in zip(live, results, strict=True):
            j.future.set_result(r)

    def _solo(self, job: Job) -> None:
        """One request on an engine that batches by itself, in its own thread, under its controls (module
        docstring)."""
        if not job.future.set_running_or_notify_cancel():
            return
        self.batches.append(1)
        hooks = job.hooks

        def sink(token: int, phase: str) -> None:
            hooks.times.append(time.monotonic())
            if hooks.sink is not None:
                hooks.sink(token, phase)

        reset = ROW_CONTROLS.set(RowControls(hooks.cancel, sink, hooks.stops))
        try:
            (result,) = run_jobs(self.backend, [job])
        except Exception as e:  # its own error, never the server's; a cancelled request has no one waiting
            if not isinstance(e, Cancelled):
                log.debug("request failed: %s", e)
            if not job.future.done():
                job.future.set_exception(e)
            return
        finally:
            ROW_CONTROLS.reset(reset)
        if not job.future.done():
            job.future.set_result(result)

    def _session(self, first: Job) -> None:
        """Continuous batching: one run of the decode loop that takes in, after every step, the queued jobs it
        can (single-pass strategies, with any strategy, answer, budget and sampling settings: each row samples
        under its own), up to ``max_batch`` live rows, and answers each job as soon as its row finishes."""

        def fits(j: Job) -> bool:
            return continuous(self.backend, j)

        order: list[Prepared] = []
        t0 = time.perf_counter()
        # the session's row count, kept current as rows are taken in (before any of them is answered, so a client
        # that got its answer reads the count that includes its row)
        slot = len(self.batches)
        self.batches.append(0)

        def prepare(jobs: list[Job]) -> list[RowRequest]:
            rows = []
            for j in jobs:
                if not j.future.set_running_or_notify_cancel():
                    continue
                try:
                    p = prepare_job(self.backend, j)
                except Exception as e:  # refused before decoding: this job's error, never the session's
                    j.future.set_exception(e)
                    continue
                if isinstance(p, Result):
                    j.future.set_result(p)
                    continue
                order.append(p)
                rows.append(p.row)
            self.batches[slot] = len(order)
            return rows

        def admit(n_live: int) -> list[RowRequest]:
            room = self.max_batch - n_live
            return prepare(self._pull(fits, room, 0.0)) if room > 0 else []

        def on_finish(i: int, out: RowOutput) -> None:
            p = order[i]
            if p.job.future.done():
                return
            if out.fault is not None:  # this row's own fault: its request fails, the session goes on
                p.job.future.set_exception(out.fault)
                return
            try:
                res = p.strat.assemble(self.backend, p.request, out, time.perf_counter() - t0)
                p.job.future.set_result(finish_results(self.backend, p.strat, [p.request], [res])[0])
            except Exception as e:  # noqa: BLE001 - reading one row's answer failed: that request alone
                log.exception("assembling a row's result failed")
                p.job.future.set_exception(e)

        rows = prepare([first, *self._pull(fits, self.max_batch - 1, self.window_s)])
        if not rows:
            del self.batches[slot]  # nothing decoded (only this worker thread appends to the list)
            return
        try:
            decode(self.backend, rows, admit=admit, on_finish=on_finish)
        except Exception as e:  # the model failed: every unanswered job of the session gets the error
            log.exception("decode session failed")
            for p in order:
                if not p.job.future.done():
                    p.job.future.set_exception(e)


@dataclass
class Prepared:
    """A job ready to decode: its strategy, request and row (the row's policy under the job's hooks)."""

    job: Job
    strat: SinglePass
    request: Request
    row: RowRequest


def same_key(first: Job) -> Callable[[Job], bool]:
    """Jobs that may share ``first``'s batch: equal generation arguments and equal stop strings."""
    return lambda j: j.key == first.key and j.hooks.stops == first.hooks.stops


def continuous(backend: Backend, job: Job) -> bool:
    """Whether a job can join a running decode loop: a single-pass strategy on a backend whose loop formtax steps."""
    return (isinstance(get_strategy(job.kwargs.get("strategy", "free")), SinglePass)
            and backend.driver is Driver.LOOP)


def job_requests(backend: Backend, jobs: Sequence[Job]) -> tuple[Strategy, list[Request]]:
    """The strategy and the ``formtax.generate_batch`` requests of compatible jobs (each with its own seed),
    checked before any model call (context, then the strategy's own check)."""
    kw = dict(jobs[0].kwargs)
    strat = get_strategy(kw.pop("strategy", "free"))
    answer = kw.pop("answer", None)
    constraint: Constraint | None = as_constraint(answer) if answer is not None else None
    sampling = Sampling(kw.pop("temperature", 0.0), kw.pop("top_p", 1.0), kw.pop("top_k", 0), kw.pop("min_p", 0.0))
    reqs = requests_of(backend, [j.prompt for j in jobs], constraint, kw.pop("max_tokens", 256),
                       kw.pop("reasoning", None), kw.pop("triggers", ()), 0, kw.pop("constrain", True), sampling,
                       kw.pop("model_defaults", False), kw.pop("raw", False), kw.pop("closing", None), kw)
    reqs = [dataclasses.replace(r, seed=j.seed) for r, j in zip(reqs, jobs, strict=True)]
    if not all(j.checked for j in jobs):  # the server checked its jobs before queueing them: once is enough
        check_context(backend, reqs)
        strat.check(backend, reqs)
    return strat, reqs


def prepare_job(backend: Backend, job: Job) -> Prepared | Result:
    """A continuous job's row; the strategy's error result where its constraint cannot be decoded here."""
    strat, (req,) = job_requests(backend, [job])
    assert isinstance(strat, SinglePass)
    try:
        policy = strat.policy(backend, req)
    except ConstraintError as e:
        return strat.error_result(backend, e)
    ids = backend.tokenizer.prompt_ids(req.prompt)
    job.hooks.prompt_ids = tuple(ids)
    row = RowRequest(ids, job.hooks.wrap(policy, backend.tokenizer), req.max_tokens, req.seed,
                     Sampling(req.temperature, req.top_p, req.top_k, req.min_p))
    return Prepared(job, strat, req, row)


def run_jobs(backend: Backend, jobs: Sequence[Job]) -> list[Result]:
    """Decode compatible jobs as one batch, as ``formtax.generate_batch`` runs them: strategies that are not one
    pass of formtax's loop (the hooks cannot reach inside their calls; the server refuses the controls that need
    them), or backends that decode whole rows themselves."""
    strat, reqs = job_requests(backend, jobs)  # checked there, or before they were queued: not again
    return finish_results(backend, strat, reqs, strat.run(backend, reqs, checked=True))
