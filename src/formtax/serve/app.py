"""``formtax serve``: an OpenAI-compatible HTTP server over any formtax backend (FastAPI + uvicorn).

Endpoints: ``POST /v1/chat/completions``, ``POST /v1/completions``, ``GET /v1/models``, ``GET /health``. How a
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
strategies on step-wise backends (the row decodes in a shared batch like any other). Text is ``content``; a
reasoning phase goes to ``reasoning_content`` only when the strategy separates reasoning from its answer, exactly
as without streaming. Tool calls, multi-call strategies (suffix, nl2format) and other backends send the same
chunks when the generation completes.
"""

from __future__ import annotations

import asyncio
import queue
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, fields
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from formtax.api import check_context
from formtax.constraints.spec import Constraint
from formtax.decoding.engine import Backend, Capability
from formtax.decoding.plan import Phase
from formtax.decoding.sampling import fresh_seed
from formtax.errors import ConfigError, ContextLengthError, FormtaxError
from formtax.serve import responses as out
from formtax.serve.batcher import Batcher, QueueFull
from formtax.serve.hooks import RequestHooks, cut_at_stop
from formtax.serve.schema import ChatRequest, CompletionRequest, Sampled, chat_constraint
from formtax.serve.tools import ToolPlan, read_calls, tools_prompt, with_tools_prompt
from formtax.strategies import get_strategy
from formtax.strategies.base import Prompt, Result, SinglePass
from formtax.streaming import END, Delta, deltas

APPROXIMATED_HEADER = out.APPROXIMATED_HEADER


@dataclass
class ServeConfig:
    """The server's settings (``formtax serve``'s flags)."""

    max_batch: int = 16
    window_s: float = 0.01
    timeout_s: float = 600.0
    default_max_tokens: int = 256
    max_queue: int = 256
    temperature: float = 1.0  # OpenAI's default; ``--temperature`` sets the server's own
    served_model_names: tuple[str, ...] = ()  # names a request's ``model`` may use (default: its id, "default")
    api_key: str | None = None  # when set, requests need ``Authorization: Bearer <key>``
    strategy: str | None = None  # the default strategy of a request that names none
    answer: str | None = None  # the default answer SPEC of a request that gives no answer format
    stuck_after_s: float = 30.0


class _Unauthorized(FormtaxError):
    pass


OPEN_PATHS = frozenset({"/health"})
"""Routes a server with ``--api-key`` answers without one: health probes send none (vLLM's ``/health`` is open too)."""


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
    app.router.add_event_handler("shutdown", batcher.close)

    def authorize(request: Request) -> None:
        """``Authorization: Bearer <key>`` when the server has a key (a dependency, not an HTTP middleware:
        Starlette's middleware wrapper hides a client's disconnect from the route)."""
        if cfg.api_key is not None and request.url.path not in OPEN_PATHS:
            given = request.headers.get("authorization", "")
            if given != f"Bearer {cfg.api_key}":
                raise _Unauthorized("incorrect API key provided" if given else
                                    "no API key provided (Authorization: Bearer <key>)")

    app.router.dependencies.append(Depends(authorize))

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(x) for x in first.get("loc", ()) if x != "body")
        msg = "not supported by formtax serve" if first.get("type") == "extra_forbidden" else \
            str(first.get("msg", "invalid request")).removeprefix("Value error, ")
        return out.error(400, f"{where}: {msg}" if where else msg, where or None)

    @app.exception_handler(FormtaxError)
    async def _formtax(request: Request, exc: FormtaxError) -> JSONResponse:
        if isinstance(exc, ContextLengthError):
            return out.error(400, str(exc), "messages", code="context_length_exceeded")
        if isinstance(exc, _Unauthorized):
            return out.error(401, str(exc), code="invalid_api_key")
        if isinstance(exc, QueueFull):
            return out.error(429, str(exc), kind="rate_limit_error", code="rate_limit_exceeded",
                             headers={"Retry-After": str(out.RETRY_AFTER_S)})
        return out.error(400, str(exc).splitlines()[0])

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        """Unknown routes and wrong methods in OpenAI's error shape (FastAPI's own is ``{"detail": ...}``)."""
        path = request.url.path
        if exc.status_code == 404:
            message = (f"formtax serves no embedding model ({path}); it serves chat and text completions"
                       if path.rstrip("/").endswith("/embeddings") else f"unknown route: {request.method} {path}")
            return out.error(404, message, code="not_found")
        return out.error(exc.status_code, f"{request.method} {path}: {exc.detail}",
                         code="method_not_allowed" if exc.status_code == 405 else None)

    @app.exception_handler(Exception)
    async def _other(request: Request, exc: Exception) -> JSONResponse:
        return out.error(500, f"{type(exc).__name__}: {exc}", kind="server_error")

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

    def check_model(req: Sampled) -> JSONResponse | None:
        if req.model is not None and req.model not in names:
            return out.error(404, f"the model {req.model!r} does not exist (served: {', '.join(names)})", "model",
                             code="model_not_found")
        return None

    def plan_kwargs(req: Sampled, strategy: str, answer: Any, raw: bool) -> dict[str, Any]:
        opts = req.formtax
        return {"strategy": strategy, "answer": answer, "max_tokens": req.budget(cfg.default_max_tokens),
                "temperature": cfg.temperature if req.temperature is None else req.temperature,
                "top_p": req.top_p, "raw": raw, "reasoning": opts.reasoning if opts else None,
                "triggers": tuple(opts.triggers) if opts else (), "closing": opts.closing if opts else None}

    def hooks_of(req: Sampled, free_text: bool, logprobs: bool, top: int) -> RequestHooks:
        stops = req.stops()
        return RequestHooks(stops=stops if free_text else (), logprobs=logprobs, top_logprobs=top,
                            presence=req.presence_penalty, frequency=req.frequency_penalty, bias=req.bias())

    def refuse_unhookable(strategy: str, hooks: RequestHooks) -> None:
        """The controls that act inside the loop need a single-pass strategy on a step-wise backend."""
        wanted = [n for n, on in (("stop", bool(hooks.stops)), ("logprobs", hooks.logprobs),
                                  ("presence_penalty / frequency_penalty / logit_bias", hooks.edits_scores)) if on]
        if wanted and not (isinstance(get_strategy(strategy), SinglePass)
                           and Capability.STEP_LOGITS in backend.capabilities):
            raise ConfigError(f"{wanted[0]} is not supported with strategy {strategy!r} on backend {backend.name!r}"
                              " (single-pass strategies on step-wise backends only)")

    async def run_all(request: Request, req: Sampled, prompt: Prompt, kwargs: dict[str, Any],
                      hooks: list[RequestHooks]) -> list[Result] | JSONResponse:
        """Every choice's result, or the error response of a request that timed out (504) or whose client went
        away; either way its rows are cancelled."""
        key = tuple((k, v.describe() if isinstance(v, Constraint) else repr(v)) for k, v in sorted(kwargs.items()))
        seed = fresh_seed() if req.seed is None else req.seed  # unseeded: fresh entropy, as OpenAI samples
        tasks = [asyncio.ensure_future(batcher.run(prompt, key, cfg.timeout_s, seed + k, h, **kwargs))
                 for k, h in enumerate(hooks)]
        try:
            while not all(t.done() for t in tasks):
                await asyncio.wait(tasks, timeout=0.25)
                if not all(t.done() for t in tasks) and await request.is_disconnected():
                    return out.error(499, "the client closed the request", kind="cancelled")
            return [t.result() for t in tasks]
        except TimeoutError:
            return out.error(504, f"the request did not finish within {cfg.timeout_s:g} s", kind="timeout")
        finally:
            for t in tasks:
                t.cancel()

    def precheck(prompt: Prompt, kwargs: dict[str, Any]) -> None:
        """What the worker would refuse, refused here before the request is queued: the context limit first,
        then the strategy's own check (a missing answer, a budget the answer cannot fit)."""
        from formtax.api import requests_of
        from formtax.constraints.native import as_constraint
        from formtax.decoding.sampling import Sampling

        strat = get_strategy(kwargs["strategy"])
        answer = kwargs["answer"]
        reqs = requests_of(backend, [prompt], as_constraint(answer) if answer is not None else None,
                           kwargs["max_tokens"], kwargs["reasoning"], kwargs["triggers"], 0, True,
                           Sampling(kwargs["temperature"], kwargs["top_p"]), False, kwargs["raw"], kwargs["closing"],
                           {})
        check_context(backend, reqs)
        strat.check(backend, reqs)

    @app.post("/v1/chat/completions", response_model=None)
    async def chat(request: Request, req: ChatRequest) -> Any:
        if (missing := check_model(req)) is not None:
            return missing
        strategy, constraint, tools = chat_constraint(req, cfg.strategy, cfg.answer)
        messages: list[dict[str, str]] = [{"role": m.role, "content": m.text()} for m in req.messages]
        if tools is not None:
            messages = with_tools_prompt(messages, tools_prompt(tools, req.tools or []))
        kwargs = plan_kwargs(req, strategy, constraint, raw=False)
        free_text = constraint is None or (tools is not None and tools.text_allowed and strategy == "constrained")
        top = req.top_logprobs or 0
        hooks = [hooks_of(req, free_text, req.logprobs, top) for _ in range(req.n)]
        refuse_unhookable(strategy, hooks[0])
        precheck(messages, kwargs)
        separated = constraint is not None and getattr(get_strategy(strategy), "constrained_answer", False)
        if req.stream and tools is None and req.n == 1 and _streams(backend, strategy):
            live = _live(batcher, cfg, messages, kwargs, req, hooks[0], separated, req.model or names[0])
            first = await anext(live)  # the first token, or a refusal as a 400 before the stream starts
            return StreamingResponse(_then(first, live), media_type="text/event-stream")
        results = await run_all(request, req, messages, kwargs, hooks)
        if isinstance(results, JSONResponse):
            return results
        body = out.envelope("chat.completion", req.model or names[0], results)
        body["choices"] = [_choice(k, r, h, tools, backend) for k, (r, h) in enumerate(zip(results, hooks,
                                                                                             strict=True))]
        if req.stream:
            return StreamingResponse(out.chat_chunks(body), media_type="text/event-stream",
                                     headers=out.headers(results[0]))
        return JSONResponse(body, headers=out.headers(results[0]))

    @app.post("/v1/completions", response_model=None)
    async def completions(request: Request, req: CompletionRequest) -> Any:
        if (missing := check_model(req)) is not None:
            return missing
        if isinstance(req.prompt, list) and len(req.prompt) != 1:
            raise ConfigError("prompt: give one prompt per request (use n for several choices)")
        if req.echo:
            raise ConfigError("echo: not supported by formtax serve")
        prompt = req.prompt if isinstance(req.prompt, str) else req.prompt[0]
        opts = req.formtax
        answer = opts.answer if opts and opts.answer else None
        strategy = (opts.strategy if opts and opts.strategy else ("constrained" if answer else "free"))
        kwargs = plan_kwargs(req, strategy, answer, raw=True)
        hooks = [hooks_of(req, answer is None, req.logprobs is not None, req.logprobs or 0) for _ in range(req.n)]
        refuse_unhookable(strategy, hooks[0])
        precheck(prompt, kwargs)
        results = await run_all(request, req, prompt, kwargs, hooks)
        if isinstance(results, JSONResponse):
            return results
        body = out.envelope("text_completion", req.model or names[0], results)
        body["choices"] = [{"index": k, "text": cut_at_stop(out.content(r) or "", h.stops), "finish_reason":
                            out.finish(r), "logprobs": out.text_logprobs(backend.tokenizer, h.recorded)
                            if h.logprobs else None} for k, (r, h) in enumerate(zip(results, hooks, strict=True))]
        if req.stream:
            return StreamingResponse(out.text_chunks(body), media_type="text/event-stream")
        return body

    return app


def _choice(index: int, res: Result, hooks: RequestHooks, tools: ToolPlan | None, backend: Backend
            ) -> dict[str, Any]:
    """One chat choice: the content (cut at a stop string), the separated reasoning, tool calls, logprobs."""
    text = out.content(res)
    message: dict[str, Any] = {"role": "assistant", "content": cut_at_stop(text, hooks.stops) if text else text}
    if out.reasoning(res) is not None:
        message["reasoning_content"] = out.reasoning(res)
    finish = out.finish(res)
    if tools is not None and res.parse_ok:
        calls = read_calls(text, res.parsed)
        if calls:
            message["tool_calls"] = calls
            message["content"] = None
            # a call that ran into the budget says so, as OpenAI does: never a complete ``tool_calls``
            finish = "length" if finish == "length" else "tool_calls"
    return {"index": index, "message": message, "finish_reason": finish,
            "logprobs": out.chat_logprobs(backend.tokenizer, hooks.recorded) if hooks.logprobs else None,
            "formtax": out.extension(res)}


def _streams(backend: Backend, strategy: str) -> bool:
    """Whether a request can stream live: a single-pass strategy on a step-wise backend."""
    return isinstance(get_strategy(strategy), SinglePass) and Capability.STEP_LOGITS in backend.capabilities


async def _live(batcher: Batcher, cfg: ServeConfig, messages: Prompt, kwargs: dict[str, Any], req: ChatRequest,
                hooks: RequestHooks, separated: bool, model: str) -> AsyncIterator[str]:
    """OpenAI chat chunks as the row decodes in its batch: reasoning phases as ``reasoning_content`` deltas when
    the strategy separates them, everything else as ``content`` (held back at a possible stop string), then the
    finish reason, usage and the formtax object. Closing the stream (the client went away) cancels the row."""
    q: queue.Queue[Any] = queue.Queue()
    hooks.sink = lambda t, ph: q.put((t, ph))
    key = tuple((k, v.describe() if isinstance(v, Constraint) else repr(v)) for k, v in sorted(kwargs.items()))
    job = batcher.submit(messages, key, fresh_seed() if req.seed is None else req.seed, hooks, **kwargs)

    def done(fut: Any) -> None:
        if not fut.cancelled():
            q.put(fut.exception() or fut.result())
        q.put(END)

    job.future.add_done_callback(done)
    parts = deltas(batcher.backend.tokenizer, q)
    base = out.chunk_base(model)
    cutter = out.StopCutter(hooks.stops)
    started = time.monotonic()
    role = out.sse(base | {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                         "finish_reason": None}]})
    try:
        while True:
            left = cfg.timeout_s - (time.monotonic() - started)
            try:
                part = await asyncio.wait_for(asyncio.to_thread(next, parts, None), max(left, 0.001))
            except TimeoutError:
                yield out.sse({"error": {"message": f"the request did not finish within {cfg.timeout_s:g} s",
                                         "type": "timeout", "param": None, "code": None}})
                return
            if role:
                yield role
                role = ""
            if part is None:
                return
            if isinstance(part, Result):
                tail = cutter.flush()
                if tail:
                    yield out.sse(base | {"choices": [{"index": 0, "delta": {"content": tail},
                                                        "finish_reason": None}]})
                lp = out.chat_logprobs(batcher.backend.tokenizer, hooks.recorded) if hooks.logprobs else None
                yield out.sse(base | {"choices": [{"index": 0, "delta": {}, "finish_reason": out.finish(part),
                                                    "logprobs": lp}],
                                      "usage": out.envelope("chat.completion", model, [part])["usage"],
                                      "formtax": out.extension(part)})
                yield "data: [DONE]\n\n"
                return
            assert isinstance(part, Delta)
            if separated and part.phase in (Phase.REASONING, Phase.RC):
                if part.text:
                    yield out.sse(base | {"choices": [{"index": 0, "delta": {"reasoning_content": part.text},
                                                        "finish_reason": None}]})
                continue
            text = cutter.feed(part.text)
            if text:
                yield out.sse(base | {"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]})
    finally:
        batcher.cancel(job)  # a no-op when it finished; otherwise its row leaves the batch


async def _then(first: str, rest: AsyncIterator[str]) -> AsyncIterator[str]:
    yield first
    async for chunk in rest:
        yield chunk


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
