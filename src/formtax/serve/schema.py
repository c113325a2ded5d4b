"""Request bodies of ``formtax serve`` (the OpenAI chat and completions APIs, the parts formtax implements) and how
each becomes a formtax generation: strategy, answer constraint, budget, sampling.

Mapping (documented choices):

* ``response_format`` ``{"type": "json_schema", "json_schema": {"schema": S}}``: the answer is JSON Schema ``S``;
  ``{"type": "json_object"}``: any JSON object. The strategy is ``constrained`` (the whole output is the JSON)
  unless the ``formtax`` extension names another (``json`` or ``inwriting`` reason first, then answer).
* ``tools`` with ``tool_choice`` ``"required"`` or a named function: the answer is a choice over the tool names
  (paper 002's tool-selection constraint); ``"auto"`` (the default when tools are given) adds ``None``, the
  abstention answer; ``"none"`` generates free text. The chosen tool comes back as a ``tool_calls`` entry with
  ``arguments`` ``"{}"``: formtax selects the tool, it does not fill its arguments.
* ``"formtax": {"strategy": ..., "answer": SPEC, "reasoning": ..., "triggers": [...], "closing": ...}``: any
  single-call or multi-call strategy with any answer SPEC; the reasoning comes back separately in ``reasoning_content``, as
  reasoning models' servers return it, and the answer in ``content``.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from formtax.constraints.native import as_constraint
from formtax.constraints.spec import ChoiceConstraint, Constraint, JsonConstraint
from formtax.errors import ConfigError

ABSTAIN = "None"


class Message(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[dict[str, Any]] | None = None

    def text(self) -> str:
        if isinstance(self.content, list):  # content parts: the text ones, in order
            return "".join(str(p.get("text", "")) for p in self.content if p.get("type") == "text")
        return self.content or ""


class FormtaxOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    strategy: str | None = None
    answer: str | None = None  # an answer SPEC (formtax generate --answer)
    reasoning: str | None = None  # a forced reasoning prefix (RC)
    triggers: list[str] = Field(default_factory=list)
    closing: bool | None = None  # closing mode (formtax.generate's default: on where formtax steps the model)


class Function(BaseModel):
    model_config = ConfigDict(extra="allow")

    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict[str, Any] | None = None


class Tool(BaseModel):
    model_config = ConfigDict(extra="allow")

    type: Literal["function"] = "function"
    function: Function


class Sampled(BaseModel):
    """What both endpoints share."""

    model_config = ConfigDict(extra="allow")  # unknown OpenAI fields (logprobs, user, ...) are accepted, unused

    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=0.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    seed: int | None = None
    n: int = Field(default=1, ge=1, le=1)
    stream: bool = False
    formtax: FormtaxOptions | None = None

    def budget(self, default: int) -> int:
        return self.max_completion_tokens or self.max_tokens or default


class ChatRequest(Sampled):
    messages: list[Message] = Field(min_length=1)
    response_format: dict[str, Any] | None = None
    tools: list[Tool] | None = None
    tool_choice: str | dict[str, Any] | None = None

    @field_validator("response_format")
    @classmethod
    def _format(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        if v is not None and v.get("type") not in ("text", "json_object", "json_schema"):
            raise ValueError("response_format.type must be text, json_object or json_schema")
        return v


class CompletionRequest(Sampled):
    prompt: str | list[str]


def tool_choice_constraint(req: ChatRequest) -> Constraint | None:
    """The tools as a choice constraint (module docstring); None when no tool is to be chosen."""
    if not req.tools:
        if req.tool_choice not in (None, "none", "auto"):
            raise ConfigError("tool_choice names a tool but no tools are given")
        return None
    names = [t.function.name for t in req.tools]
    choice = req.tool_choice if req.tool_choice is not None else "auto"
    if choice == "none":
        return None
    if isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name")
        if name not in names:
            raise ConfigError(f"tool_choice names {name!r}, which is not among the tools ({', '.join(names)})")
        return ChoiceConstraint([name])
    if choice == "required":
        return ChoiceConstraint(names)
    if choice == "auto":
        if ABSTAIN in names:
            raise ConfigError(f"a tool may not be called {ABSTAIN!r}: it is the abstention answer")
        return ChoiceConstraint([*names, ABSTAIN])
    raise ConfigError(f"tool_choice must be none, auto, required or a named function, got {choice!r}")


def chat_constraint(req: ChatRequest) -> tuple[str, Constraint | None, bool]:
    """(strategy, answer constraint, whether the answer is a tool choice) of a chat request."""
    opts = req.formtax or FormtaxOptions()
    sources = [name for name, present in (("response_format", req.response_format is not None
                                            and req.response_format.get("type") != "text"),
                                           ("tools", tool_choice_constraint(req) is not None),
                                           ("formtax.answer", opts.answer is not None)) if present]
    if len(sources) > 1:
        raise ConfigError(f"give one answer format, not {' and '.join(sources)}")
    constraint: Constraint | None = None
    tool = False
    if opts.answer is not None:
        constraint = as_constraint(opts.answer)
    elif req.response_format is not None and req.response_format.get("type") == "json_object":
        constraint = JsonConstraint({"type": "object"})
    elif req.response_format is not None and req.response_format.get("type") == "json_schema":
        spec = req.response_format.get("json_schema") or {}
        schema = spec.get("schema")
        if not isinstance(schema, dict):
            raise ConfigError("response_format.json_schema.schema must be a JSON Schema object")
        constraint = as_constraint(schema)
    else:
        constraint = tool_choice_constraint(req)
        tool = constraint is not None
    strategy = opts.strategy or ("constrained" if constraint is not None else "free")
    return strategy, constraint, tool
