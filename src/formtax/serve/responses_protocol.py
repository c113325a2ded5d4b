"""The request body of OpenAI's Responses API (``POST /v1/responses``) and what it is as a chat request
(:meth:`ResponsesRequest.to_chat`): :class:`~formtax.serve.serving_responses.ResponsesServing` serves it through
chat's serving and words the result as a Response (the schema of chat's bodies is :mod:`formtax.serve.schema`).

What maps to what (the rest of formtax serve's behaviour is chat's):

* ``input`` (a string, or items: messages with ``input_text`` / ``output_text`` parts, ``function_call`` and
  ``function_call_output``) and ``instructions`` (a system message first) are the chat messages. A ``reasoning``
  item a client sends back is dropped: formtax keeps no reasoning state between requests.
* ``text.format`` (``json_schema`` with ``strict``, ``json_object``, ``text``) is ``response_format``; function
  ``tools`` (flat, as the Responses API writes them) and ``tool_choice`` are chat's tools; ``reasoning.effort`` is
  ``reasoning_effort``; ``max_output_tokens`` is ``max_completion_tokens``; ``top_logprobs`` turns logprobs on.
* Stateless: nothing is stored. ``previous_response_id``, ``conversation`` and ``background: true`` are refused with
  what to send instead; ``store`` is accepted and stores nothing (``GET /v1/responses/{id}`` is a 404).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from formtax.errors import ConfigError
from formtax.serve.schema import ChatRequest, FormtaxOptions, OpenAIBody


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
