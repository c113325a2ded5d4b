"""Request bodies of ``formtax serve`` (the OpenAI chat and completions APIs, the parts formtax implements) and how
each becomes a formtax generation: strategy, answer constraint, budget, sampling.

Mapping (documented choices):

* ``response_format`` ``{"type": "json_schema", "json_schema": {"schema": S}}``: the answer is JSON Schema ``S``;
  ``{"type": "json_object"}``: any JSON object. The strategy is ``constrained`` (the whole output is the JSON)
  unless the ``formtax`` extension names another (``json`` or ``inwriting`` reason first, then answer).
  Under ``json_schema.strict: true`` objects are closed as OpenAI closes them (``additionalProperties: false``
  wherever a schema does not say).
* ``tools``: the answer is a call, its arguments generated under the tool's ``parameters`` schema, for a named
  ``tool_choice``, ``"required"`` and ``"auto"`` (text or a call); see :mod:`formtax.serve.tools`.
* ``"formtax": {"strategy": ..., "answer": SPEC, "reasoning": ..., "triggers": [...], "closing": ...}``: any
  single-call or multi-call strategy with any answer SPEC; the reasoning comes back separately in ``reasoning_content``, as
  reasoning models' servers return it, and the answer in ``content``.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

from formtax.constraints.native import _closed, as_constraint
from formtax.constraints.spec import Constraint, JsonConstraint
from formtax.errors import ConfigError
from formtax.serve.tools import Function, Tool, ToolPlan, tool_plan, written_call
from formtax.serve.vllm_fields import GUIDED, guided_constraint

MAX_BODY_DEPTH = 192
"""How deeply a request body's JSON may nest: deeper, it is refused with a 400 before any field is read (a schema
nested about 100 levels deep ran the schema checker out of Python's recursion limit: a 500). The grammar engine
refuses schemas past about 80 levels of its own accord, so no usable schema is refused here."""

INT64 = (-(1 << 63), (1 << 63) - 1)
"""The range of ``seed``: OpenAI's and vLLM's (a signed 64-bit integer)."""


def check_body(data: Any, where: str = "", depth: int = 0) -> None:
    """Refuse, naming the field, what no later step can take: a string with a lone surrogate (``\\ud800``: valid
    JSON, but no UTF-8 text, so no tokenizer or grammar engine takes it) and nesting past :data:`MAX_BODY_DEPTH`.
    One pass over the parsed body, iterative (a deep body cannot exhaust the stack here)."""
    stack: list[tuple[Any, str, int]] = [(data, where, depth)]
    while stack:
        value, at, level = stack.pop()
        if isinstance(value, str):
            _unicode(value, at or "body", "contains")
            continue
        if isinstance(value, dict | list):
            if level >= MAX_BODY_DEPTH:
                head = at if len(at) <= 60 else at[:60] + "..."
                raise ValueError(f"{head}: nested more than {MAX_BODY_DEPTH} levels deep")
            items = value.items() if isinstance(value, dict) else enumerate(value)
            for k, v in items:
                if isinstance(k, str):
                    _unicode(k, at or "body", "has a key with")
                stack.append((v, f"{at}.{k}" if at else str(k), level + 1))


def _unicode(text: str, at: str, what: str) -> None:
    """A ValueError naming ``at`` where ``text`` holds a lone surrogate (no UTF-8 encoding)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"{at}: {what} a lone surrogate (\\ud800-\\udfff), which is no Unicode text") from None


class ToolCallFunction(BaseModel):
    """An earlier assistant message's call: its name and its arguments as JSON text (OpenAI's shape)."""

    model_config = ConfigDict(extra="allow")

    name: str = Field(min_length=1)
    arguments: str = "{}"


class ToolCall(BaseModel):
    model_config = ConfigDict(extra="allow")

    id: str | None = None
    type: Literal["function"] = "function"
    function: ToolCallFunction


def _shaped(model: type[BaseModel], value: Any, where: str) -> dict[str, Any]:
    """``value`` validated as ``model`` (a dict), or a ValueError that names ``where`` and the first problem."""
    try:
        return model.model_validate(value).model_dump()
    except ValidationError as e:
        first = e.errors()[0]
        at = ".".join(str(x) for x in (where, *first.get("loc", ())))
        raise ValueError(f"{at}: {first.get('msg', 'invalid')}") from None


class Message(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Literal["system", "user", "assistant", "tool", "developer", "function"]
    content: str | list[dict[str, Any]] | None = None

    def prompt_role(self) -> str:
        """The role in the chat template: a legacy ``function`` result is a tool result."""
        return "tool" if self.role == "function" else self.role

    def text(self) -> str:
        """The message as prompt text: its text parts in order; an assistant's earlier tool calls in the JSON form
        the model is asked to write them in (:mod:`formtax.serve.tools`)."""
        if isinstance(self.content, list):  # content parts: the text ones, in order
            text = "".join(str(p.get("text", "")) for p in self.content if p.get("type") == "text")
        else:
            text = self.content or ""
        extra = self.model_extra or {}
        calls = extra.get("tool_calls") or ([{"function": extra["function_call"]}] if extra.get("function_call")
                                            else None)
        if calls and not text:
            written = []
            for c in calls:
                fn = c.get("function") or {}
                try:
                    args = json.loads(fn.get("arguments") or "{}")
                except json.JSONDecodeError:
                    args = fn.get("arguments")
                written.append(written_call(fn.get("name"), args))
            text = json.dumps(written[0] if len(written) == 1 else written)
        return text

    @model_validator(mode="after")
    def _calls_shape(self) -> Message:
        """An assistant's earlier ``tool_calls`` / ``function_call`` in OpenAI's shape (a 400 naming the field,
        not a 500 when the prompt is written)."""
        extra = self.model_extra or {}
        if extra.get("tool_calls") is not None:
            calls = extra["tool_calls"]
            if not isinstance(calls, list):
                raise ValueError("tool_calls: must be a list of calls")
            extra["tool_calls"] = [_shaped(ToolCall, c, f"tool_calls.{k}") for k, c in enumerate(calls)]
        if extra.get("function_call") is not None:
            extra["function_call"] = _shaped(ToolCallFunction, extra["function_call"], "function_call")
        return self

    @field_validator("content")
    @classmethod
    def _text_parts(cls, v: str | list[dict[str, Any]] | None) -> str | list[dict[str, Any]] | None:
        if isinstance(v, list):
            for p in v:
                if p.get("type") != "text":
                    raise ValueError(f"content parts of type {p.get('type')!r} are not supported (text only)")
        return v


class FormtaxOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    strategy: str | None = None
    answer: str | None = None  # an answer SPEC (formtax generate --answer)
    reasoning: str | None = None  # a forced reasoning prefix (RC)
    triggers: list[str] = Field(default_factory=list)
    closing: bool | None = None  # closing mode (formtax.generate's default: on where formtax steps the model)


class OpenAIBody(BaseModel):
    """A request body of OpenAI's API: unknown fields refused (``extra="forbid"``), and a field sent as ``null``
    unset, as OpenAI's API reads it (clients send unset fields so). Chat, completions and responses share it."""

    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _null_is_unset(cls, data: Any) -> Any:
        check_body(data)
        return {k: v for k, v in data.items() if v is not None} if isinstance(data, dict) else data


class Sampled(OpenAIBody):
    """What both endpoints share. A field formtax does not implement is a 400 (``extra="forbid"``), except
    those that change nothing about the output (``user``, ``metadata``, ``store``, ``stream_options``,
    ``service_tier``, ``prompt_cache_key``, ``modalities: ["text"]``): a silently ignored field is a wrong answer
    the client cannot see. A field sent as ``null`` is unset, as OpenAI's API reads it (clients send unset fields
    so)."""

    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)  # None: the server's default (create_app)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    seed: int | None = Field(default=None, ge=INT64[0], le=INT64[1])
    n: int = Field(default=1, ge=1, le=16)
    stream: bool = False
    stop: str | list[str] | None = None
    presence_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    logit_bias: dict[str, float] | None = None
    formtax: FormtaxOptions | None = None
    # vLLM's fields (formtax/serve/vllm_fields.py)
    top_k: int | None = Field(default=None, ge=-1)
    min_p: float | None = Field(default=None, ge=0.0, lt=1.0)
    repetition_penalty: float | None = Field(default=None, gt=0.0, le=10.0)
    min_tokens: int | None = Field(default=None, ge=0)
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    guided_decoding_backend: str | None = None  # accepted: formtax's engine is llguidance whatever it names
    structured_outputs: dict[str, Any] | None = None
    # accepted because they do not change the output
    user: str | None = None
    metadata: dict[str, Any] | None = None
    store: bool | None = None
    stream_options: dict[str, Any] | None = None
    service_tier: str | None = None
    prompt_cache_key: str | None = None  # a cache-routing hint: formtax's prefix reuse needs none
    modalities: list[Literal["text"]] | None = None  # text is the one output modality formtax has

    def include_usage(self) -> bool:
        """Whether a stream ends with the usage chunk (OpenAI sends it only when asked)."""
        return bool((self.stream_options or {}).get("include_usage"))

    def guided(self) -> tuple[str, Constraint] | None:
        """The answer constraint of vLLM's guided fields, and the field that gave it."""
        return guided_constraint({k: getattr(self, k) for k in (*GUIDED, "structured_outputs")})

    def budget(self, default: int) -> int:
        return self.max_completion_tokens or self.max_tokens or default

    def stops(self) -> tuple[str, ...]:
        stops = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())
        if len(stops) > 4 or any(not s for s in stops):
            raise ConfigError("stop: give at most 4 non-empty strings")
        return stops

    def bias(self, vocab: int | None = None) -> dict[int, float]:
        """``logit_bias`` as token id -> bias: keys are token ids of the vocabulary (``vocab`` ids, when known),
        values in [-100, 100], as OpenAI and vLLM refuse others (a silently dropped bias is a wrong answer)."""
        out: dict[int, float] = {}
        for k, v in (self.logit_bias or {}).items():
            if not (k.isascii() and k.isdigit()) or not -100 <= v <= 100:
                raise ConfigError(f"logit_bias: {k!r}: keys are token ids, values in [-100, 100]")
            if vocab is not None and int(k) >= vocab:
                raise ConfigError(f"logit_bias: token id {k} is outside the vocabulary (ids 0-{vocab - 1})")
            out[int(k)] = float(v)
        return out


class ChatRequest(Sampled):
    """A chat request. The legacy ``functions`` / ``function_call`` become ``tools`` / ``tool_choice`` (one call,
    answered as ``message.function_call`` with ``finish_reason: "function_call"``, as OpenAI answers them)."""

    messages: list[Message] = Field(min_length=1)
    response_format: dict[str, Any] | None = None
    tools: list[Tool] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    functions: list[Function] | None = None
    function_call: str | dict[str, Any] | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    chat_template_kwargs: dict[str, Any] | None = None  # vLLM's: extra variables of the chat template
    _legacy: bool = PrivateAttr(False)  # the request sent ``functions``
    _format_field: str = PrivateAttr("response_format")  # what the client called the format (Responses: text.format)

    @property
    def format_field(self) -> str:
        return self._format_field

    @property
    def legacy_functions(self) -> bool:
        return self._legacy

    @model_validator(mode="after")
    def _legacy_and_logprobs(self) -> ChatRequest:
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("top_logprobs: needs logprobs: true")
        if self.functions is None and self.function_call is None:
            return self
        if self.tools is not None or self.tool_choice is not None:
            raise ValueError("functions: give tools or the legacy functions, not both")
        if self.function_call is not None and not self.functions:
            raise ValueError("function_call: needs functions")
        choice = self.function_call
        if isinstance(choice, dict):
            choice = {"type": "function", "function": {"name": choice.get("name")}}
        self.tools = [Tool(function=f) for f in self.functions or ()]
        self.tool_choice, self.parallel_tool_calls, self._legacy = choice, False, True
        self.functions = self.function_call = None
        return self

    @field_validator("response_format")
    @classmethod
    def _format(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        if v is not None and v.get("type") not in ("text", "json_object", "json_schema"):
            raise ValueError("response_format.type must be text, json_object or json_schema")
        return v


class CompletionRequest(Sampled):
    prompt: str | list[str]
    logprobs: int | None = Field(default=None, ge=0, le=5)
    echo: bool = False


def format_schema(response_format: dict[str, Any] | None, field: str = "response_format") -> dict[str, Any] | None:
    """The JSON Schema of a structured-output format (``json_object``: any object; strict: closed as OpenAI
    closes it); None for text or no format."""
    kind = (response_format or {}).get("type")
    if kind == "json_object":
        return {"type": "object"}
    if kind != "json_schema":
        return None
    spec = (response_format or {}).get("json_schema") or {}
    schema = spec.get("schema")
    if not isinstance(schema, dict):
        raise ConfigError(f"{field}: json_schema.schema must be a JSON Schema object")
    return _closed(schema) if spec.get("strict") else schema


def chat_constraint(req: ChatRequest, default_strategy: str | None = None, default_answer: str | None = None
                    ) -> tuple[str, Constraint | None, ToolPlan | None]:
    """(strategy, answer constraint, the tool plan when the answer is a tool call) of a chat request. The
    server's defaults (``formtax serve --strategy/--answer``) apply where the request names neither."""
    opts = req.formtax or FormtaxOptions()
    fmt_name = req.format_field
    fmt_schema = format_schema(req.response_format, fmt_name)
    # tools with a format (issue 59): under auto a call or the answer under the format; else the call
    named = opts.strategy or default_strategy
    tools = tool_plan(req.tools, req.tool_choice, req.parallel_tool_calls, fmt_schema if req.tools else None,
                      after_reasoning=named == "inwriting")
    fmt = fmt_schema is not None
    guided = req.guided()
    sources = [name for name, present in ((fmt_name, fmt and tools is None), ("tools", tools is not None),
                                           ("formtax.answer", opts.answer is not None),
                                           (guided[0] if guided else "", guided is not None)) if present]
    if len(sources) > 1:
        raise ConfigError(f"give one answer format, not {' and '.join(sources)}")
    if fmt and opts.answer is not None:
        raise ConfigError(f"give one answer format, not {fmt_name} and formtax.answer")
    if fmt and guided is not None:
        raise ConfigError(f"give one answer format, not {fmt_name} and {guided[0]}")
    constraint: Constraint | None = None
    answer = opts.answer if opts.answer is not None else (default_answer if not sources and not fmt else None)
    if answer is not None:
        constraint = as_constraint(answer)
    elif tools is not None:
        constraint = tools.constraint
    elif fmt_schema is not None:
        constraint = JsonConstraint(fmt_schema) if fmt_schema == {"type": "object"} else as_constraint(fmt_schema)
    elif guided is not None:
        constraint = guided[1]
    strategy = opts.strategy or default_strategy or ("constrained" if constraint is not None else "free")
    if strategy != "free" and constraint is None and opts.strategy is None:
        strategy = "free"  # the server's default strategy needs an answer; a request without one is free text
    return strategy, constraint, tools
