"""OpenAI's Responses API (``POST /v1/responses``), in the shape of vLLM's ``OpenAIServingResponses``:
:class:`ResponsesServing` re-words a Responses request as a chat request
(:meth:`~formtax.serve.responses_protocol.ResponsesRequest.to_chat`), serves it with chat's serving (so a request
gives the same answer through either API) and words chat's body as a Response object (:class:`ResponseBuilder`) or
chat's chunks as the Responses stream's typed events (:class:`ResponsesStream`).

* Output items: a ``reasoning`` item (its text as ``reasoning_text`` content, when the strategy separates reasoning;
  no summary and no encrypted content), a ``message`` with one ``output_text``, or ``function_call`` items.
  A response whose budget ran out is ``incomplete`` (``max_output_tokens``), never ``completed``.
* The stream: ``response.created`` and ``response.in_progress``, each output item opened, its deltas, closed, then
  ``response.completed`` (or ``response.incomplete``, or an ``error`` event); ``event:`` and ``data:`` lines per
  event and no ``[DONE]`` (:func:`sse_events`).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from enum import StrEnum
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse
from pydantic import ValidationError

from formtax.errors import ConfigError
from formtax.serve import shapes as out
from formtax.serve.config import ServeConfig
from formtax.serve.errors import validation_message
from formtax.serve.responses_protocol import ResponsesRequest
from formtax.serve.serving import Outcome
from formtax.serve.serving_chat import ChatServing
from formtax.serve.shapes import FinishReason


class ResponseStatus(StrEnum):
    """The ``status`` of a Response and of its output items."""

    IN_PROGRESS = "in_progress"
    COMPLETED = "completed"
    INCOMPLETE = "incomplete"  # the budget ran out (``incomplete_details.reason: max_output_tokens``)


def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def _usage(chat_usage: dict[str, Any]) -> dict[str, Any]:
    details = chat_usage.get("completion_tokens_details") or {}
    return {"input_tokens": chat_usage["prompt_tokens"],
            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": chat_usage["completion_tokens"],
            "output_tokens_details": {"reasoning_tokens": details.get("reasoning_tokens", 0)},
            "total_tokens": chat_usage["total_tokens"]}


def _logprobs(chat: dict[str, Any] | None) -> list[dict[str, Any]]:
    if not chat:
        return []
    return [{"token": e["token"], "logprob": e["logprob"], "bytes": e["bytes"],
             "top_logprobs": [{"token": t["token"], "logprob": t["logprob"], "bytes": t["bytes"]}
                              for t in e.get("top_logprobs", [])]} for e in chat.get("content", [])]


def reasoning_item(item_id: str, text: str, status: ResponseStatus) -> dict[str, Any]:
    return {"type": "reasoning", "id": item_id, "summary": [], "status": status,
            "content": [{"type": "reasoning_text", "text": text}] if text else []}


def message_item(item_id: str, text: str, status: ResponseStatus, logprobs: list[dict[str, Any]]) -> dict[str, Any]:
    content = [{"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs}] if text or \
        status == ResponseStatus.COMPLETED else []
    return {"type": "message", "id": item_id, "status": status, "role": "assistant", "content": content}


def call_item(item_id: str, call_id: str, name: str | None, arguments: str, status: ResponseStatus
              ) -> dict[str, Any]:
    return {"type": "function_call", "id": item_id, "call_id": call_id, "name": name, "arguments": arguments,
            "status": status}


class ResponseBuilder:
    """One Response object, from a finished chat body or (through :class:`ResponsesStream`) from the chunks of a
    stream: the same fields either way."""

    def __init__(self, req: ResponsesRequest, model: str, temperature: float = 1.0) -> None:
        self.req, self.model = req, model
        self.temperature = temperature  # the server's default (``--temperature``), echoed when none was sent
        self.id, self.created = _id("resp"), int(time.time())

    def snapshot(self, status: ResponseStatus, output: list[dict[str, Any]], usage: dict[str, Any] | None = None,
                 formtax: dict[str, Any] | None = None) -> dict[str, Any]:
        r = self.req
        return {"id": self.id, "object": "response", "created_at": self.created, "status": status,
                "model": self.model, "output": output, "error": None,
                "incomplete_details": ({"reason": "max_output_tokens"} if status == ResponseStatus.INCOMPLETE
                                       else None),
                "instructions": r.instructions, "max_output_tokens": r.max_output_tokens,
                "parallel_tool_calls": r.parallel_tool_calls is not False, "previous_response_id": None,
                "reasoning": r.reasoning or {"effort": None, "summary": None}, "store": False,
                "temperature": self.temperature if r.temperature is None else r.temperature,
                "top_p": 1.0 if r.top_p is None else r.top_p, "text": r.text or {"format": {"type": "text"}},
                "tool_choice": r.tool_choice or "auto", "tools": r.tools or [], "truncation": "disabled",
                "metadata": r.metadata or {}, "usage": None if usage is None else _usage(usage),
                "formtax": formtax}

    @staticmethod
    def status(finish: str | None) -> ResponseStatus:
        """A Response's status for chat's finish reason."""
        return ResponseStatus.INCOMPLETE if finish == FinishReason.LENGTH else ResponseStatus.COMPLETED

    def from_chat(self, body: dict[str, Any]) -> dict[str, Any]:
        """The Response of a finished chat completion (its first choice)."""
        choice = body["choices"][0]
        msg = choice["message"]
        done = ResponseStatus.COMPLETED
        output: list[dict[str, Any]] = []
        if msg.get("reasoning_content"):
            output.append(reasoning_item(_id("rs"), msg["reasoning_content"], done))
        for call in msg.get("tool_calls") or ():
            output.append(call_item(_id("fc"), call["id"], call["function"]["name"], call["function"]["arguments"],
                                    done))
        if msg.get("content") is not None and not msg.get("tool_calls"):
            output.append(message_item(_id("msg"), msg["content"], done, _logprobs(choice.get("logprobs"))))
        return self.snapshot(self.status(choice["finish_reason"]), output, body["usage"], choice.get("formtax"))


class ResponsesStream:
    """The Responses stream's events for chat's chunks (module docstring); one object per stream, since the events
    are numbered and each output item is closed when the next one opens."""

    def __init__(self, builder: ResponseBuilder) -> None:
        self.builder = builder
        self.seq = 0
        self.output: list[dict[str, Any]] = []
        self.texts: list[str] = []  # per output item: its text or arguments so far

    def event(self, kind: str, **fields: Any) -> dict[str, Any]:
        self.seq += 1
        return {"type": kind, "sequence_number": self.seq - 1, **fields}

    def close(self, i: int) -> list[dict[str, Any]]:
        """The events that close output item ``i``, its whole text in them."""
        item, text = self.output[i], self.texts[i]
        item["status"] = ResponseStatus.COMPLETED
        done: list[dict[str, Any]] = []
        if item["type"] == "message":
            item["content"] = [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]
            done += [self.event("response.output_text.done", item_id=item["id"], output_index=i, content_index=0,
                                text=text, logprobs=[]),
                     self.event("response.content_part.done", item_id=item["id"], output_index=i, content_index=0,
                                part=item["content"][0])]
        elif item["type"] == "reasoning":
            item["content"] = [{"type": "reasoning_text", "text": text}]
            done.append(self.event("response.reasoning_text.done", item_id=item["id"], output_index=i,
                                   content_index=0, text=text))
        else:
            item["arguments"] = text
            done.append(self.event("response.function_call_arguments.done", item_id=item["id"], output_index=i,
                                   name=item["name"], arguments=text))
        return [*done, self.event("response.output_item.done", output_index=i, item=item)]

    def open(self, item: dict[str, Any]) -> list[dict[str, Any]]:
        """The events that close the item before (if any) and open ``item``."""
        opened = self.close(len(self.output) - 1) if self.output else []
        self.output.append(item)
        self.texts.append("")
        i = len(self.output) - 1
        opened.append(self.event("response.output_item.added", output_index=i, item=json.loads(json.dumps(item))))
        if item["type"] == "message":
            opened.append(self.event("response.content_part.added", item_id=item["id"], output_index=i,
                                     content_index=0, part={"type": "output_text", "text": "", "annotations": [],
                                                            "logprobs": []}))
        return opened

    @staticmethod
    def pieces(delta: dict[str, Any]) -> list[tuple[str, str, dict[str, Any] | None]]:
        """A chat delta's pieces: (the item type, its text, the item it opens if it starts one)."""
        going = ResponseStatus.IN_PROGRESS
        pieces: list[tuple[str, str, dict[str, Any] | None]] = []
        if delta.get("reasoning_content"):
            pieces.append(("reasoning", delta["reasoning_content"], reasoning_item(_id("rs"), "", going)))
        for tc in delta.get("tool_calls") or ():
            fn = tc.get("function") or {}
            new = call_item(_id("fc"), tc["id"], fn.get("name"), "", going) if tc.get("id") else None
            pieces.append(("function_call", fn.get("arguments") or "", new))
        if delta.get("content"):
            pieces.append(("message", delta["content"], message_item(_id("msg"), "", going, [])))
        return pieces

    def delta(self, kind: str, text: str) -> dict[str, Any]:
        """The delta event of ``text`` added to the last output item (of type ``kind``)."""
        i = len(self.output) - 1
        self.texts[i] += text
        item_id = self.output[i]["id"]
        if kind == "message":
            return self.event("response.output_text.delta", item_id=item_id, output_index=i, content_index=0,
                              delta=text, logprobs=[])
        if kind == "reasoning":
            return self.event("response.reasoning_text.delta", item_id=item_id, output_index=i, content_index=0,
                              delta=text)
        return self.event("response.function_call_arguments.delta", item_id=item_id, output_index=i, delta=text)

    async def events(self, chunks: AsyncIterator[dict[str, Any]]) -> AsyncIterator[dict[str, Any]]:
        """Every event of the stream, for chat's ``chunks``."""
        finish, usage, formtax = None, None, None
        yield self.event("response.created", response=self.builder.snapshot(ResponseStatus.IN_PROGRESS, []))
        yield self.event("response.in_progress", response=self.builder.snapshot(ResponseStatus.IN_PROGRESS, []))
        async for chunk in chunks:
            if "error" in chunk:
                err = chunk["error"]
                yield self.event("error", code=err.get("type"), message=err.get("message"), param=err.get("param"))
                return
            if chunk.get("choices") == []:
                usage = chunk.get("usage")
                continue
            choice = chunk["choices"][0]
            if choice.get("finish_reason") is not None:
                finish, formtax = choice["finish_reason"], chunk.get("formtax")
            for kind, text, new in self.pieces(choice.get("delta") or {}):
                if new is not None and (not self.output or self.output[-1]["type"] != kind
                                        or kind == "function_call"):
                    for e in self.open(new):
                        yield e
                if text:
                    yield self.delta(kind, text)
        if self.output:
            for e in self.close(len(self.output) - 1):
                yield e
        status = self.builder.status(finish)
        yield self.event(f"response.{status}", response=self.builder.snapshot(status, self.output, usage, formtax))


def sse_events(events: AsyncIterator[dict[str, Any]]) -> AsyncIterator[str]:
    """The Responses stream's wire form: ``event: <type>`` and ``data: <json>`` per event (no ``[DONE]``)."""

    async def gen() -> AsyncIterator[str]:
        async for e in events:
            yield f"event: {e['type']}\ndata: {json.dumps(e)}\n\n"

    return gen()


class ResponsesServing:
    """``/v1/responses`` (module docstring): chat's serving underneath, its results worded as the Responses API's."""

    def __init__(self, chat: ChatServing, cfg: ServeConfig) -> None:
        self.chat, self.cfg = chat, cfg

    async def create(self, request: Request, req: ResponsesRequest) -> Outcome | JSONResponse:
        """A Response (``body``) or the Responses stream's events (``chunks``), or chat's error response."""
        try:
            as_chat = req.to_chat()
        except ValidationError as e:
            raise ConfigError(validation_message(e.errors())[0]) from None
        outcome = await self.chat.create(request, as_chat)
        if isinstance(outcome, JSONResponse):
            return outcome
        builder = ResponseBuilder(req, self.chat.model_name(as_chat), self.cfg.temperature)
        if outcome.chunks is not None:
            return Outcome(chunks=ResponsesStream(builder).events(outcome.chunks), headers=outcome.headers)
        assert outcome.body is not None
        return Outcome(builder.from_chat(outcome.body), headers=outcome.headers)

    @staticmethod
    def retrieve(response_id: str) -> JSONResponse:
        """``GET /v1/responses/{id}``: formtax stores no responses, so always a 404 that says so."""
        return out.error(404, f"formtax serve stores no responses ({response_id}); keep the response you were sent",
                         code="not_found")
