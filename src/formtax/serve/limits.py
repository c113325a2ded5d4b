"""The request-body limit of ``formtax serve``: a body over the limit is answered 413 in OpenAI's error shape
before it is parsed (read at most to the limit), so one oversized request can neither hold the event loop while a
parser reads megabytes nor keep their memory.

A pure ASGI middleware, not Starlette's ``BaseHTTPMiddleware`` (whose wrapper hides a client's disconnect from the
route). A body with ``Content-Length`` over the limit is refused without being parsed or kept (its bytes are read
and dropped as they arrive, so the client, still sending, gets the 413); a chunked one is counted as it arrives
and refused where it crosses the limit.
"""

from __future__ import annotations

import json
from typing import Any

from formtax.errors import FormtaxError

BYTES_PER_CONTEXT_TOKEN = 64
BODY_HEADROOM = 1 << 20


def default_body_limit(context_length: int | None) -> int:
    """The default limit, sized from the model's context: ``64`` bytes per context token (the longest prompt the
    model can take, as JSON-escaped text with room to spare) plus 1 MiB for schemas, tools and other fields;
    16 MiB when the context is unknown."""
    return 16 << 20 if context_length is None else BYTES_PER_CONTEXT_TOKEN * context_length + BODY_HEADROOM


class BodyTooLarge(FormtaxError):
    """A request body over the server's limit (HTTP 413)."""

    def __init__(self, limit: int, size: int | None = None) -> None:
        got = f"{size} bytes" if size is not None else f"more than {limit} bytes"
        super().__init__(f"the request body is {got}; this server takes at most {limit} (--max-body-bytes)")


def _error_body(exc: BodyTooLarge) -> bytes:
    return json.dumps({"error": {"message": str(exc), "type": "invalid_request_error", "param": None,
                                 "code": "request_too_large"}}).encode()


class BodyLimit:
    """ASGI middleware: 413 for a body over ``limit`` bytes (module docstring)."""

    def __init__(self, app: Any, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            await self._drain(receive)
            await self._refuse(send, BodyTooLarge(self.limit, int(declared)))
            return
        seen = 0

        async def counted() -> dict[str, Any]:
            nonlocal seen
            message: dict[str, Any] = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    raise BodyTooLarge(self.limit)  # the app's handler answers it (413)
            return message

        await self.app(scope, counted, send)

    @staticmethod
    async def _drain(receive: Any) -> None:
        """Read the body and drop it, chunk by chunk (nothing is kept): most clients read no response before
        they have sent their whole body, and a connection closed under them loses the 413."""
        while True:
            message = await receive()
            if message["type"] != "http.request" or not message.get("more_body"):
                return

    @staticmethod
    async def _refuse(send: Any, exc: BodyTooLarge) -> None:
        body = _error_body(exc)
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
