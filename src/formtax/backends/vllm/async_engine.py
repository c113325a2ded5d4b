"""vLLM's async engine (``AsyncLLM``) behind formtax's vLLM backend, for ``formtax serve --backend vllm``.

The offline ``vllm.LLM`` decodes one call's requests to the end; a server built on it can only batch requests that
arrive together. Here the engine is vLLM's own serving engine: it runs on an event loop in its own thread, and any
thread may hand it requests (:meth:`AsyncEngine.generate`). formtax's server answers each HTTP request in its own
thread (serve/batcher.py, for backends with ``RowEngine.concurrent``), so requests with different strategies,
answers and sampling settings join vLLM's running batch as they arrive (continuous batching, per-request
sampling).

A call's :class:`~formtax.decoding.rowengine.RowControls` (set by the server for the request it serves) are
honoured: once ``cancel`` is set (the client went away, the request timed out) the call's requests are aborted in
the engine, and ``sink`` is handed each row's tokens as the engine emits them.

Ours, and why: vLLM's ``AsyncLLM`` is an asyncio API; formtax's strategies are synchronous code that call
``decode_rows``. This adapter is the bridge (one loop thread, ``run_coroutine_threadsafe``), nothing more.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from formtax.decoding.plan import Finish
from formtax.decoding.rowengine import RowControls

log = logging.getLogger(__name__)

CANCEL_POLL_S = 0.05  # how often a call checks whether its caller cancelled it


def finish_of(output: Any) -> str | None:
    """A vLLM ``CompletionOutput``'s finish reason, where a caller's stop string ended it formtax's
    ``Finish.STOP_SEQUENCE``: vLLM says ``"stop"`` for an EOS, a stop token and a stop string alike, and tells them
    apart by ``stop_reason`` (None, the token id, the string)."""
    if isinstance(getattr(output, "stop_reason", None), str):
        return Finish.STOP_SEQUENCE
    reason = output.finish_reason
    return None if reason is None else str(reason)


class AsyncEngine:
    """An ``AsyncLLM`` on its own event-loop thread (module docstring)."""

    def __init__(self, engine_kwargs: dict[str, Any]) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="formtax-vllm-loop", daemon=True)
        self._thread.start()
        self.aborted = 0  # engine requests aborted because their caller cancelled
        self.engine = self._call(self._start(engine_kwargs))

    @staticmethod
    async def _start(engine_kwargs: dict[str, Any]) -> Any:
        from vllm.config import StructuredOutputsConfig
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        kw = dict(engine_kwargs)
        if isinstance(kw.get("structured_outputs_config"), dict):  # vllm.LLM converts it; the engine args do not
            kw["structured_outputs_config"] = StructuredOutputsConfig(**kw["structured_outputs_config"])
        return AsyncLLM.from_engine_args(AsyncEngineArgs(**kw))

    def _call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def get_default_sampling_params(self) -> Any:
        """The model's generation defaults, as ``vllm.LLM.get_default_sampling_params`` gives them."""
        from vllm import SamplingParams

        diff = self.engine.model_config.get_diff_sampling_param()
        return SamplingParams.from_optional(**diff) if diff else SamplingParams()

    def generate(self, prompts: Sequence[list[int]], params: Sequence[Any], controls: RowControls | None = None,
                 sinks: Sequence[Callable[[list[int]], None] | None] | None = None
                 ) -> list[tuple[list[int], str | None]]:
        """Decode every request to completion (blocking the calling thread only); (token ids, finish reason:
        :func:`finish_of`) per request, in order. ``sinks[k]`` is handed request k's new tokens as they come."""
        return self._call(self._generate(list(prompts), list(params), controls, list(sinks or [None] * len(prompts))))

    async def _generate(self, prompts: list[list[int]], params: list[Any], controls: RowControls | None,
                        sinks: list[Callable[[list[int]], None] | None]) -> list[tuple[list[int], str | None]]:
        ids = [f"formtax-{uuid.uuid4().hex}" for _ in prompts]
        tasks = [asyncio.ensure_future(self._one(p, sp, rid, sink))
                 for p, sp, rid, sink in zip(prompts, params, ids, sinks, strict=True)]
        watch = asyncio.ensure_future(self._watch(controls, ids)) if controls is not None else None
        try:
            return list(await asyncio.gather(*tasks))
        finally:
            if watch is not None:
                watch.cancel()

    async def _watch(self, controls: RowControls, ids: list[str]) -> None:
        """Abort the call's requests in the engine once its caller cancels."""
        while not controls.cancel.is_set():
            await asyncio.sleep(CANCEL_POLL_S)
        log.info("aborting %d engine request(s): the caller cancelled", len(ids))
        self.aborted += len(ids)
        await self.engine.abort(ids)

    async def _one(self, prompt: list[int], params: Any, request_id: str,
                   sink: Callable[[list[int]], None] | None) -> tuple[list[int], str | None]:
        tokens: list[int] = []
        finish: str | None = None
        async for out in self.engine.generate({"prompt_token_ids": prompt}, params, request_id):
            got = list(out.outputs[0].token_ids)
            if sink is not None and len(got) > len(tokens):
                sink(got[len(tokens):])
            tokens, finish = got, finish_of(out.outputs[0])
        return tokens, finish

    def score_first(self, prompts: Sequence[list[int]], params: Sequence[Any]) -> list[dict[int, float]]:
        """One-token requests' first-position log-probabilities (token id -> log-prob), in order."""
        return self._call(self._score_first(list(prompts), list(params)))

    async def _score_first(self, prompts: list[list[int]], params: list[Any]) -> list[dict[int, float]]:
        async def one(prompt: list[int], sp: Any) -> dict[int, float]:
            got: dict[int, float] = {}
            async for out in self.engine.generate({"prompt_token_ids": prompt}, sp, f"formtax-{uuid.uuid4().hex}"):
                lps = out.outputs[0].logprobs
                if lps:
                    got = {int(t): float(lp.logprob) for t, lp in lps[0].items()}
            return got

        return list(await asyncio.gather(*(one(p, sp) for p, sp in zip(prompts, params, strict=True))))

    def shutdown(self) -> None:
        """Stop the engine, then its loop (after cancelling what still runs there)."""
        try:
            self.engine.shutdown()
        finally:
            self._call(self._cancel_all())
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5)

    @staticmethod
    async def _cancel_all() -> None:
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
