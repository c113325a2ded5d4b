"""``formtax serve``: an OpenAI-compatible HTTP server over any formtax backend (FastAPI + uvicorn).

Endpoints: ``POST /v1/chat/completions``, ``POST /v1/completions``, ``GET /v1/models``, ``GET /health``. How a
request becomes a generation is :mod:`formtax.serve.schema`; concurrent requests share batches
(:mod:`formtax.serve.batcher`). Responses carry OpenAI's fields plus ``reasoning_content`` (the strategy's reasoning
phase, when it has one) and a ``formtax`` object (strategy, parsed, parse_ok, finish_reason, error). Bad requests
get a 400 with OpenAI's error shape (``{"error": {"message", "type": "invalid_request_error", "param"}}``) and one
line naming the problem; a request that outlives ``timeout_s`` gets a 504.

Streaming (``stream: true``) sends OpenAI's server-sent-event chunks (role, ``reasoning_content``, ``content``,
finish reason, ``[DONE]``) live, token by token, through :func:`formtax.stream` for single-pass strategies on
step-wise backends (such a request decodes on its own, outside the shared batches); tool choices, multi-call
strategies (suffix, nl2format) and other backends send the same chunks when the generation completes.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse

from formtax.decoding.engine import Backend
from formtax.errors import FormtaxError
from formtax.serve.batcher import Batcher
from formtax.serve.schema import ABSTAIN, ChatRequest, CompletionRequest, Sampled, chat_constraint
from formtax.strategies import get_strategy
from formtax.strategies.base import Prompt, Result
from formtax.streaming import Delta, astream

FINISH = {"length": "length", "length-incomplete": "length"}  # everything else ends as "stop"


def _error(status: int, message: str, param: str | None = None, kind: str = "invalid_request_error") -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": None}}, status_code=status)


def create_app(backend: Backend, max_batch: int = 16, window_s: float = 0.01, timeout_s: float = 600.0,
               default_max_tokens: int = 256) -> FastAPI:
    """The server app over ``backend`` (module docstring); ``app.state.batcher`` holds the batcher."""
    batcher = Batcher(backend, max_batch=max_batch, window_s=window_s)
    app = FastAPI(title="formtax", version="1")
    app.state.batcher = batcher
    app.router.add_event_handler("shutdown", batcher.close)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(x) for x in first.get("loc", ()) if x != "body")
        return _error(400, f"{where}: {first.get('msg', 'invalid request')}" if where else str(first.get("msg")),
                      where or None)

    @app.exception_handler(FormtaxError)
    async def _formtax(request: Request, exc: FormtaxError) -> JSONResponse:
        return _error(400, str(exc))

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": backend.model_id, "object": "model", "owned_by": "formtax"}]}

    async def run(req: Sampled, prompt: Prompt, strategy: str, answer: Any, raw: bool) -> Result:
        get_strategy(strategy)  # an unknown name is a 400 before anything is queued
        opts = req.formtax
        kwargs = {"strategy": strategy, "answer": answer, "max_tokens": req.budget(default_max_tokens),
                  "temperature": req.temperature, "top_p": req.top_p, "seed": req.seed or 0, "raw": raw,
                  "reasoning": opts.reasoning if opts else None, "triggers": tuple(opts.triggers) if opts else (),
                  "closing": opts.closing if opts else None}
        key = tuple((k, v.describe() if hasattr(v, "describe") else repr(v)) for k, v in sorted(kwargs.items()))
        try:
            return await batcher.run(prompt, key, timeout_s, **kwargs)
        except TimeoutError:
            raise _Timeout from None

    @app.exception_handler(Exception)
    async def _other(request: Request, exc: Exception) -> JSONResponse:
        if isinstance(exc, _Timeout):
            return _error(504, f"the request did not finish within {timeout_s:g} s", kind="timeout")
        return _error(500, f"{type(exc).__name__}: {exc}", kind="server_error")

    @app.post("/v1/chat/completions", response_model=None)
    async def chat(req: ChatRequest) -> Any:
        strategy, constraint, tool = chat_constraint(req)
        messages: list[dict[str, str]] = [{"role": m.role, "content": m.text()} for m in req.messages]
        if req.stream and not tool and _streams(backend, strategy):
            opts = req.formtax
            kwargs = {"max_tokens": req.budget(default_max_tokens), "temperature": req.temperature,
                      "top_p": req.top_p, "seed": req.seed or 0, "reasoning": opts.reasoning if opts else None,
                      "triggers": tuple(opts.triggers) if opts else (), "closing": opts.closing if opts else None}
            parts = astream(backend, messages, strategy, constraint, **kwargs)
            first = await anext(parts)  # a bad request fails here, as a 400, before the stream starts
            return StreamingResponse(_live_chunks(backend.model_id, first, parts), media_type="text/event-stream")
        res = await run(req, messages, strategy, constraint, raw=False)
        message: dict[str, Any] = {"role": "assistant", "content": _content(res)}
        if _reasoning(res) is not None:
            message["reasoning_content"] = _reasoning(res)
        finish = FINISH.get(res.finish_reason, "stop")
        if tool and res.parse_ok and res.parsed != ABSTAIN:
            message["tool_calls"] = [{"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                                      "function": {"name": res.parsed, "arguments": "{}"}}]
            message["content"] = None
            finish = "tool_calls"
        body = _envelope("chat.completion", backend.model_id, res)
        body["choices"] = [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}]
        headers = _headers(res)
        if req.stream:
            return StreamingResponse(_chat_chunks(body), media_type="text/event-stream", headers=headers)
        return JSONResponse(body, headers=headers)

    @app.post("/v1/completions", response_model=None)
    async def completions(req: CompletionRequest) -> Any:
        if isinstance(req.prompt, list) and len(req.prompt) != 1:
            raise FormtaxError("prompt: give one prompt per request (n = 1)")
        prompt = req.prompt if isinstance(req.prompt, str) else req.prompt[0]
        opts = req.formtax
        strategy = (opts.strategy if opts and opts.strategy else ("constrained" if opts and opts.answer else "free"))
        res = await run(req, prompt, strategy, opts.answer if opts else None, raw=True)
        body = _envelope("text_completion", backend.model_id, res)
        body["choices"] = [{"index": 0, "text": _content(res) or "", "finish_reason": FINISH.get(res.finish_reason,
                            "stop"), "logprobs": None}]
        if req.stream:
            return StreamingResponse(_text_chunks(body), media_type="text/event-stream")
        return body

    return app


class _Timeout(Exception):
    pass


def _streams(backend: Backend, strategy: str) -> bool:
    """Whether a request can stream live (formtax.stream): a single-pass strategy on a step-wise backend."""
    from formtax.decoding.engine import Capability
    from formtax.strategies.base import SinglePass

    return isinstance(get_strategy(strategy), SinglePass) and Capability.STEP_LOGITS in backend.capabilities


async def _live_chunks(model: str, first: Delta | Result, parts: AsyncIterator[Delta | Result]) -> AsyncIterator[str]:
    """OpenAI chat chunks as the output is decoded: the reasoning phase as ``reasoning_content`` deltas, the answer
    (or a free output) as ``content`` deltas, then the finish reason, usage and the formtax object."""
    base = {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion.chunk", "created": int(time.time()),
            "model": model}
    yield _sse(base | {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                    "finish_reason": None}]})
    part: Delta | Result = first
    while True:
        if isinstance(part, Result):
            body = _envelope("chat.completion", model, part)
            yield _sse(base | {"choices": [{"index": 0, "delta": {}, "finish_reason": FINISH.get(
                part.finish_reason, "stop")}], "usage": body["usage"], "formtax": body["formtax"]})
            yield "data: [DONE]\n\n"
            return
        if part.text:
            key = "reasoning_content" if part.phase in ("reasoning", "rc") else "content"
            yield _sse(base | {"choices": [{"index": 0, "delta": {key: part.text}, "finish_reason": None}]})
        try:
            part = await anext(parts)
        except StopAsyncIteration:
            return


APPROXIMATED_HEADER = "X-Formtax-Schema-Approximated"


def _headers(res: Result) -> dict[str, str]:
    """``X-Formtax-Schema-Approximated``: what the answer's grammar left to the oracle (constraints/spec.py's
    ``approximate_schema``), ``; ``-separated; absent when the grammar is the schema."""
    approximated = res.stats.get("schema_approximated")
    return {APPROXIMATED_HEADER: "; ".join(approximated)} if approximated else {}


def _content(res: Result) -> str | None:
    """The answer where the strategy has one (reasoning apart), else the whole text."""
    return res.answer_text if res.answer_text is not None else res.text


def _reasoning(res: Result) -> str | None:
    return res.reasoning if res.answer_text is not None and res.reasoning else None


def _envelope(kind: str, model: str, res: Result) -> dict[str, Any]:
    completion = res.tokens.total
    return {"id": f"{'chatcmpl' if kind == 'chat.completion' else 'cmpl'}-{uuid.uuid4().hex}", "object": kind,
            "created": int(time.time()), "model": model,
            "usage": {"prompt_tokens": res.tokens.prompt, "completion_tokens": completion,
                      "total_tokens": res.tokens.prompt + completion},
            "formtax": {"strategy": res.strategy, "parsed": _jsonable(res.parsed), "parse_ok": res.parse_ok,
                        "finish_reason": res.finish_reason, "error": res.error, "token_ids": res.token_ids}}


def _jsonable(value: Any) -> Any:
    try:
        json.dumps(value)
        return value
    except TypeError:
        return str(value)


def _sse(obj: Any) -> str:
    return f"data: {json.dumps(obj)}\n\n"


async def _chat_chunks(body: dict[str, Any]) -> AsyncIterator[str]:
    choice = body["choices"][0]
    msg = choice["message"]
    base = {k: body[k] for k in ("id", "created", "model")} | {"object": "chat.completion.chunk"}
    deltas: list[dict[str, Any]] = [{"role": "assistant", "content": ""}]
    if msg.get("reasoning_content"):
        deltas.append({"reasoning_content": msg["reasoning_content"]})
    if msg.get("tool_calls"):
        deltas.append({"tool_calls": [{"index": 0, **msg["tool_calls"][0]}]})
    elif msg.get("content"):
        deltas.append({"content": msg["content"]})
    for d in deltas:
        yield _sse(base | {"choices": [{"index": 0, "delta": d, "finish_reason": None}]})
    yield _sse(base | {"choices": [{"index": 0, "delta": {}, "finish_reason": choice["finish_reason"]}],
                       "usage": body["usage"], "formtax": body["formtax"]})
    yield "data: [DONE]\n\n"


async def _text_chunks(body: dict[str, Any]) -> AsyncIterator[str]:
    choice = body["choices"][0]
    base = {k: body[k] for k in ("id", "created", "model")} | {"object": "text_completion"}
    yield _sse(base | {"choices": [{"index": 0, "text": choice["text"], "finish_reason": None}]})
    yield _sse(base | {"choices": [{"index": 0, "text": "", "finish_reason": choice["finish_reason"]}],
                       "usage": body["usage"], "formtax": body["formtax"]})
    yield "data: [DONE]\n\n"


class ServerThread:
    """Run an app with uvicorn on 127.0.0.1 in a background thread (tests, benchmarks, notebooks): a random free
    port unless given, a bounded start-up, and ``stop()`` (or the context manager) always shuts it down."""

    def __init__(self, app: FastAPI, port: int = 0, startup_s: float = 30.0) -> None:
        import socket
        import threading

        import uvicorn

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", port))
        self.port = int(self.sock.getsockname()[1])
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + startup_s
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                self.stop()
                raise RuntimeError(f"the server did not start within {startup_s:g} s")
            time.sleep(0.02)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)
        self.sock.close()

    def __enter__(self) -> ServerThread:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
