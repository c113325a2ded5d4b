"""``formtax serve``: an OpenAI-compatible HTTP server over any formtax backend (FastAPI + uvicorn).

Endpoints: ``POST /v1/chat/completions``, ``POST /v1/completions``, ``POST /v1/responses``, ``GET /v1/models``,
``GET /health``. This module builds the app, as vLLM's API server does: the shared batcher, the metrics and one
serving object per API go in the app's state, which the routes (:mod:`formtax.serve.routes`, on ``APIRouter``s)
read per request; errors are the handlers of :mod:`formtax.serve.errors`. The serving classes
(:mod:`formtax.serve.serving_chat`, :mod:`formtax.serve.serving_responses`) turn a request into generations. How
a request becomes a generation is :mod:`formtax.serve.schema` (tools: :mod:`formtax.serve.tools`); concurrent
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

import atexit
import time
from dataclasses import fields
from typing import Any

from fastapi import FastAPI
from starlette.datastructures import State

from formtax.decoding.engine import Backend
from formtax.errors import ConfigError
from formtax.serve import routes
from formtax.serve import shapes as out
from formtax.serve.batcher import Batcher
from formtax.serve.config import ServeConfig
from formtax.serve.errors import install_error_handlers
from formtax.serve.limits import BodyLimit, default_body_limit
from formtax.serve.metrics import ServerMetrics
from formtax.serve.serving_chat import ChatServing, CompletionServing
from formtax.serve.serving_models import ServedModels, clean_id, served_names
from formtax.serve.serving_responses import ResponsesServing
from formtax.strategies import get_strategy

APPROXIMATED_HEADER = out.APPROXIMATED_HEADER
__all__ = ["APPROXIMATED_HEADER", "ServeConfig", "ServerThread", "clean_id", "create_app", "served_names"]


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
    app = FastAPI(title="formtax", version="1")
    init_app_state(app.state, backend, cfg)
    app.add_middleware(BodyLimit, limit=cfg.max_body_bytes or default_body_limit(backend.context_length))
    app.router.add_event_handler("shutdown", app.state.batcher.close)
    install_error_handlers(app)
    app.include_router(routes.probes)
    app.include_router(routes.router)
    return app


def init_app_state(state: State, backend: Backend, cfg: ServeConfig) -> None:
    """What the routes read from ``request.app.state``: the settings, the shared batcher, the metrics, the served
    models and one serving object per API (the Responses API's serves through chat's)."""
    models = ServedModels(backend, cfg)
    batcher = Batcher(backend, max_batch=cfg.max_batch, window_s=cfg.window_s, max_queue=cfg.max_queue)
    metrics = ServerMetrics(models.default)
    state.config, state.batcher, state.metrics, state.models = cfg, batcher, metrics, models
    state.chat_serving = ChatServing(backend, batcher, cfg, models, metrics)
    state.completion_serving = CompletionServing(backend, batcher, cfg, models, metrics)
    state.responses_serving = ResponsesServing(state.chat_serving, cfg)


class ServerThread:
    """Run an app with uvicorn on 127.0.0.1 in a background thread (tests, benchmarks, notebooks): a random free
    port unless given, a bounded start-up, and ``stop()`` (or the context manager) always shuts it down.

    A server nobody stopped is stopped at interpreter exit (``atexit``): a script that ends with the server still
    running otherwise finalises while the server's threads still free tensors, and a daemon thread that wakes then
    is torn down inside torch's C++ frames (``terminate called without an active exception``, SIGABRT)."""

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
        atexit.register(self.stop)
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
        atexit.unregister(self.stop)
        self.server.should_exit = True
        self.thread.join(timeout=30)
        self.sock.close()

    def __enter__(self) -> ServerThread:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
