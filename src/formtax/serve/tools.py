"""Tool calls for ``formtax serve``: the grammar of a call, the prompt that describes the tools, and reading the
calls back out of the output.

A call is written as one JSON object with one key, the tool's name, whose value is the arguments object:
``{"get_weather": {"city": "Paris"}}``. The name comes first and the arguments are their own object, under the
tool's own ``parameters`` schema (closed like OpenAI's strict mode when the function says ``strict: true``): no key
is shared between the call and its arguments, so an argument called ``name`` or ``arguments`` cannot be read as the
call's own field (issue 47; the ``{"name": ..., "arguments": ...}`` form it replaces put both in one key space). With
``parallel_tool_calls`` (OpenAI's default) a JSON array of such objects is allowed too. ``tool_choice``:

* a named function: that tool's call, its name forced by the grammar;
* ``"required"``: a call of any of the tools;
* ``"auto"`` (the default with tools): a Lark grammar, *plain text or a call*: the output is a call exactly when
  it starts with ``{`` or ``[`` (text may not), so the two never overlap and any text the model writes stays
  possible; after InWriting's reasoning the text is one whole sentence (:data:`SENTENCE`);
* ``"none"``: no constraint.

With a structured-output format too (``response_format`` / the Responses API's ``text.format``, issue 59), as OpenAI
accepts them together and agent frameworks send them on every turn (an Agents SDK ``Agent`` with tools and an
``output_type``, the AI SDK's tools with ``Output.object``):

* ``"auto"``: one JSON Schema, *a call* or *the answer under the format's schema* (not *a call* or free text). The
  format's root must be an object (as OpenAI's structured outputs require), and the answer may not use a tool's name
  as a top-level key (``properties: {name: false}`` is added to its copy), so the two never overlap and the first
  key says which one is being written: an object whose key is a tool's name is a call, any other object the answer
  (a list is always calls). A format whose own top-level property has a tool's name is refused.
* ``"required"`` or a named tool: the call, as without a format; the format applies to the turn that answers in text
  (after the tool results, when the client sends ``auto`` again, as the Agents SDK's ``reset_tool_choice`` does).

The grammar, the closed objects and the JSON-in-text form are ours: OpenAI does not publish how its models write
calls. The prompt (a system note listing the tools and this form) is needed because most chat templates of small
models take no ``tools`` argument; it is added to the request's first system message, or as one. With a reasoning
strategy (``json``, ``inwriting``) the call is the answer: the model reasons first and the reasoning comes back in
``reasoning_content``.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from formtax.constraints.native import _closed
from formtax.constraints.schema_approx import JSON_OPTIONS
from formtax.constraints.spec import Constraint, JsonConstraint, LarkConstraint
from formtax.errors import ConfigError


class Function(BaseModel):
    model_config = ConfigDict(extra="allow")

    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict[str, Any] | None = None


class Tool(BaseModel):
    model_config = ConfigDict(extra="allow")

    type: Literal["function"] = "function"
    function: Function


@dataclass(frozen=True)
class ToolPlan:
    """How a request's tools become an answer: the constraint, the tools it may call, whether text is allowed."""

    constraint: Constraint
    names: tuple[str, ...]
    text_allowed: bool
    parallel: bool
    answer: dict[str, Any] | None = None  # ``auto`` with a format: the answer's schema (module docstring)
    sentence: bool = False  # ``auto`` after reasoning: the text is one whole sentence (:data:`SENTENCE`)


def _parameters(tool: Tool) -> dict[str, Any]:
    params = tool.function.parameters or {"type": "object", "properties": {}}
    if not isinstance(params, dict) or params.get("type", "object") != "object":
        raise ConfigError(f"tools: the parameters of {tool.function.name!r} must be a JSON Schema of type object")
    return _closed(params) if tool.function.model_extra and tool.function.model_extra.get("strict") else params


def call_schema(tools: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """The JSON Schema of one call of any of ``tools`` (each tool's name and parameters schema)."""
    calls = [{"type": "object", "properties": {name: params}, "required": [name], "additionalProperties": False}
             for name, params in tools]
    return calls[0] if len(calls) == 1 else {"anyOf": calls}


DEFS = ("$defs", "definitions")


def _hoisted(schemas: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]]]:
    """``schemas`` without their root ``$defs`` / ``definitions``, and those merged: a tool's parameters or the
    format nested inside a call's schema keep resolving ``#/$defs/X`` when the definitions sit at the new root
    (pydantic's and zod's schemas refer to them so). Two different definitions under one name are refused."""
    merged: dict[str, dict[str, Any]] = {}
    bare = []
    for schema in schemas:
        for key in DEFS:
            for name, definition in (schema.get(key) or {}).items():
                held = merged.setdefault(key, {})
                if name in held and held[name] != definition:
                    raise ConfigError(f"tools and the answer format define {key}/{name} differently; rename one")
                held[name] = definition
        bare.append({k: v for k, v in schema.items() if k not in DEFS})
    return bare, merged


def _answer_branch(answer: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """The format's schema as the answer branch of ``auto``: an object that never uses a tool's name as a key
    (module docstring)."""
    if answer.get("type") != "object":
        raise ConfigError("tools with a response format: the format's schema must have type object at its root, "
                          "as OpenAI's structured outputs require")
    props = dict(answer.get("properties") or {})
    clash = [n for n in names if n in props]
    if clash:
        raise ConfigError(f"tools with a response format: the format's property {clash[0]!r} has the name of a tool, "
                          "so a call and the answer could not be told apart; rename one")
    if answer.get("additionalProperties", True) is not False or answer.get("patternProperties"):
        props.update({n: False for n in names})
    return {**answer, "properties": props}


SENTENCE = r"/[^\s{\[a-z][^\n]*[.!?]/"
"""``auto``'s text after a reasoning phase (InWriting): one whole sentence, not white space or a lower-case
continuation of the reasoning, no line break, ending in ``.``, ``!`` or ``?`` (issue 59: the visible answer was a
fragment such as `` is the answer to ...``; the reasoning goes to ``reasoning_content``)."""


def tool_plan(given: list[Tool] | None, tool_choice: str | dict[str, Any] | None,
              parallel_tool_calls: bool | None, answer: dict[str, Any] | None = None,
              after_reasoning: bool = False) -> ToolPlan | None:
    """A request's tool constraint (module docstring); None when no tool is to be called. ``answer``: the JSON
    Schema of the request's structured-output format, if it has one; ``after_reasoning``: the strategy reasons
    first (InWriting), so ``auto``'s text is one whole sentence (:data:`SENTENCE`)."""
    if not given:
        if tool_choice not in (None, "none", "auto"):
            raise ConfigError("tool_choice names a tool but no tools are given")
        return None
    names = [t.function.name for t in given]
    if len(set(names)) != len(names):
        raise ConfigError("tools: two tools have the same name")
    choice = tool_choice if tool_choice is not None else "auto"
    if choice == "none":
        return None
    tools = list(given)
    if isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name")
        if name not in names:
            raise ConfigError(f"tool_choice names {name!r}, which is not among the tools ({', '.join(names)})")
        tools = [t for t in tools if t.function.name == name]
    elif choice not in ("required", "auto"):
        raise ConfigError(f"tool_choice must be none, auto, required or a named function, got {choice!r}")
    parallel = parallel_tool_calls is not False and not isinstance(choice, dict)
    branch = _answer_branch(answer, names) if choice == "auto" and answer is not None else None
    bare, defs = _hoisted([*(_parameters(t) for t in tools), *([branch] if branch is not None else [])])
    one = call_schema([(t.function.name, p) for t, p in zip(tools, bare, strict=False)])
    schema = {"anyOf": [one, {"type": "array", "items": one, "minItems": 1}]} if parallel else one
    if branch is not None:  # a call or the answer under the format, as one JSON Schema
        combined = {"anyOf": [schema, bare[-1]], **defs}
        tool_names = ", ".join(names)
        constraint: Constraint = JsonConstraint(combined, source=f"tool call of {tool_names} or the answer format")
        constraint.check()
        return ToolPlan(constraint, tuple(names), False, parallel, branch)
    schema = {**schema, **defs}
    if choice == "auto":  # the call written as every formtax JSON answer is (JSON_OPTIONS: one spacing)
        call = {**schema, "x-guidance": JSON_OPTIONS}
        text = SENTENCE if after_reasoning else r"/[^{\[][\s\S]*/"
        grammar = f"start: call | text\ncall: %json {json.dumps(call)}\ntext: {text}\n"
        constraint = LarkConstraint(grammar)
    else:
        constraint = JsonConstraint(schema, source="tool call of " + ", ".join(t.function.name for t in tools))
    constraint.check()
    return ToolPlan(constraint, tuple(t.function.name for t in tools), choice == "auto", parallel,
                    sentence=choice == "auto" and after_reasoning)


def tools_prompt(plan: ToolPlan, tools: list[Tool]) -> str:
    """The system note that describes the tools and how to call them (module docstring)."""
    listed = [{"name": t.function.name, "description": t.function.description or "",
               "parameters": t.function.parameters or {}} for t in tools if t.function.name in plan.names]
    lines = ["You can call these tools:", json.dumps(listed, indent=1),
             "To call a tool, reply with only a JSON object whose one key is the tool's name and whose value is an "
             'object of its parameters: {"<the tool\'s name>": {<its parameters>}}.']
    if plan.parallel:
        lines.append("To call several tools, reply with a JSON array of such objects.")
    if plan.text_allowed:
        lines.append("If no tool is needed, answer in one plain sentence instead." if plan.sentence else
                     "If no tool is needed, answer in plain text instead.")
    if plan.answer is not None:
        shown = {k: v for k, v in plan.answer.items() if k not in DEFS}
        shown["properties"] = {k: v for k, v in (shown.get("properties") or {}).items() if v is not False}
        lines.append("If no tool is needed, reply with only your final answer as a JSON object under this schema: "
                     + json.dumps(shown))
    return "\n".join(lines)


def with_tools_prompt(messages: list[dict[str, str]], note: str) -> list[dict[str, str]]:
    """``messages`` with ``note`` in the first system message (or in a new one before the rest)."""
    if messages and messages[0]["role"] in ("system", "developer"):
        first = dict(messages[0])
        first["content"] = (first["content"] + "\n\n" + note).strip()
        return [first, *messages[1:]]
    return [{"role": "system", "content": note}, *messages]


def is_call(value: Any, names: tuple[str, ...]) -> bool:
    """Whether a parsed answer is a call (or a list of calls) rather than the answer under a format: a list, or an
    object whose one key is a tool's name (the answer branch may not use one; module docstring)."""
    if isinstance(value, list):
        return True
    return isinstance(value, dict) and len(value) == 1 and next(iter(value)) in names


def read_calls(text: str | None, parsed: Any, names: tuple[str, ...] | None = None) -> list[dict[str, Any]] | None:
    """The OpenAI ``tool_calls`` of an output whose answer parsed as ``parsed`` (a call or a list of calls);
    None when the output is text (``auto``) or the answer under a format (``names``: the tools, given then)."""
    value = parsed
    if value is None or isinstance(value, str):  # the auto grammar's value is the text itself
        if text is None or not text.lstrip().startswith(("{", "[")):
            return None
        value = json.loads(text)
    if names is not None and not is_call(value, names):
        return None
    calls = value if isinstance(value, list) else [value]
    return [{"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
             "function": {"name": name, "arguments": json.dumps(args)}} for c in calls for name, args in c.items()]


def written_call(name: str | None, arguments: Any) -> dict[str, Any]:
    """A call as the model is asked to write it (an assistant's earlier calls go back into the prompt so)."""
    return {str(name): arguments}


class CallStream:
    """Reads a call's text as it is generated and says, live, what OpenAI streams: each call's name once it is
    written, then its arguments object piece by piece. In ``auto`` mode an output whose first character is not
    ``{`` or ``[`` is text (the grammar's own rule, so the decision is final at the first character).

    A character-level scanner of the call form (module docstring): the grammar has already made the text valid,
    so depth, strings and escapes are all it tracks. Hand-written because an incremental JSON parser would still
    have to be told where a call's name ends and its arguments begin."""

    def __init__(self, text_allowed: bool, answer_names: tuple[str, ...] | None = None) -> None:
        self.text_allowed = text_allowed
        self.answer_names = answer_names  # ``auto`` with a format: the tools, whose names mark an object as a call
        self.held = ""  # with a format: an object's start, until its first key says call or answer
        self.mode: str | None = None  # "text" or "call", fixed by the first character (with a format: first key)
        self.depth = 0
        self.in_string = self.escape = False
        self.call_level = 0  # the depth a call object opens at: 0 alone, 1 inside a list of calls
        self.key: list[str] | None = None  # the name being read
        self.name: str | None = None
        self.args_from: int | None = None  # the depth the arguments object opened at
        self.calls = 0

    def flush(self) -> str:
        """What is held back when the output ends before its first key (a budget that ran out): text."""
        held, self.held = self.held, ""
        return held

    def feed(self, text: str) -> list[tuple[str, Any]]:
        """Events for ``text``: ``("text", s)``, ``("call", name)`` (a new call), ``("args", s)``. With a format
        (``auto``), the answer's JSON is ``text`` too."""
        if self.answer_names is not None and self.mode is None:
            text = self.held + text
            key = re.match(r'\{"((?:[^"\\]|\\.)*)"', text)
            if text in ("", "{") or (text.startswith('{"') and key is None):
                self.held = text  # the first key is not written yet
                return []
            named = key is not None and json.loads(f'"{key.group(1)}"') in self.answer_names
            self.mode = "call" if text[:1] == "[" or named else "text"
            self.call_level = 1 if text[:1] == "[" else 0
            self.held = ""
        events: list[tuple[str, Any]] = []
        args: list[str] = []

        def flush_args() -> None:
            if args:
                events.append(("args", "".join(args)))
                args.clear()

        for ch in text:
            if self.mode is None:
                self.mode = "call" if ch in "{[" or not self.text_allowed else "text"
                self.call_level = 1 if ch == "[" else 0
            if self.mode == "text":
                events.append(("text", ch))
                continue
            opened = self.depth
            if self.in_string:
                if self.escape:
                    self.escape = False
                elif ch == "\\":
                    self.escape = True
                elif ch == '"':
                    self.in_string = False
            elif ch == '"':
                self.in_string = True
            elif ch in "{[":
                self.depth += 1
            elif ch in "}]":
                self.depth -= 1
            if self.args_from is not None:  # inside the arguments object: every character is the arguments'
                args.append(ch)
                if self.depth == self.args_from:  # its closing brace
                    self.args_from = None
                continue
            if self.key is not None:  # reading the call's key: the tool's name
                if self.in_string:
                    if not (ch == '"' and not self.key):
                        self.key.append(ch)
                else:
                    self.name, self.key = json.loads('"' + "".join(self.key) + '"'), None
                continue
            if ch == "{" and opened == self.call_level and not self.in_string:
                continue  # a call object opened; its key comes next
            if ch == '"' and self.in_string and self.depth == self.call_level + 1 and self.name is None:
                self.key = []
                continue
            if ch == "{" and self.name is not None and opened == self.call_level + 1:
                flush_args()
                events.append(("call", self.name))
                self.calls += 1
                self.name = None
                self.args_from = opened
                args.append(ch)
        flush_args()
        merged: list[tuple[str, Any]] = []
        for kind, value in events:  # text characters as one piece
            if kind == "text" and merged and merged[-1][0] == "text":
                merged[-1] = ("text", merged[-1][1] + value)
            else:
                merged.append((kind, value))
        return merged
