"""The routes of ``formtax serve`` on FastAPI ``APIRouter``s, as vLLM's API server lays out its endpoints: a route
parses its body (FastAPI, against :mod:`formtax.serve.schema`'s and :mod:`formtax.serve.responses_protocol`'s
models), takes its serving object from the app's state (``request.app.state``, filled by
:func:`formtax.serve.app.create_app`) and turns the serving's outcome into a response. Nothing is captured from an
app factory's scope, so the routers are module-level and one app's state is all a request reads.

* :data:`probes`: ``GET /health`` and ``GET /metrics``, open even with ``--api-key`` (probes and scrapers send no
  key; vLLM's are open too);
* :data:`router`: the OpenAI endpoints (models, chat, completions, responses), behind :func:`authorize`.

Errors are the app's exception handlers' (:mod:`formtax.serve.errors`); a route never words one of its own.
"""

from __future__ import annotations

import hmac
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST

from formtax.serve import chunks, serving_responses
from formtax.serve import shapes as out
from formtax.serve.batcher import Batcher
from formtax.serve.config import ServeConfig
from formtax.serve.errors import Unauthorized
from formtax.serve.metrics import ServerMetrics
from formtax.serve.responses_protocol import ResponsesRequest
from formtax.serve.schema import ChatRequest, CompletionRequest
from formtax.serve.serving import Outcome
from formtax.serve.serving_chat import ChatServing, CompletionServing
from formtax.serve.serving_models import ServedModels
from formtax.serve.serving_responses import ResponsesServing

# What a route reads from the app's state (set once by create_app): typed accessors, as vLLM's routes read theirs.


def config(request: Request) -> ServeConfig:
    cfg: ServeConfig = request.app.state.config
    return cfg


def batcher(request: Request) -> Batcher:
    shared: Batcher = request.app.state.batcher
    return shared


def metrics(request: Request) -> ServerMetrics:
    m: ServerMetrics = request.app.state.metrics
    return m


def models(request: Request) -> ServedModels:
    served: ServedModels = request.app.state.models
    return served


def chat_serving(request: Request) -> ChatServing:
    serving: ChatServing = request.app.state.chat_serving
    return serving


def completion_serving(request: Request) -> CompletionServing:
    serving: CompletionServing = request.app.state.completion_serving
    return serving


def responses_serving(request: Request) -> ResponsesServing:
    serving: ResponsesServing = request.app.state.responses_serving
    return serving


def authorize(request: Request) -> None:
    """``Authorization: Bearer <key>`` when the server has a key, compared in constant time (a dependency, not an
    HTTP middleware: Starlette's middleware wrapper hides a client's disconnect from the route)."""
    key = config(request).api_key
    if key is not None:
        given = request.headers.get("authorization", "")
        if not hmac.compare_digest(given.encode("utf-8", "surrogateescape"),
                                   f"Bearer {key}".encode("utf-8", "surrogateescape")):
            raise Unauthorized("incorrect API key provided" if given else
                               "no API key provided (Authorization: Bearer <key>)")


probes = APIRouter()
router = APIRouter(dependencies=[Depends(authorize)])


@probes.get("/health")
async def health(request: Request) -> JSONResponse:
    """503 when the worker is dead or one batch has run past ``timeout_s + stuck_after_s`` (with ``Retry-After``,
    as a 429 has)."""
    shared, cfg = batcher(request), config(request)
    busy = None if shared.busy_since is None else time.monotonic() - shared.busy_since
    stuck = not shared.alive or (busy is not None and busy > cfg.timeout_s + cfg.stuck_after_s)
    body = {"status": "stuck" if stuck else "ok", "worker_alive": shared.alive, "busy_s": busy,
            "waiting": shared.waiting}
    return JSONResponse(body, status_code=503 if stuck else 200,
                        headers={"Retry-After": str(out.RETRY_AFTER_S)} if stuck else None)


@probes.get("/metrics")
async def scrape(request: Request) -> Response:
    """Prometheus text (:mod:`formtax.serve.metrics`)."""
    return Response(metrics(request).render(batcher(request).waiting), media_type=CONTENT_TYPE_LATEST)


@router.get("/v1/models")
async def list_models(request: Request) -> dict[str, Any]:
    return models(request).listing()


@router.get("/v1/models/{model_id:path}")
async def retrieve_model(request: Request, model_id: str) -> Any:
    return models(request).lookup(model_id)


def reply(outcome: Outcome | JSONResponse, include_usage: bool) -> Any:
    """Chat's and completions' response: a JSON body, or OpenAI's server-sent chunks (``[DONE]`` last)."""
    if isinstance(outcome, JSONResponse):
        return outcome
    if outcome.chunks is not None:
        return StreamingResponse(chunks.sse_events(outcome.chunks, include_usage), media_type="text/event-stream",
                                 headers=outcome.headers)
    return JSONResponse(outcome.body, headers=outcome.headers)


@router.post("/v1/chat/completions", response_model=None)
async def create_chat_completion(request: Request, req: ChatRequest) -> Any:
    return reply(await chat_serving(request).create(request, req), req.include_usage())


@router.post("/v1/completions", response_model=None)
async def create_completion(request: Request, req: CompletionRequest) -> Any:
    return reply(await completion_serving(request).create(request, req), req.include_usage())


@router.post("/v1/responses", response_model=None)
async def create_response(request: Request, req: ResponsesRequest) -> Any:
    outcome = await responses_serving(request).create(request, req)
    if isinstance(outcome, JSONResponse):
        return outcome
    if outcome.chunks is not None:
        events: AsyncIterator[str] = serving_responses.sse_events(outcome.chunks)
        return StreamingResponse(events, media_type="text/event-stream", headers=outcome.headers)
    return JSONResponse(outcome.body, headers=outcome.headers)


@router.get("/v1/responses/{response_id}")
async def retrieve_response(response_id: str) -> JSONResponse:
    return ResponsesServing.retrieve(response_id)
