"""Paper 003's JSON strategy constraint: ``{"reason": "<free text>", "answer": <typed answer>}``.

Two settings shape what the format constraint allows (both recorded through the run's strategy options):

* ``layout``: :attr:`JsonLayout.FLEXIBLE` (the default) lets the model put JSON whitespace (space, tab, newline,
  carriage return) around every structural token and before and after the object, as a JSON parser and the
  engine's own JSON default allow; paper 003's schema is a Pydantic model under a JSON engine, and its examples
  (appendix A.4.3) are pretty-printed, so a compact-only mask would remove paths the strict parser accepts
  (Assumption 1). :attr:`JsonLayout.COMPACT` keeps Python ``json.dumps``' spelling (``", "`` and ``": "``).
  Ours: at most :data:`WS_BUDGET` whitespace-only tokens in the whole object, kept by the policy
  (constraints/jsonstrings.py), so the answer's reserve stays bounded; on a server (``escapes=False``, the
  engine alone) each whitespace run is capped at one token by the engine instead. The ``answer`` value itself
  is written compactly.
* ``escapes``: with True (the default, for backends whose decode loop steps the policy) the ``reason`` string, and
  a free-text ``answer`` string, accept every JSON string body, escapes and all; their token caps are kept by
  the policy (constraints/jsonstrings.py), because the engine's own cap can end a string inside an escape.
  With False (a server that takes only a whole-output grammar) they are escape-free and capped by the engine:
  every prefix of an escape-free body is a body, so the engine's cut is safe. A cap below
  :data:`MIN_ESCAPE_CAP` tokens also keeps the escape-free body (a ``\\u`` escape opened by the string's first
  token could not always finish).

A :class:`RecordConstraint` answer is embedded with its own Lark rules (not ``%json`` of its schema), so its key
order, compact spelling and ``{str:N}`` token caps hold inside the answer too, and its ``max_tokens`` (exact for
escape-free strings) is the answer's reserve.
"""

from __future__ import annotations

import json
import re
from enum import StrEnum
from functools import cached_property
from typing import Any

import llguidance

from formtax.constraints.record import RecordConstraint
from formtax.constraints.schema_approx import JSON_OPTIONS
from formtax.constraints.spec import (
    NO_ESCAPE_CHAR,
    Constraint,
    ConstraintError,
    DuplicateKey,
    TemplateConstraint,
    Validation,
    load_json,
    schema_validator,
)
from formtax.constraints.template import STR_SLOT_MAX_TOKENS


class JsonLayout(StrEnum):
    FLEXIBLE = "flexible"
    COMPACT = "compact"


MIN_ESCAPE_CAP = 4  # the smallest policy-kept cap (constraints/jsonstrings.py)
# Whitespace runs of the flexible layout: before the object, after "{", around each key's ":", around ",",
# after the answer, after "}".
WS_RUNS = 10
WS_BUDGET = WS_RUNS  # ours: whitespace-only tokens allowed in one object (policy-kept; one per run on a server)
# One character of a JSON string body, escapes included (RFC 8259 section 7). The backslash and the "u" are written
# as classes so that closing mode's search (constraints/closing.py) does not take them for literals to follow.
JSON_BODY_CHAR = r'([\\](["\\\/bfnrt]|[u][0-9a-fA-F]{4})|[^"\\\x00-\x1F])'

JSON_SCAFFOLD = len(b'{"reason": "", "answer": }')


def _load_checked(text: str, validator: Any) -> tuple[Any, Validation | None]:
    """The JSON value of ``text`` and None, or the failed Validation (not JSON, or against the schema)."""
    try:
        value = load_json(text)
    except json.JSONDecodeError as e:
        return None, Validation(False, error=f"not JSON: {e}")
    except DuplicateKey as e:
        return None, Validation(False, error=f"not a valid object: {e}")
    errors = list(validator.iter_errors(value))
    if errors:
        return value, Validation(False, value, error=f"schema violation: {errors[0].message}")
    return value, None


INTEGER_LITERAL = re.compile(r"-?(0|[1-9][0-9]*)")


def integer_literal_error(text: str, field: dict[str, Any]) -> str | None:
    """Where the answer field is an integer, the grammar writes it in digits only (no fraction, no exponent; no
    minus sign at all in a non-negative range, so no ``-0``), while JSON Schema's ``integer`` also takes ``1e2``
    and ``100.0`` and JSON reads ``-0`` as 0: the
    validator asks for the grammar's form, so the oracle and the grammar agree (issue 49's "one source of truth").
    None when the field is not an integer or its literal is the grammar's."""
    if field.get("type") != "integer":
        return None
    try:
        value = json.loads(text, parse_float=lambda s: ("literal", s), parse_int=lambda s: ("literal", s))
    except json.JSONDecodeError:
        return None  # the schema check reports it
    literal = value.get("answer") if isinstance(value, dict) else None
    unsigned = field.get("minimum", -1) >= 0  # the grammar of a non-negative range writes no minus sign at all
    if isinstance(literal, tuple) and (not INTEGER_LITERAL.fullmatch(literal[1])
                                       or (unsigned and literal[1].startswith("-"))):
        return f"answer: {literal[1]} is not an integer as the grammar writes one (digits, no fraction or exponent)"
    return None


# A JSON number (RFC 8259 section 6) and the engine's cap on its tokens (ours: every token carries a character, and
# 24 characters hold any number a model writes as an answer)
NUMBER_RE = r"-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?"
NUMBER_TOKENS = 24


class NumberOr(Constraint):
    """FC's answer where the prompt's own form of the answer is a JSON number (an integer task's
    ``{"answer": <answer>}``): the free text of ``inner`` as a JSON string, or a JSON number.

    Paper 003's Assumption 1: the format constraint admits every answer the prompt admits, so FC may not refuse
    ``{"answer": 28}`` when the prompt shows ``<answer>`` unquoted; VC keeps the valid answer (the integer). Only a
    JSON answer field (:class:`JsonReasonAnswer`, :class:`JsonAnswerObject`) reads the difference between ``28``
    and ``"28"``; standalone, the text is a number or ``inner``'s text. Spec: ``number-or:SPEC``."""

    kind = "number-or"

    def __init__(self, inner: Constraint) -> None:
        if not isinstance(inner, TemplateConstraint):
            raise ConstraintError(f"number-or: wraps an answer template, not a {inner.kind} constraint")
        self.inner = inner
        self.source = inner.source

    @cached_property
    def grammar(self) -> str:
        lark = (f"start: number | text\nnumber[max_tokens={NUMBER_TOKENS}]: /{NUMBER_RE}/\n"
                + self.inner.template.lark("text"))
        return llguidance.grammar_from("lark", lark)

    def validate(self, text: str) -> Validation:
        if re.fullmatch(NUMBER_RE, text):
            return Validation(True, json.loads(text))
        return self.inner.validate(text)

    def search(self, text: str) -> Validation:
        return self.inner.search(text)

    @property
    def max_tokens(self) -> int:
        return max(self.inner.max_tokens, NUMBER_TOKENS)

    def answer_schema(self) -> dict[str, Any]:
        return {"anyOf": [self.inner.answer_schema(), {"type": "number"}]}


def layout_tokens(layout: JsonLayout) -> int:
    """Tokens the layout's whitespace may take at most, on top of :data:`JSON_SCAFFOLD`."""
    return WS_BUDGET if layout is JsonLayout.FLEXIBLE else 0


class JsonReasonAnswer(Constraint):
    """The reason + answer object (see the module docstring). The reason is capped at ``reason_tokens`` tokens,
    after which the closing quote must come: that is how the answer's budget is reserved."""

    kind = "json-reason"

    def __init__(self, answer: Constraint, reason_tokens: int, layout: JsonLayout = JsonLayout.FLEXIBLE,
                 escapes: bool = True) -> None:
        self.answer = answer
        # the answer as text (a JSON string): the answer itself, or the text alternative of a NumberOr
        self.text_answer = answer.inner if isinstance(answer, NumberOr) else answer
        self.reason_tokens = max(1, reason_tokens)
        self.layout = JsonLayout(layout)
        self.escapes = escapes
        self.answer_field = answer.answer_schema()
        self.text_field = self.text_answer.answer_schema()
        self.source = f"reason+answer({answer.describe()})"
        # the answer's definitions move to the wrapper's root, where its "#/$defs/..." references point
        field = {k: v for k, v in self.answer_field.items() if k not in ("$defs", "definitions")}
        defs: dict[str, Any] = {k: self.answer_field[k] for k in ("$defs", "definitions") if k in self.answer_field}
        self.schema: dict[str, Any] = {
            "type": "object",
            "properties": {"reason": {"type": "string"}, "answer": field},
            "required": ["reason", "answer"],
            "additionalProperties": False,
            **defs,
        }
        self._validator = schema_validator(self.schema)

    # -- which strings the policy caps --------------------------------------------------------------------------
    def _policy_caps(self, cap: int) -> bool:
        return self.escapes and cap >= MIN_ESCAPE_CAP

    @property
    def policy_kept(self) -> bool:
        """Whether the policy keeps some of this object's caps (:class:`~formtax.constraints.jsonstrings.
        StringCaps`); False: the grammar alone bounds it."""
        return self.escapes and (bool(self.string_caps) or self.layout is JsonLayout.FLEXIBLE)

    @property
    def string_caps(self) -> dict[int, int]:
        """Caps the policy keeps, by the position of the top-level string value (0: reason, 1: a string
        answer); empty when the engine keeps them all."""
        caps: dict[int, int] = {}
        if self._policy_caps(self.reason_tokens):
            caps[0] = self.reason_tokens
        if self._plain_string_answer() and self._policy_caps(self._string_cap(self.text_answer)):
            caps[1] = self._string_cap(self.text_answer)  # a number answer has no string there: no cap applies
        return caps

    def _string_rule(self, name: str, cap: int, nonempty: bool) -> str:
        rep = "+" if nonempty else "*"
        if self._policy_caps(cap):
            return f"{name}: /{JSON_BODY_CHAR}{rep}/\n"
        return f"{name}[max_tokens={cap}]: /{NO_ESCAPE_CHAR}{rep}/\n"

    def lark_answer_rules(self, name: str = "answer") -> str:
        """The Lark rules of the ``answer`` value, rule ``name`` (shared with :class:`JsonAnswerObject`)."""
        if isinstance(self.answer, NumberOr):
            return (f"{name}: {name}_text | {name}_number\n{name}_number[max_tokens={NUMBER_TOKENS}]: /{NUMBER_RE}/\n"
                    + self._text_rules(f"{name}_text"))
        return self._text_rules(name)

    def _text_rules(self, name: str) -> str:
        a = self.text_answer
        if isinstance(a, RecordConstraint):
            return a.lark_rules(name)
        if self._template_text_answer():
            # text around a slot, or several slots: the template's own rules inside the string's quotes, so the
            # field's language is exactly the template's (a pattern in a JSON schema could not bound the ints)
            assert isinstance(a, TemplateConstraint)
            return f'{name}: "\\"" {name}_t "\\""\n' + a.template.lark(f"{name}_t", json_string=True)
        if self._plain_string_answer():
            # the oracle's schema (minLength) decides whether "" is an answer; the engine must agree with it
            return f'{name}: "\\"" {name}_body "\\""\n' + self._string_rule(
                f"{name}_body", self._string_cap(a), bool(self.text_field.get("minLength")))
        answer = "%json" + json.dumps(
            {**self.text_field, "x-guidance": JSON_OPTIONS}, separators=(",", ":"), ensure_ascii=False
        )
        return f"{name}: {answer}\n"

    @cached_property
    def grammar(self) -> str:
        answer_rules = self.lark_answer_rules()
        if self.layout is JsonLayout.COMPACT:
            start = 'start: "{\\"reason\\": \\"" reason "\\", \\"answer\\": " answer "}"\n'
        else:
            start = ('start: ws? "{" ws? "\\"reason\\"" ws? ":" ws? "\\"" reason "\\"" ws? "," ws? '
                     '"\\"answer\\"" ws? ":" ws? answer ws? "}" ws?\n'
                     + f"ws[max_tokens={WS_BUDGET if self.escapes else 1}]: " + "/[\\x20\\t\\n\\r]+/\n")
        lark = start + self._string_rule("reason", self.reason_tokens, False) + answer_rules
        return llguidance.grammar_from("lark", lark)

    @property
    def may_repeat_keys(self) -> bool:
        return self.answer.may_repeat_keys  # the wrapper's own keys are fixed by its grammar

    def validate(self, text: str) -> Validation:
        value, failed = _load_checked(text, self._validator)
        if failed is not None:
            return failed
        if (lexical := integer_literal_error(text, self.answer_field)) is not None:
            return Validation(False, value, error=lexical)
        if isinstance(self.answer, NumberOr) and not isinstance(value["answer"], str):
            pass  # a number, and the schema said so
        elif isinstance(self.text_answer, RecordConstraint):
            # The schema cannot say "keys in this order, no escapes": the record's own oracle does.
            rec = self.text_answer.validate(json.dumps(value["answer"], ensure_ascii=False))
            if not rec.ok:
                return Validation(False, value, error=f"answer: {rec.error}")
        elif self._template_text_answer():
            # the same oracle as the constrained strategy: fullmatch and every slot's bounds
            tmpl = self.text_answer.validate(str(value["answer"]))
            if not tmpl.ok:
                return Validation(False, value, error=f"answer: {tmpl.error}")
        return Validation(True, value)

    def _template_text_answer(self) -> bool:
        """A template with text around its slot or several slots (not one bare slot, not one free-text slot)."""
        a = self.text_answer
        return isinstance(a, TemplateConstraint) and not a.template.is_single_slot

    def _plain_string_answer(self) -> bool:
        return self.text_field.get("type") == "string" and set(self.text_field) <= {"type", "minLength"}

    @staticmethod
    def _string_cap(answer: Constraint) -> int:
        """The token cap of a free-text answer: a single ``{str:N}`` slot keeps its N, anything else 64."""
        if isinstance(answer, TemplateConstraint) and answer.template.is_single_slot:
            slot = answer.template.slots[0]
            if slot.kind == "str":
                return slot.max_tokens()
        return STR_SLOT_MAX_TOKENS

    @staticmethod
    def answer_bound(answer: Constraint, default: int) -> int:
        """Tokens the JSON-encoded answer can take: numbers as is; strings add quotes and, at worst, an escape
        per character; a record is written without escapes, so its own bound is exact."""
        if isinstance(answer, NumberOr):
            return max(NUMBER_TOKENS, JsonReasonAnswer.answer_bound(answer.inner, default))
        if isinstance(answer, RecordConstraint):
            return answer.max_tokens
        inner = answer.max_tokens if answer.max_tokens is not None else default
        schema = answer.answer_schema()
        if schema.get("type") in ("integer", "number"):
            return inner
        if schema.get("type") == "string" and set(schema) <= {"type", "minLength"}:
            return JsonReasonAnswer._string_cap(answer) + 2
        if isinstance(answer, TemplateConstraint) and schema.get("type") == "string":
            return answer.template.json_string_bytes() + 2
        return 2 * inner + 2

    @property
    def max_tokens(self) -> int | None:
        if self.answer.max_tokens is None:
            return None
        # Literal scaffolding bytes + the layout's whitespace + the reason cap + the answer's bound.
        return JSON_SCAFFOLD + layout_tokens(self.layout) + self.reason_tokens + self.answer_bound(self.answer, 0)


ANSWER_SCAFFOLD = len(b'{"answer": }')
ANSWER_WS_RUNS = 6  # before the object, after "{", around ":", after the value, after "}"
ANSWER_WS_TOKENS = 3  # ours: the engine's cap on each (its count can take in the token before a run)


class JsonAnswerObject(Constraint):
    """Paper 003's one-field JSON answer, ``{"answer": <typed answer>}`` (appendix A.2): InWriting's and
    NL-to-Format's answer in the JSON form (strategy spec ``NAME@LEVEL:json``), the reasoning before it free.

    The answer value is typed exactly as the JSON strategy's ``answer`` field (the same rules,
    :class:`JsonReasonAnswer`); JSON whitespace may stand around the structural tokens, capped by the engine at
    :data:`ANSWER_WS_TOKENS` tokens per run, so the grammar alone bounds the object and a server can enforce it.
    Ours: a free-text (FC) answer is an escape-free string here (the engine caps it, and an engine cap may not end inside an escape;
    the JSON strategy's policy-kept caps are for its reason). ``validate`` extracts the answer value itself."""

    kind = "json-answer"

    def __init__(self, answer: Constraint) -> None:
        self.answer = answer
        self._fields = JsonReasonAnswer(answer, reason_tokens=1, escapes=False)
        self.answer_field = self._fields.answer_field
        self.source = answer.describe()
        field = {k: v for k, v in self.answer_field.items() if k not in ("$defs", "definitions")}
        defs: dict[str, Any] = {k: self.answer_field[k] for k in ("$defs", "definitions") if k in self.answer_field}
        self.schema: dict[str, Any] = {"type": "object", "properties": {"answer": field}, "required": ["answer"],
                                       "additionalProperties": False, **defs}
        self._validator = schema_validator(self.schema)

    def search(self, text: str) -> Validation:
        """The object the free text ends with (:func:`~formtax.constraints.jsontail.trailing_json_object`)."""
        from formtax.constraints.jsontail import trailing_json_object

        found = trailing_json_object(text)
        if found is None:
            return Validation(False, error='the text does not end with a JSON object {"answer": ...}')
        return self.validate(found)

    @cached_property
    def grammar(self) -> str:
        inner = self._fields.lark_answer_rules()
        lark = ('start: ws? "{" ws? "\\"answer\\"" ws? ":" ws? answer ws? "}" ws?\n'
                f'ws[max_tokens={ANSWER_WS_TOKENS}]: ' + '/[\\x20\\t\\n\\r]+/\n' + inner)
        return llguidance.grammar_from("lark", lark)

    @property
    def may_repeat_keys(self) -> bool:
        return self.answer.may_repeat_keys  # the wrapper's own keys are fixed by its grammar

    def validate(self, text: str) -> Validation:
        value, failed = _load_checked(text, self._validator)
        if failed is not None:
            return failed
        if (lexical := integer_literal_error(text, self.answer_field)) is not None:
            return Validation(False, value, error=lexical)
        inner = self._fields.validate(json.dumps({"reason": "", "answer": value["answer"]}, ensure_ascii=False))
        if not inner.ok:
            return Validation(False, value, error=inner.error)
        return Validation(True, value["answer"])

    def answer_schema(self) -> dict[str, Any]:
        return self.schema

    @property
    def max_tokens(self) -> int | None:
        if self.answer.max_tokens is None:
            return None
        return ANSWER_SCAFFOLD + ANSWER_WS_RUNS * ANSWER_WS_TOKENS + JsonReasonAnswer.answer_bound(self.answer, 0)


def string_value_span(text: str, key: str) -> tuple[int, int] | None:
    """The character span of the string value of top-level ``key`` in the JSON object ``text`` (from its opening
    quote to its closing one, both included); None when the key is absent, not a string, or the text ends first.
    A scanner of depth, strings and escapes: the json strategy's output is grammar-made, so that is all it tracks
    (the reason's tokens are counted as reasoning, issue 49)."""
    depth, i, n = 0, 0, len(text)
    expect_key = False
    last_key: str | None = None
    while i < n:
        ch = text[i]
        if ch == '"':
            j, escaped = i + 1, False
            while j < n and (escaped or text[j] != '"'):
                escaped = not escaped and text[j] == "\\"
                j += 1
            if j >= n:
                return None
            if depth == 1 and expect_key:
                last_key, expect_key = json.loads(text[i : j + 1]), False
            elif depth == 1 and last_key == key:
                return i, j + 1
            i = j + 1
            continue
        if ch in "{[":
            depth += 1
            expect_key = depth == 1 and ch == "{"
        elif ch in "}]":
            depth -= 1
        elif ch == "," and depth == 1:
            expect_key, last_key = True, None
        elif ch == ":" and depth == 1:
            pass
        i += 1
    return None
