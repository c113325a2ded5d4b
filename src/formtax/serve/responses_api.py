"""OpenAI's Responses API (``POST /v1/responses``) over chat's serving: a Responses request is re-worded as a chat
request (:meth:`ResponsesRequest.to_chat`), served by :class:`~formtax.serve.serving_chat.ChatServing`, and its
body or chunks are re-worded as a Response object or the Responses stream's typed events.

What maps to what (the rest of formtax serve's behaviour is chat's):

* ``input`` (a string, or items: messages with ``input_text`` / ``output_text`` parts, ``function_call`` and
  ``function_call_output``) and ``instructions`` (a system message first) are the chat messages. A ``reasoning``
  item a client sends back is dropped: formtax keeps no reasoning state between requests.
* ``text.format`` (``json_schema`` with ``strict``, ``json_object``, ``text``) is ``response_format``; function
  ``tools`` (flat, as the Responses API writes them) and ``tool_choice`` are chat's tools; ``reasoning.effort`` is
  ``reasoning_effort``; ``max_output_tokens`` is ``max_completion_tokens``; ``top_logprobs`` turns logprobs on.
* Output items: a ``reasoning`` item (its text as ``reasoning_text`` content, when the strategy separates reasoning;
  no summary and no encrypted content), a ``message`` with one ``output_text``, or ``function_call`` items.
  A response whose budget ran out is ``incomplete`` (``max_output_tokens``), never ``completed``.
* Stateless: nothing is stored. ``previous_response_id``, ``conversation`` and ``background: true`` are refused with
  what to send instead; ``store`` is accepted and stores nothing (``GET /v1/responses/{id}`` is a 404).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any, Literal

from pydantic import BaseModel, Field

from formtax.errors import ConfigError
from formtax.serve.schema import ChatRequest, FormtaxOptions, OpenAIBody


def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


class ResponsesRequest(OpenAIBody):
    """The request body of ``/v1/responses`` (module docstring); a field sent as null is unset."""

    model: str | None = None
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    text: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    reasoning: dict[str, Any] | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = None
    top_p: float | None = None
    top_logprobs: int | None = None
    stream: bool = False
    formtax: FormtaxOptions | None = None
    # stateful: refused unless off
    previous_response_id: str | None = None
    conversation: str | dict[str, Any] | None = None
    background: bool | None = None
    # accepted because they do not change the output
    store: bool | None = None
    metadata: dict[str, Any] | None = None
    user: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    service_tier: str | None = None
    truncation: Literal["disabled", "auto"] | None = None
    include: list[str] | None = None
    stream_options: dict[str, Any] | None = None

    def to_chat(self) -> ChatRequest:
        """The chat request this one is (module docstring); a refusal names what to send instead."""
        if self.previous_response_id is not None or self.conversation is not None:
            raise ConfigError("previous_response_id / conversation: formtax serve keeps no responses; send the "
                              "whole conversation in input")
        if self.background:
            raise ConfigError("background: formtax serve answers in the request; send stream: true to follow it")
        body: dict[str, Any] = {"messages": self._messages(), "stream": self.stream}
        for src, dst in (("model", "model"), ("temperature", "temperature"), ("top_p", "top_p"),
                         ("max_output_tokens", "max_completion_tokens"), ("parallel_tool_calls", "parallel_tool_calls"),
                         ("metadata", "metadata"), ("user", "user"), ("prompt_cache_key", "prompt_cache_key"),
                         ("service_tier", "service_tier"), ("formtax", "formtax")):
            value = getattr(self, src)
            if value is not None:
                body[dst] = value.model_dump(exclude_none=True) if isinstance(value, BaseModel) else value
        if self.top_logprobs is not None:
            body["logprobs"], body["top_logprobs"] = True, self.top_logprobs
        if self.reasoning and self.reasoning.get("effort") is not None:
            body["reasoning_effort"] = self.reasoning["effort"]
        fmt = (self.text or {}).get("format")
        if fmt is not None:
            kind = fmt.get("type")
            if kind == "json_schema":
                body["response_format"] = {"type": "json_schema", "json_schema": {
                    k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}}
            elif kind in ("json_object", "text"):
                body["response_format"] = {"type": kind}
            else:
                raise ConfigError(f"text.format.type must be text, json_object or json_schema, got {kind!r}")
        if self.tools:
            body["tools"] = [self._tool(t) for t in self.tools]
        if self.tool_choice is not None:
            body["tool_choice"] = self._choice(self.tool_choice)
        chat = ChatRequest.model_validate(body)
        chat._format_field = "text.format"  # refusals name the field this client sent
        return chat

    @staticmethod
    def _tool(t: dict[str, Any]) -> dict[str, Any]:
        if t.get("type") != "function":
            raise ConfigError(f"tools: {t.get('type')!r} is one of OpenAI's hosted tools; formtax serve calls "
                              "function tools (type function)")
        fn = {k: t[k] for k in ("name", "description", "parameters", "strict") if t.get(k) is not None}
        return {"type": "function", "function": fn}

    @staticmethod
    def _choice(choice: str | dict[str, Any]) -> str | dict[str, Any]:
        if isinstance(choice, str):
            return choice
        if choice.get("type") == "function":
            return {"type": "function", "function": {"name": choice.get("name")}}
        raise ConfigError(f"tool_choice: {choice.get('type')!r} is not served; use auto, none, required or "
                          '{"type": "function", "name": ...}')

    def _messages(self) -> list[dict[str, Any]]:
        messages: list[dict[str, Any]] = []
        if self.instructions:
            messages.append({"role": "system", "content": self.instructions})
        if isinstance(self.input, str):
            return [*messages, {"role": "user", "content": self.input}]
        for k, item in enumerate(self.input):
            kind = item.get("type", "message")
            if kind == "message":
                messages.append({"role": item.get("role", "user"), "content": _text(item.get("content"), k)})
            elif kind == "function_call":
                call = {"id": item.get("call_id"), "type": "function",
                        "function": {"name": item.get("name"), "arguments": item.get("arguments", "{}")}}
                last = messages[-1] if messages else None
                if last is not None and last["role"] == "assistant" and last.get("tool_calls"):
                    last["tool_calls"].append(call)
                else:
                    messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
            elif kind == "function_call_output":
                messages.append({"role": "tool", "tool_call_id": item.get("call_id"),
                                 "content": _text(item.get("output"), k)})
            elif kind != "reasoning":
                raise ConfigError(f"input[{k}]: items of type {kind!r} are not supported (messages, function_call "
                                  "and function_call_output)")
        return messages


def _text(content: Any, k: int) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    parts = []
    for p in content:
        if p.get("type") not in ("input_text", "output_text", "text"):
            raise ConfigError(f"input[{k}]: content parts of type {p.get('type')!r} are not supported (text only)")
        parts.append(str(p.get("text", "")))
    return "".join(parts)


def _usage(chat_usage: dict[str, Any]) -> dict[str, Any]:
    details = chat_usage.get("completion_tokens_details") or {}
    return {"input_tokens": chat_usage["prompt_tokens"],
            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": chat_usage["completion_tokens"],
            "output_tokens_details": {"reasoning_tokens": details.get("reasoning_tokens", 0)},
            "total_tokens": chat_usage["total_tokens"]}


class ResponseBuilder:
    """One Response object, from a finished chat body or from the chunks of a stream (the same fields either way)."""

    def __init__(self, req: ResponsesRequest, model: str, temperature: float = 1.0) -> None:
        self.req, self.model = req, model
        self.temperature = temperature  # the server's default (``--temperature``), echoed when none was sent
        self.id, self.created = _id("resp"), int(time.time())

    def snapshot(self, status: str, output: list[dict[str, Any]], usage: dict[str, Any] | None = None,
                 formtax: dict[str, Any] | None = None) -> dict[str, Any]:
        r = self.req
        return {"id": self.id, "object": "response", "created_at": self.created, "status": status,
                "model": self.model, "output": output, "error": None,
                "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
                "instructions": r.instructions, "max_output_tokens": r.max_output_tokens,
                "parallel_tool_calls": r.parallel_tool_calls is not False, "previous_response_id": None,
                "reasoning": r.reasoning or {"effort": None, "summary": None}, "store": False,
                "temperature": self.temperature if r.temperature is None else r.temperature,
                "top_p": 1.0 if r.top_p is None else r.top_p, "text": r.text or {"format": {"type": "text"}},
                "tool_choice": r.tool_choice or "auto", "tools": r.tools or [], "truncation": "disabled",
                "metadata": r.metadata or {}, "usage": None if usage is None else _usage(usage),
                "formtax": formtax}

    @staticmethod
    def status(finish: str | None) -> str:
        return "incomplete" if finish == "length" else "completed"

    def from_chat(self, body: dict[str, Any]) -> dict[str, Any]:
        choice = body["choices"][0]
        msg = choice["message"]
        output: list[dict[str, Any]] = []
        if msg.get("reasoning_content"):
            output.append(reasoning_item(_id("rs"), msg["reasoning_content"], "completed"))
        for call in msg.get("tool_calls") or ():
            output.append(call_item(_id("fc"), call["id"], call["function"]["name"], call["function"]["arguments"],
                                    "completed"))
        if msg.get("content") is not None and not msg.get("tool_calls"):
            output.append(message_item(_id("msg"), msg["content"], "completed", _logprobs(choice.get("logprobs"))))
        return self.snapshot(self.status(choice["finish_reason"]), output, body["usage"], choice.get("formtax"))

    async def events(self, chunks: AsyncIterator[dict[str, Any]]) -> AsyncIterator[dict[str, Any]]:
        """The Responses stream's events for chat's chunks: created, in_progress, each output item opened, its
        deltas, closed, then completed (or incomplete, or an error event)."""
        seq = 0
        output: list[dict[str, Any]] = []
        texts: list[str] = []  # per output item: its text or arguments so far
        finish, usage, formtax = None, None, None

        def event(kind: str, **fields: Any) -> dict[str, Any]:
            nonlocal seq
            seq += 1
            return {"type": kind, "sequence_number": seq - 1, **fields}

        def close(i: int) -> list[dict[str, Any]]:
            item, text = output[i], texts[i]
            item["status"] = "completed"
            done: list[dict[str, Any]] = []
            if item["type"] == "message":
                item["content"] = [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]
                done += [event("response.output_text.done", item_id=item["id"], output_index=i, content_index=0,
                               text=text, logprobs=[]),
                         event("response.content_part.done", item_id=item["id"], output_index=i, content_index=0,
                               part=item["content"][0])]
            elif item["type"] == "reasoning":
                item["content"] = [{"type": "reasoning_text", "text": text}]
                done.append(event("response.reasoning_text.done", item_id=item["id"], output_index=i,
                                  content_index=0, text=text))
            else:
                item["arguments"] = text
                done.append(event("response.function_call_arguments.done", item_id=item["id"], output_index=i,
                                  name=item["name"], arguments=text))
            return [*done, event("response.output_item.done", output_index=i, item=item)]

        def open_item(item: dict[str, Any]) -> list[dict[str, Any]]:
            opened = close(len(output) - 1) if output else []
            output.append(item)
            texts.append("")
            i = len(output) - 1
            opened.append(event("response.output_item.added", output_index=i, item=json.loads(json.dumps(item))))
            if item["type"] == "message":
                opened.append(event("response.content_part.added", item_id=item["id"], output_index=i,
                                    content_index=0, part={"type": "output_text", "text": "", "annotations": [],
                                                           "logprobs": []}))
            return opened

        yield event("response.created", response=self.snapshot("in_progress", []))
        yield event("response.in_progress", response=self.snapshot("in_progress", []))
        async for chunk in chunks:
            if "error" in chunk:
                err = chunk["error"]
                yield event("error", code=err.get("type"), message=err.get("message"), param=err.get("param"))
                return
            if chunk.get("choices") == []:
                usage = chunk.get("usage")
                continue
            choice = chunk["choices"][0]
            if choice.get("finish_reason") is not None:
                finish, formtax = choice["finish_reason"], chunk.get("formtax")
            delta = choice.get("delta") or {}
            pieces: list[tuple[str, str, dict[str, Any] | None]] = []  # (kind, text, the item it opens)
            if delta.get("reasoning_content"):
                pieces.append(("reasoning", delta["reasoning_content"],
                               reasoning_item(_id("rs"), "", "in_progress")))
            for tc in delta.get("tool_calls") or ():
                fn = tc.get("function") or {}
                new = call_item(_id("fc"), tc["id"], fn.get("name"), "", "in_progress") if tc.get("id") else None
                pieces.append(("function_call", fn.get("arguments") or "", new))
            if delta.get("content"):
                pieces.append(("message", delta["content"], message_item(_id("msg"), "", "in_progress", [])))
            for kind, text, new in pieces:
                if new is not None and (not output or output[-1]["type"] != kind or kind == "function_call"):
                    for e in open_item(new):
                        yield e
                if not text:
                    continue
                i = len(output) - 1
                texts[i] += text
                item_id = output[i]["id"]
                if kind == "message":
                    yield event("response.output_text.delta", item_id=item_id, output_index=i, content_index=0,
                                delta=text, logprobs=[])
                elif kind == "reasoning":
                    yield event("response.reasoning_text.delta", item_id=item_id, output_index=i, content_index=0,
                                delta=text)
                else:
                    yield event("response.function_call_arguments.delta", item_id=item_id, output_index=i,
                                delta=text)
        if output:
            for e in close(len(output) - 1):
                yield e
        status = self.status(finish)
        final = self.snapshot(status, output, usage, formtax)
        yield event(f"response.{status}", response=final)


def reasoning_item(item_id: str, text: str, status: str) -> dict[str, Any]:
    return {"type": "reasoning", "id": item_id, "summary": [], "status": status,
            "content": [{"type": "reasoning_text", "text": text}] if text else []}


def message_item(item_id: str, text: str, status: str, logprobs: list[dict[str, Any]]) -> dict[str, Any]:
    content = [{"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs}] if text or \
        status == "completed" else []
    return {"type": "message", "id": item_id, "status": status, "role": "assistant", "content": content}


def call_item(item_id: str, call_id: str, name: str | None, arguments: str, status: str) -> dict[str, Any]:
    return {"type": "function_call", "id": item_id, "call_id": call_id, "name": name, "arguments": arguments,
            "status": status}


def _logprobs(chat: dict[str, Any] | None) -> list[dict[str, Any]]:
    if not chat:
        return []
    return [{"token": e["token"], "logprob": e["logprob"], "bytes": e["bytes"],
             "top_logprobs": [{"token": t["token"], "logprob": t["logprob"], "bytes": t["bytes"]}
                              for t in e.get("top_logprobs", [])]} for e in chat.get("content", [])]


def sse_events(events: AsyncIterator[dict[str, Any]]) -> AsyncIterator[str]:
    """The Responses stream's wire form: ``event: <type>`` and ``data: <json>`` per event (no ``[DONE]``)."""

    async def gen() -> AsyncIterator[str]:
        async for e in events:
            yield f"event: {e['type']}\ndata: {json.dumps(e)}\n\n"

    return gen()
