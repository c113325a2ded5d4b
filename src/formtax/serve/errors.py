"""Every error of ``formtax serve`` in OpenAI's shape (``{"error": {"message", "type", "param", "code"}}``), as
exception handlers installed on the app (:func:`install_error_handlers`), so no route words an error of its own:

* a malformed or unsupported field: 400 with one line that names the field (a vLLM field formtax has no
  equivalent for says what to send instead);
* a :class:`~formtax.errors.FormtaxError`: 400 (``context_length_exceeded`` for a prompt over the context), 401
  for a missing or wrong key, 413 for a body over the limit, 429 with ``Retry-After`` for a full queue;
* an unknown route or a wrong method: 404 / 405 (FastAPI's own is ``{"detail": ...}``);
* a fault of formtax's own: a 500 whose message carries a reference into the server's log, never the exception's
  text (it can hold paths, code or another request's data).

The handlers read the server's metrics from ``request.app.state`` (the routes do the same with the serving objects).
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from formtax.errors import ContextLengthError, FormtaxError
from formtax.serve import shapes as out
from formtax.serve.batcher import QueueFull
from formtax.serve.limits import BodyTooLarge
from formtax.serve.metrics import ServerMetrics
from formtax.serve.vllm_fields import no_equivalent

log = logging.getLogger(__name__)


class Unauthorized(FormtaxError):
    """A request without the server's key (HTTP 401)."""


def one_line(message: str) -> str:
    """An error message on one line, every line of it kept (an engine's multi-line reason says where)."""
    return " ".join(line.strip() for line in message.splitlines() if line.strip())


def validation_message(errors: list[Any]) -> tuple[str, str | None]:
    """One line for a request's first validation error, and the field it names."""
    first = errors[0] if errors else {}
    where = ".".join(str(x) for x in first.get("loc", ()) if x != "body")
    msg = "not supported by formtax serve" if first.get("type") == "extra_forbidden" else \
        str(first.get("msg", "invalid request")).removeprefix("Value error, ")
    return (f"{where}: {msg}" if where else msg), (where or None)


def _metrics(request: Request) -> ServerMetrics:
    metrics: ServerMetrics = request.app.state.metrics
    return metrics


def _prompt_field(path: str) -> str:
    """The field that holds a route's prompt (a context-length refusal names it)."""
    if path.endswith("/completions") and "/chat/" not in path:
        return "prompt"
    return "input" if path.endswith("/responses") else "messages"


async def invalid_request(request: Request, exc: Exception) -> JSONResponse:
    """A body FastAPI could not validate against the route's request model."""
    assert isinstance(exc, RequestValidationError)
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


async def refused(request: Request, exc: Exception) -> JSONResponse:
    """formtax's own refusals (module docstring)."""
    assert isinstance(exc, FormtaxError)
    if isinstance(exc, ContextLengthError):
        return out.error(400, str(exc), _prompt_field(request.url.path), code="context_length_exceeded")
    if isinstance(exc, Unauthorized):
        return out.error(401, str(exc), code="invalid_api_key")
    if isinstance(exc, BodyTooLarge):
        return out.error(413, str(exc), code="request_too_large")
    if isinstance(exc, QueueFull):
        _metrics(request).refused()
        return out.error(429, str(exc), kind="rate_limit_error", code="rate_limit_exceeded",
                         headers={"Retry-After": str(out.RETRY_AFTER_S)})
    return out.error(400, one_line(str(exc)))


async def http_error(request: Request, exc: Exception) -> JSONResponse:
    """Unknown routes and wrong methods in OpenAI's error shape (FastAPI's own is ``{"detail": ...}``)."""
    assert isinstance(exc, StarletteHTTPException)
    path = request.url.path
    if isinstance(exc.__cause__, BodyTooLarge):  # a chunked body crossed the limit while FastAPI read it
        return out.error(413, str(exc.__cause__), code="request_too_large")
    if exc.status_code == 404:
        message = (f"formtax serves no embedding model ({path}); it serves chat and text completions"
                   if path.rstrip("/").endswith("/embeddings") else f"unknown route: {request.method} {path}")
        return out.error(404, message, code="not_found")
    return out.error(exc.status_code, f"{request.method} {path}: {exc.detail}",
                     code="method_not_allowed" if exc.status_code == 405 else None)


async def server_fault(request: Request, exc: Exception) -> JSONResponse:
    """A fault of formtax's own: this request's 500, logged with an id the message gives; the exception's text
    stays in the log."""
    ref = uuid.uuid4().hex[:12]
    log.error("request %s %s failed (ref %s)", request.method, request.url.path, ref, exc_info=exc)
    _metrics(request).faulted()
    return out.error(500, f"the server failed on this request (ref {ref} in the server's log)", kind="server_error")


def install_error_handlers(app: FastAPI) -> None:
    """Every handler of this module on ``app``."""
    app.add_exception_handler(RequestValidationError, invalid_request)
    app.add_exception_handler(FormtaxError, refused)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(Exception, server_fault)
