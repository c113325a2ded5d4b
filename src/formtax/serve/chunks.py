"""OpenAI's streams, by output format. How one live choice is worded is one class per format: :class:`ChatChunks`
(``chat.completion.chunk``: a role chunk, reasoning and content deltas, tool-call deltas, a finish chunk with
logprobs) and :class:`TextChunks` (``text_completion``: text pieces, a finish chunk). A generation that cannot
stream live sends its finished body as the same chunks (:func:`chat_chunks`, :func:`text_chunks`). The wire form
is :func:`sse_events`. The Responses API's events are chat's chunks re-worded
(:class:`formtax.serve.serving_responses.ResponsesStream`).

:meth:`formtax.serve.serving.Serving.live` drives a choice's row and hands what it decodes to its
:class:`ChoiceChunks`: the row's deltas in order, then its :class:`~formtax.strategies.base.Result`. Splitting the
wording from the driving keeps each format's rules in one place (a stop string is cut from text by the same
:class:`~formtax.serve.shapes.StopCutter` in both; only chat has reasoning and calls).
"""

from __future__ import annotations

import json
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator
from typing import Any

from formtax.decoding.engine import TokenizerInfo
from formtax.decoding.plan import Phase
from formtax.serve import shapes as out
from formtax.serve.hooks import RequestHooks
from formtax.serve.shapes import FinishReason
from formtax.serve.tools import CallStream, ToolPlan
from formtax.strategies.base import Result
from formtax.streaming import Delta

REASONING_PHASES = (Phase.REASONING, Phase.RC)
"""The phases a strategy that separates its reasoning sends as ``reasoning_content``."""


def chunk_base(model: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
    """The fields every ``chat.completion.chunk`` of one stream shares (a finished ``body``'s own, when given)."""
    if body is not None:
        return {k: body[k] for k in ("id", "created", "model")} | {"object": "chat.completion.chunk"}
    return {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion.chunk", "created": int(time.time()),
            "model": model}


def text_chunk_base(model: str) -> dict[str, Any]:
    """The fields every ``text_completion`` chunk of one stream shares."""
    base = chunk_base(model)
    return base | {"object": "text_completion", "id": "cmpl-" + base["id"].removeprefix("chatcmpl-")}


class ChoiceChunks(ABC):
    """The chunks of one streamed choice (module docstring); subclasses word them for their format."""

    def __init__(self, base: dict[str, Any], index: int, hooks: RequestHooks) -> None:
        self.base, self.index, self.hooks = base, index, hooks
        self.cutter = out.StopCutter(hooks.stops)

    def opening(self) -> list[dict[str, Any]]:
        """What the stream sends once the row has produced anything (its first delta, or its end)."""
        return []

    def delta(self, part: Delta) -> list[dict[str, Any]]:
        """The chunks of one decoded delta."""
        return self.content(part.text)

    def content(self, piece: str) -> list[dict[str, Any]]:
        """Answer text as chunks, a stop string and whatever follows it cut."""
        piece = self.cutter.feed(piece)
        return [self.piece(piece)] if piece else []

    @abstractmethod
    def piece(self, text: str) -> dict[str, Any]:
        """One chunk of text."""

    @abstractmethod
    def finish(self, result: Result) -> list[dict[str, Any]]:
        """The text held back (a possible stop string's start that was none), then the finish chunk."""


class TextChunks(ChoiceChunks):
    """``/v1/completions``' chunks: the text in pieces, then a finish chunk with the ``formtax`` object. The text
    is the whole output (a completions request has no separated reasoning)."""

    def piece(self, text: str) -> dict[str, Any]:
        return self.base | {"choices": [{"index": self.index, "text": text, "finish_reason": None,
                                         "logprobs": None}]}

    def finish(self, result: Result) -> list[dict[str, Any]]:
        tail = self.cutter.flush()
        return [*([self.piece(tail)] if tail else []),
                self.base | {"choices": [{"index": self.index, "text": "", "finish_reason": out.finish(result),
                                          "logprobs": None}], "formtax": out.extension(result)}]


class ChatChunks(ChoiceChunks):
    """``/v1/chat/completions``' chunks: the assistant's role first; a strategy's separated reasoning as
    ``reasoning_content``; the answer as ``content``, or, when the answer may be a call, read by
    :class:`~formtax.serve.tools.CallStream` into tool-call deltas (each call's id and name first, then its
    arguments in pieces; a request that sent ``functions`` gets the legacy ``function_call``); the finish chunk
    with logprobs and the ``formtax`` object."""

    def __init__(self, base: dict[str, Any], index: int, hooks: RequestHooks, tok: TokenizerInfo,
                 separated: bool, tools: ToolPlan | None = None, legacy: bool = False) -> None:
        super().__init__(base, index, hooks)
        self.tok, self.separated, self.legacy = tok, separated, legacy
        self.calls = (CallStream(tools.text_allowed, tools.names if tools.answer is not None else None)
                      if tools is not None else None)

    def chunk(self, delta: dict[str, Any]) -> dict[str, Any]:
        return self.base | {"choices": [{"index": self.index, "delta": delta, "finish_reason": None}]}

    def piece(self, text: str) -> dict[str, Any]:
        return self.chunk({"content": text})

    def opening(self) -> list[dict[str, Any]]:
        return [self.chunk({"role": "assistant", "content": ""})]

    def delta(self, part: Delta) -> list[dict[str, Any]]:
        if self.separated and part.phase in REASONING_PHASES:
            return [self.chunk({"reasoning_content": part.text})] if part.text else []
        return self.content(part.text)

    def content(self, piece: str) -> list[dict[str, Any]]:
        if self.calls is None:
            return super().content(piece)
        chunks = []
        for kind, value in self.calls.feed(piece):
            if kind == "text":
                chunks += super().content(value)
            else:
                chunks.append(self.chunk(self._call_delta(kind, value)))
        return chunks

    def _call_delta(self, kind: str, value: str) -> dict[str, Any]:
        """A call's opening (``kind`` ``call``: its name) or a piece of its arguments, as a delta."""
        assert self.calls is not None
        if self.legacy:
            return ({"function_call": {"name": value, "arguments": ""}} if kind == "call"
                    else {"function_call": {"arguments": value}})
        index = self.calls.calls - 1
        if kind == "call":
            return {"tool_calls": [{"index": index, "id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                                    "function": {"name": value, "arguments": ""}}]}
        return {"tool_calls": [{"index": index, "function": {"arguments": value}}]}

    def finish(self, result: Result) -> list[dict[str, Any]]:
        tail = self.cutter.flush() + (self.calls.flush() if self.calls is not None else "")
        finish = out.finish(result)
        if self.calls is not None and self.calls.calls and finish != FinishReason.LENGTH:
            finish = FinishReason.FUNCTION_CALL if self.legacy else FinishReason.TOOL_CALLS
        logprobs = out.chat_logprobs(self.tok, self.hooks.recorded) if self.hooks.logprobs else None
        return [*([self.piece(tail)] if tail else []),
                self.base | {"choices": [{"index": self.index, "delta": {}, "finish_reason": finish,
                                          "logprobs": logprobs}], "formtax": out.extension(result)}]


def sse(obj: Any) -> str:
    """One server-sent event."""
    return f"data: {json.dumps(obj)}\n\n"


def is_usage_chunk(chunk: dict[str, Any]) -> bool:
    return chunk.get("choices") == [] and "usage" in chunk


async def sse_events(chunks: AsyncIterator[dict[str, Any]], include_usage: bool) -> AsyncIterator[str]:
    """Chunks as server-sent events, ``[DONE]`` last. The usage rides on its own last chunk (``choices: []``),
    sent only when the client asked (``stream_options.include_usage``), as OpenAI sends it. An error chunk ends
    the stream."""
    async for chunk in chunks:
        if is_usage_chunk(chunk) and not include_usage:
            continue
        yield sse(chunk)
        if "error" in chunk:
            return
    yield "data: [DONE]\n\n"


def usage_chunk(base: dict[str, Any], usage: dict[str, Any]) -> dict[str, Any]:
    """The usage of a whole stream, on its own last chunk (``choices: []``), as OpenAI sends it."""
    return base | {"choices": [], "usage": usage}


async def chat_chunks(body: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
    """A finished chat completion as OpenAI's chunks: role, reasoning, content or the tool calls (each call's id
    and name first, then its arguments, as OpenAI streams them), the finish reason (with the ``formtax`` object),
    and the usage chunk last."""
    base = chunk_base(body["model"], body)
    for choice in body["choices"]:
        i, msg = choice["index"], choice["message"]
        deltas: list[dict[str, Any]] = [{"role": "assistant", "content": ""}]
        if msg.get("reasoning_content"):
            deltas.append({"reasoning_content": msg["reasoning_content"]})
        for k, call in enumerate(msg.get("tool_calls") or ()):
            deltas.append({"tool_calls": [{"index": k, "id": call["id"], "type": "function",
                                           "function": {"name": call["function"]["name"], "arguments": ""}}]})
            deltas.append({"tool_calls": [{"index": k, "function": {"arguments": call["function"]["arguments"]}}]})
        if msg.get("content"):
            deltas.append({"content": msg["content"]})
        for d in deltas:
            yield base | {"choices": [{"index": i, "delta": d, "finish_reason": None}]}
        yield base | {"choices": [{"index": i, "delta": {}, "finish_reason": choice["finish_reason"],
                                   "logprobs": choice.get("logprobs")}], "formtax": choice.get("formtax")}
    yield usage_chunk(base, body["usage"])


async def text_chunks(body: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
    """A finished text completion as OpenAI's chunks: each choice's text, its finish reason (with the ``formtax``
    object), and the usage chunk last."""
    base = {k: body[k] for k in ("id", "created", "model")} | {"object": "text_completion"}
    for choice in body["choices"]:
        yield base | {"choices": [{"index": choice["index"], "text": choice["text"], "finish_reason": None}]}
        yield base | {"choices": [{"index": choice["index"], "text": "", "finish_reason": choice["finish_reason"]}],
                      "formtax": body["formtax"]}
    yield usage_chunk(base, body["usage"])
