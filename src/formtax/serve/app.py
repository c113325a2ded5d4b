"""``formtax serve``: an OpenAI-compatible HTTP server over any formtax backend (FastAPI + uvicorn).

Endpoints: ``POST /v1/chat/completions``, ``POST /v1/completions``, ``POST /v1/responses``, ``GET /v1/models``,
``GET /health``. This module routes; the serving classes (:mod:`formtax.serve.serving_chat`,
:mod:`formtax.serve.responses_api`) turn a request into generations. How a
request becomes a generation is :mod:`formtax.serve.schema` (tools: :mod:`formtax.serve.tools`); concurrent
requests share batches (:mod:`formtax.serve.batcher`), each row under its own controls (:mod:`formtax.serve.hooks`).
Responses carry OpenAI's fields plus ``reasoning_content`` (the strategy's reasoning phase, when it separates one)
and a ``formtax`` object (strategy, parsed, parse_ok, finish_reason, error, token_ids).

What is refused, before any work, with OpenAI's error shape and one line: a malformed or unsupported field (400),
a prompt that with ``max_tokens`` exceeds the model's context (400, ``context_length_exceeded``), an unknown
``model`` (404), a missing or wrong key when the server has one (401), a full queue (429). A request that outlives
``timeout_s`` is cancelled (its row leaves the batch) and gets a clean 504; so is one whose client disconnects.
``/health`` answers 503 when the worker is dead or one batch has run past ``timeout_s + stuck_after_s`` (with
``Retry-After``, as a 429 has), and needs no key. ``GET /v1/models/{id}`` answers one model; an unknown route or a wrong
method answers OpenAI's error object.

Streaming (``stream: true``) sends OpenAI's server-sent-event chunks live, token by token, for single-pass
strategies on step-wise backends (the row decodes in a shared batch like any other); the usage comes on its own last
chunk (``choices: []``) when ``stream_options.include_usage`` asks for it, as OpenAI sends it. Text is ``content``; a
reasoning phase goes to ``reasoning_content`` only when the strategy separates reasoning from its answer, exactly
as without streaming. Tool calls, multi-call strategies (suffix, nl2format) and other backends send the same
chunks when the generation completes.
"""

from __future__ import annotations

import hmac
import logging
import time
import uuid
from dataclasses import fields
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from formtax.decoding.engine import Backend
from formtax.errors import ConfigError, ContextLengthError, FormtaxError
from formtax.serve import shapes as out
from formtax.serve.batcher import Batcher, QueueFull
from formtax.serve.limits import BodyLimit, BodyTooLarge, default_body_limit
from formtax.serve.metrics import ServerMetrics
from formtax.serve.responses_api import ResponseBuilder, ResponsesRequest
from formtax.serve.responses_api import sse_events as responses_sse
from formtax.serve.schema import ChatRequest, CompletionRequest
from formtax.serve.serving import Outcome, ServeConfig
from formtax.serve.serving_chat import ChatServing, CompletionServing
from formtax.serve.vllm_fields import no_equivalent
from formtax.strategies import get_strategy

APPROXIMATED_HEADER = out.APPROXIMATED_HEADER
__all__ = ["APPROXIMATED_HEADER", "ServeConfig", "ServerThread", "create_app"]


log = logging.getLogger(__name__)


def one_line(message: str) -> str:
    """An error message on one line, every line of it kept (an engine's multi-line reason says where)."""
    return " ".join(line.strip() for line in message.splitlines() if line.strip())


class _Unauthorized(FormtaxError):
    pass


OPEN_PATHS = frozenset({"/health", "/metrics"})
"""Routes a server with ``--api-key`` answers without one: health probes and scrapers send none (vLLM's are open
too)."""


def create_app(backend: Backend, config: ServeConfig | None = None, **settings: Any) -> FastAPI:
    """The server app over ``backend`` (module docstring): ``config``, or its fields as keywords;
    ``app.state.batcher`` holds the batcher."""
    known = {f.name for f in fields(ServeConfig)}
    bad = sorted(set(settings) - known)
    if bad:
        raise ConfigError(f"create_app: unknown setting(s) {', '.join(bad)}")
    cfg = config or ServeConfig(**settings)
    if cfg.strategy is not None:
        get_strategy(cfg.strategy)
    names = cfg.served_model_names or (backend.model_id, "default")
    batcher = Batcher(backend, max_batch=cfg.max_batch, window_s=cfg.window_s, max_queue=cfg.max_queue)
    app = FastAPI(title="formtax", version="1")
    app.state.batcher, app.state.config = batcher, cfg
    app.add_middleware(BodyLimit, limit=cfg.max_body_bytes or default_body_limit(backend.context_length))
    metrics = app.state.metrics = ServerMetrics(names[0])
    app.router.add_event_handler("shutdown", batcher.close)

    def authorize(request: Request) -> None:
        """``Authorization: Bearer <key>`` when the server has a key (a dependency, not an HTTP middleware:
        Starlette's middleware wrapper hides a client's disconnect from the route)."""
        if cfg.api_key is not None and request.url.path not in OPEN_PATHS:
            given = request.headers.get("authorization", "")
            if not hmac.compare_digest(given.encode("utf-8", "surrogateescape"),
                                       f"Bearer {cfg.api_key}".encode("utf-8", "surrogateescape")):
                raise _Unauthorized("incorrect API key provided" if given else
                                    "no API key provided (Authorization: Bearer <key>)")

    app.router.dependencies.append(Depends(authorize))

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = list(exc.errors())
        first = errors[0] if errors else {}
        if first.get("type") == "json_invalid":  # the body is not JSON: say so, with no made-up field
            ctx = first.get("ctx") or {}
            return out.error(400, f"the request body is not valid JSON ({ctx.get('error', 'decode error')} at "
                             f"character {first.get('loc', ('', '?'))[-1]})")
        field = str(first.get("loc", ("", ""))[-1])
        if first.get("type") == "extra_forbidden" and (refusal := no_equivalent(field)) is not None:
            return out.error(400, refusal, field)
        message, where = validation_message(errors)
        return out.error(400, message, where)

    @app.exception_handler(FormtaxError)
    async def _formtax(request: Request, exc: FormtaxError) -> JSONResponse:
        if isinstance(exc, ContextLengthError):
            where = "prompt" if request.url.path.endswith("/completions") and "/chat/" not in request.url.path \
                else ("input" if request.url.path.endswith("/responses") else "messages")
            return out.error(400, str(exc), where, code="context_length_exceeded")
        if isinstance(exc, _Unauthorized):
            return out.error(401, str(exc), code="invalid_api_key")
        if isinstance(exc, BodyTooLarge):
            return out.error(413, str(exc), code="request_too_large")
        if isinstance(exc, QueueFull):
            metrics.refused()
            return out.error(429, str(exc), kind="rate_limit_error", code="rate_limit_exceeded",
                             headers={"Retry-After": str(out.RETRY_AFTER_S)})
        return out.error(400, one_line(str(exc)))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        """Unknown routes and wrong methods in OpenAI's error shape (FastAPI's own is ``{"detail": ...}``)."""
        path = request.url.path
        if isinstance(exc.__cause__, BodyTooLarge):  # a chunked body crossed the limit while FastAPI read it
            return out.error(413, str(exc.__cause__), code="request_too_large")
        if exc.status_code == 404:
            message = (f"formtax serves no embedding model ({path}); it serves chat and text completions"
                       if path.rstrip("/").endswith("/embeddings") else f"unknown route: {request.method} {path}")
            return out.error(404, message, code="not_found")
        return out.error(exc.status_code, f"{request.method} {path}: {exc.detail}",
                         code="method_not_allowed" if exc.status_code == 405 else None)

    @app.exception_handler(Exception)
    async def _other(request: Request, exc: Exception) -> JSONResponse:
        """A fault of formtax's own: this request's 500, logged with an id the message gives; the exception's text
        stays in the log (it can hold paths, code or another request's data)."""
        ref = uuid.uuid4().hex[:12]
        log.error("request %s %s failed (ref %s)", request.method, request.url.path, ref, exc_info=exc)
        metrics.faulted()
        return out.error(500, f"the server failed on this request (ref {ref} in the server's log)",
                         kind="server_error")

    @app.get("/health", dependencies=[])
    async def health() -> JSONResponse:
        busy = None if batcher.busy_since is None else time.monotonic() - batcher.busy_since
        stuck = not batcher.alive or (busy is not None and busy > cfg.timeout_s + cfg.stuck_after_s)
        body = {"status": "stuck" if stuck else "ok", "worker_alive": batcher.alive, "busy_s": busy,
                "waiting": batcher.waiting}
        return JSONResponse(body, status_code=503 if stuck else 200,
                            headers={"Retry-After": str(out.RETRY_AFTER_S)} if stuck else None)

    created = int(time.time())

    def model_entry(name: str) -> dict[str, Any]:
        return {"id": name, "object": "model", "created": created, "owned_by": "formtax"}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [model_entry(n) for n in names]}

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str) -> Any:
        if model_id not in names:
            return out.error(404, f"the model {model_id!r} does not exist; served: {', '.join(names)}", "model",
                             code="model_not_found")
        return model_entry(model_id)

    chat_serving = ChatServing(backend, batcher, cfg, names, metrics)
    text_serving = CompletionServing(backend, batcher, cfg, names, metrics)

    @app.get("/metrics")
    async def scrape() -> Response:
        return Response(metrics.render(batcher.waiting), media_type=CONTENT_TYPE_LATEST)

    def reply(outcome: Outcome | JSONResponse, include_usage: bool) -> Any:
        if isinstance(outcome, JSONResponse):
            return outcome
        if outcome.chunks is not None:
            return StreamingResponse(out.sse_events(outcome.chunks, include_usage), media_type="text/event-stream",
                                     headers=outcome.headers)
        return JSONResponse(outcome.body, headers=outcome.headers)

    @app.post("/v1/chat/completions", response_model=None)
    async def chat(request: Request, req: ChatRequest) -> Any:
        return reply(await chat_serving.create(request, req), req.include_usage())

    @app.post("/v1/completions", response_model=None)
    async def completions(request: Request, req: CompletionRequest) -> Any:
        return reply(await text_serving.create(request, req), req.include_usage())

    @app.post("/v1/responses", response_model=None)
    async def responses(request: Request, req: ResponsesRequest) -> Any:
        try:
            as_chat = req.to_chat()
        except ValidationError as e:
            raise ConfigError(validation_message(e.errors())) from None
        outcome = await chat_serving.create(request, as_chat)
        if isinstance(outcome, JSONResponse):
            return outcome
        builder = ResponseBuilder(req, chat_serving.model_name(as_chat))
        if outcome.chunks is not None:
            return StreamingResponse(responses_sse(builder.events(outcome.chunks)), media_type="text/event-stream",
                                     headers=outcome.headers)
        assert outcome.body is not None
        return JSONResponse(builder.from_chat(outcome.body), headers=outcome.headers)

    @app.get("/v1/responses/{response_id}")
    async def stored_response(response_id: str) -> JSONResponse:
        return out.error(404, f"formtax serve stores no responses ({response_id}); keep the response you were sent",
                         code="not_found")

    return app


def validation_message(errors: list[Any]) -> tuple[str, str | None]:
    """One line for a request's first validation error, and the field it names."""
    first = errors[0] if errors else {}
    where = ".".join(str(x) for x in first.get("loc", ()) if x != "body")
    msg = "not supported by formtax serve" if first.get("type") == "extra_forbidden" else \
        str(first.get("msg", "invalid request")).removeprefix("Value error, ")
    return (f"{where}: {msg}" if where else msg), (where or None)


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
