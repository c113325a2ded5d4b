"""What every endpoint of ``formtax serve`` shares, in the shape of vLLM's serving classes: the routes
(:mod:`formtax.serve.routes`) parse and hand a request to the serving object the app's state holds; a serving object
turns a parsed request into generation jobs, checks them before any work, runs them in the shared batch and words
the results. :class:`Serving` holds the shared steps; :mod:`formtax.serve.serving_chat` (chat and text
completions) and :mod:`formtax.serve.serving_responses` (the Responses API, which reuses chat's) build on it.

A stream is an async iterator of chunk dicts, not of server-sent-event strings, so the chat route serialises them as
OpenAI's chunks and the Responses API re-words the same chunks as its typed events. :meth:`Serving.live` drives the
rows of a live stream; how each choice's chunks are worded is its output format's class (:mod:`formtax.serve.chunks`).
"""

from __future__ import annotations

import asyncio
import logging
import queue
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse

from formtax.constraints.spec import Constraint
from formtax.decoding.engine import Backend, Capability, Driver
from formtax.decoding.sampling import choice_seed, fresh_seed
from formtax.errors import ConfigError, FormtaxError
from formtax.serve import shapes as out
from formtax.serve.batcher import Batcher
from formtax.serve.chunks import ChoiceChunks, usage_chunk
from formtax.serve.config import ServeConfig
from formtax.serve.hooks import RequestHooks
from formtax.serve.metrics import ServerMetrics
from formtax.serve.schema import Sampled
from formtax.serve.serving_models import ServedModels
from formtax.strategies import get_strategy
from formtax.strategies.base import Prompt, Result, SinglePass
from formtax.strategies.base import Request as GenRequest
from formtax.streaming import END, Delta, deltas

log = logging.getLogger(__name__)


@dataclass
class Outcome:
    """What a serving call produced: a whole body, or a stream of chunks; headers for either."""

    body: dict[str, Any] | None = None
    chunks: AsyncIterator[dict[str, Any]] | None = None
    headers: dict[str, str] = field(default_factory=dict)


def job_key(kwargs: dict[str, Any]) -> tuple[Any, ...]:
    """A hashable description of a job's generation arguments (equal keys may share a batch)."""
    return tuple((k, v.describe() if isinstance(v, Constraint) else repr(v)) for k, v in sorted(kwargs.items()))


class Serving:
    """The steps every endpoint shares (module docstring)."""

    def __init__(self, backend: Backend, batcher: Batcher, cfg: ServeConfig, models: ServedModels,
                 metrics: ServerMetrics) -> None:
        self.backend, self.batcher, self.cfg, self.models = backend, batcher, cfg, models
        self.metrics = metrics

    def model_name(self, req: Sampled) -> str:
        """The model a response names: the request's, else the first served name."""
        return req.model or self.models.default

    def check_model(self, req: Sampled) -> JSONResponse | None:
        """The 404 of a request for a model this server does not serve."""
        return self.models.unknown(req.model)

    def plan_kwargs(self, req: Sampled, strategy: str, answer: Any, raw: bool) -> dict[str, Any]:
        opts = req.formtax
        return {"strategy": strategy, "answer": answer, "max_tokens": req.budget(self.cfg.default_max_tokens),
                "temperature": self.cfg.temperature if req.temperature is None else req.temperature,
                "top_p": req.top_p, "top_k": max(0, req.top_k or 0), "min_p": req.min_p or 0.0, "raw": raw, "reasoning": opts.reasoning if opts else None,
                "triggers": tuple(opts.triggers) if opts else (), "closing": opts.closing if opts else None}

    def hooks_of(self, req: Sampled, free_text: bool, logprobs: bool, top: int) -> RequestHooks:
        if req.min_tokens and not free_text:
            raise ConfigError("min_tokens: applies to free text; a constrained answer ends where its grammar ends")
        if req.stops() and not free_text:  # refused, not ignored: the plugin's rule too (backends/vllm/rows.py)
            raise ConfigError("stop: a stop string would cut the strategy's row before its answer is written; the "
                              "strategy ends the row itself (stop applies to free text)")
        return RequestHooks(stops=req.stops() if free_text else (), logprobs=logprobs, top_logprobs=top,
                            presence=req.presence_penalty, frequency=req.frequency_penalty, bias=req.bias(self.backend.tokenizer.n_logits),
                            repetition=req.repetition_penalty or 1.0, min_tokens=req.min_tokens or 0)

    def in_loop(self, strategy: str) -> bool:
        """Whether a request's rows run in formtax's own decode loop: a single-pass strategy on a step-wise backend
        that is not an engine owning its loop (where the controls that act inside the loop reach the row)."""
        return isinstance(get_strategy(strategy), SinglePass) and self.backend.driver is Driver.LOOP

    def streams_live(self, strategy: str) -> bool:
        """Whether a request can stream live: in formtax's loop, or a single-pass strategy on an engine that
        serves each request as it comes and streams its tokens (vLLM's async engine)."""
        from formtax.decoding.rowengine import RowEngine

        if self.in_loop(strategy):
            return True
        return (isinstance(self.backend, RowEngine) and self.backend.concurrent
                and isinstance(get_strategy(strategy), SinglePass))

    def stops_apply(self, strategy: str, answered: bool) -> bool:
        """Whether ``stop`` reaches the request's row: in formtax's loop (serve/hooks.py), or a free-text row
        (no answer format) of a single-pass strategy on an engine that ends it at a stop string itself
        (``Capability.STOP_STRINGS``: vLLM's own ``stop``, replayed under formtax's rule)."""
        if self.in_loop(strategy):
            return True
        return (not answered and isinstance(get_strategy(strategy), SinglePass)
                and Capability.STOP_STRINGS in self.backend.capabilities)

    def refuse_unhookable(self, strategy: str, hooks: RequestHooks, answered: bool) -> None:
        """The controls that act inside the loop need a single-pass strategy in formtax's loop; ``stop`` also
        reaches a free row on an engine that applies stop strings itself (:meth:`stops_apply`). ``answered``: the
        request has an answer format (its row has a grammar)."""
        if hooks.stops and not self.stops_apply(strategy, answered):
            raise ConfigError(f"stop is not supported with strategy {strategy!r} on backend {self.backend.name!r} "
                              "(free text of single-pass strategies in formtax's own decode loop, or on an engine "
                              "that applies stop strings itself)")
        wanted = [n for n, on in (("logprobs", hooks.logprobs),
                                  ("presence_penalty / frequency_penalty / logit_bias / repetition_penalty / "
                                   "min_tokens", hooks.edits_scores)) if on]
        if wanted and not self.in_loop(strategy):
            raise ConfigError(f"{wanted[0]} is not supported with strategy {strategy!r} on backend "
                              f"{self.backend.name!r} (single-pass strategies in formtax's own decode loop only)")

    def generation_request(self, prompt: Prompt, kwargs: dict[str, Any]) -> GenRequest:
        """The strategy request a job's arguments make (what the worker will build), for checks before queueing."""
        from formtax.api import requests_of
        from formtax.constraints.native import as_constraint
        from formtax.decoding.sampling import Sampling

        answer = kwargs["answer"]
        (req,) = requests_of(self.backend, [prompt], as_constraint(answer) if answer is not None else None,
                             kwargs["max_tokens"], kwargs["reasoning"], kwargs["triggers"], 0, True,
                             Sampling(kwargs["temperature"], kwargs["top_p"], kwargs["top_k"], kwargs["min_p"]),
                             False, kwargs["raw"],
                             kwargs["closing"], {})
        return req

    def check_job(self, prompt: Prompt, kwargs: dict[str, Any]) -> None:
        """What the worker would refuse, refused before the request is queued: the context limit first, then the
        strategy's own check (a missing answer, a budget the answer cannot fit). Called off the event loop
        (tokenizing a long prompt and compiling a grammar take time), so ``/health`` and other requests are
        answered meanwhile."""
        from formtax.api import check_context

        req = self.generation_request(prompt, kwargs)
        check_context(self.backend, [req])
        get_strategy(kwargs["strategy"]).check(self.backend, [req])

    async def run_all(self, request: Request, req: Sampled, prompt: Prompt, kwargs: dict[str, Any],
                      hooks: list[RequestHooks]) -> list[Result] | JSONResponse:
        """Every choice's result, or the error response of a request that timed out (504) or whose client went
        away; either way its rows are cancelled."""
        seed = fresh_seed() if req.seed is None else req.seed  # unseeded: fresh entropy, as OpenAI samples
        arrival = self.metrics.started()
        tasks = [asyncio.ensure_future(self.batcher.run(prompt, job_key(kwargs), self.cfg.timeout_s, choice_seed(seed, k), h,
                                                        checked=True, **kwargs))
                 for k, h in enumerate(hooks)]
        try:
            while not all(t.done() for t in tasks):
                await asyncio.wait(tasks, timeout=0.25)
                if not all(t.done() for t in tasks) and await request.is_disconnected():
                    return out.error(499, "the client closed the request", kind="cancelled")
            results = [t.result() for t in tasks]
            self.metrics.finished(arrival, results, [h.times for h in hooks], kwargs["answer"] is not None)
            return results
        except TimeoutError:
            return out.error(504, f"the request did not finish within {self.cfg.timeout_s:g} s", kind="timeout")
        finally:
            self.metrics.ended()
            for t in tasks:
                t.cancel()

    async def live(self, choices: list[StreamChoice], kwargs: dict[str, Any], base: dict[str, Any],
                   chunks_of: Callable[[StreamChoice], ChoiceChunks]) -> AsyncIterator[dict[str, Any]]:
        """The chunks of every choice as its row decodes in the shared batch, merged into one stream: each
        choice's chunks as ``chunks_of`` words them (:mod:`formtax.serve.chunks`: chat's or completions'), then
        one usage chunk on ``base``. A row that cannot start raises before the first chunk (the route answers a
        400). Closing the stream (the client went away) cancels every row."""
        merged: asyncio.Queue[Any] = asyncio.Queue()
        arrival = self.metrics.started()

        async def pump(choice: StreamChoice) -> None:
            try:
                async for chunk in self._choice_chunks(choice, kwargs, chunks_of(choice)):
                    await merged.put(chunk)
            except Exception as e:  # noqa: BLE001 - handed to the consumer, which raises it
                await merged.put(e)
            finally:
                await merged.put(END)

        tasks = [asyncio.create_task(pump(c)) for c in choices]
        results: dict[int, Result] = {}
        try:
            ended = 0
            sent = False
            while ended < len(choices):
                item = await merged.get()
                if item is END:
                    ended += 1
                elif isinstance(item, Exception):
                    if not sent or isinstance(item, FormtaxError):
                        raise item  # before the stream starts: the route answers with the error's status
                    yield stream_fault(item)  # mid-stream: an error chunk ends the stream (no exception text)
                    return
                elif isinstance(item, _Finished):
                    results[item.index] = item.result
                else:
                    sent = True
                    yield item
                    if "error" in item:
                        return
            pairs = [(c, results[c.index]) for c in choices if c.index in results]
            if pairs:
                done = [res for _, res in pairs]
                self.metrics.finished(arrival, done, [c.hooks.times for c, _ in pairs], kwargs["answer"] is not None)
                firsts = {c.prompt_index: res for c, res in reversed(pairs)}
                yield usage_chunk(base, out.usage(done, list(firsts.values())))
        finally:
            self.metrics.ended()
            for t in tasks:
                t.cancel()

    async def _choice_chunks(self, choice: StreamChoice, kwargs: dict[str, Any], chunks: ChoiceChunks
                             ) -> AsyncIterator[dict[str, Any] | _Finished]:
        """One choice's chunks (:meth:`live`): its row joins the batch with a token sink, and each delta it
        decodes goes to ``chunks`` (the output format's wording); its Result last, as :class:`_Finished`. A row
        that outlives the server's timeout ends the stream with an error chunk."""
        q: queue.Queue[Any] = queue.Queue()
        hooks = choice.hooks
        hooks.sink = lambda t, ph: q.put((t, ph))
        job = self.batcher.submit(choice.prompt, job_key(kwargs), choice.seed, hooks, checked=True, **kwargs)

        def done(fut: Any) -> None:
            if not fut.cancelled():
                q.put(fut.exception() or fut.result())
            q.put(END)

        job.future.add_done_callback(done)
        parts = deltas(self.batcher.backend.tokenizer, q)
        started = time.monotonic()
        opening: list[dict[str, Any]] | None = chunks.opening()
        try:
            while True:
                left = self.cfg.timeout_s - (time.monotonic() - started)
                try:
                    part = await asyncio.wait_for(asyncio.to_thread(next, parts, None), max(left, 0.001))
                except TimeoutError:
                    yield {"error": {"message": f"the request did not finish within {self.cfg.timeout_s:g} s",
                                     "type": "timeout", "param": None, "code": None}}
                    return
                if opening is not None:  # once the row has produced anything: a refusal is raised before it
                    for chunk in opening:
                        yield chunk
                    opening = None
                if part is None:
                    return
                if isinstance(part, Result):
                    for chunk in chunks.finish(part):
                        yield chunk
                    yield _Finished(choice.index, part)
                    return
                assert isinstance(part, Delta)
                for chunk in chunks.delta(part):
                    yield chunk
        finally:
            self.batcher.cancel(job)  # a no-op when it finished; otherwise its row leaves the batch


def stream_fault(e: BaseException) -> dict[str, Any]:
    """The error chunk of a stream whose row faulted after its first chunk: logged with a reference, its text
    kept out of the response (as the 500 of a request that is not streamed)."""
    ref = uuid.uuid4().hex[:12]
    log.error("a streamed row failed (ref %s)", ref, exc_info=e)
    return {"error": {"message": f"the server failed on this request (ref {ref} in the server's log)",
                      "type": "server_error", "param": None, "code": None}}


@dataclass
class StreamChoice:
    """One choice of a live stream: its prompt, controls, seed and index among the choices."""

    prompt: Prompt
    hooks: RequestHooks
    seed: int
    index: int  # the choice's index in the response
    prompt_index: int = 0  # which prompt of the request (legacy completions take several)


@dataclass
class _Finished:
    """A streamed choice's Result, handed from its row to :meth:`Serving.live` (never sent to the client)."""

    index: int
    result: Result


async def then(first: dict[str, Any], rest: AsyncIterator[dict[str, Any]]) -> AsyncIterator[dict[str, Any]]:
    yield first
    async for chunk in rest:
        yield chunk
