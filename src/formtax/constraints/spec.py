"""Constraint specifications: what a user writes, checked before any model call.

A :class:`Constraint` is tokenizer-independent. It knows

* ``grammar``: the llguidance grammar text (what masks tokens),
* ``validate(text)``: an *independent* Python oracle (``re.fullmatch`` / ``jsonschema``) that says whether a finished
  output satisfies the constraint and extracts its value (so engine bugs show up as parse failures, never silently),
* ``max_tokens``: an upper bound on the tokens needed to finish it from the start, when the language is bounded
  (strategies reserve that much of the budget so the answer always completes),
* ``answer_schema()``: the JSON Schema of the answer, for the ``json`` (reason + answer) strategy.

SPEC strings (CLI ``--answer``): a template by default (``The answer is: {int}``), or ``regex:PATTERN``,
``json:SCHEMA`` (inline JSON or ``@file``), ``choice:a|b|c``, ``lark:GRAMMAR`` (inline or ``@file``).
"""

from __future__ import annotations

import json
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import jsonschema
import llguidance

from formtax.constraints.template import STR_SLOT_MAX_TOKENS, Template, lark_string, parse_template
from formtax.errors import ConstraintError

# Compact JSON with fixed separators, the same as Python's json.dumps: engines that let the model pick its
# whitespace are known to run away on newlines.
JSON_OPTIONS: dict[str, Any] = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


@dataclass(frozen=True)
class Validation:
    """The oracle's verdict on one output."""

    ok: bool
    value: Any = None
    error: str | None = None


class Constraint(ABC):
    """A tokenizer-independent output constraint."""

    kind: str
    source: str

    @property
    @abstractmethod
    def grammar(self) -> str:
        """The llguidance grammar (TopLevelGrammar JSON text)."""

    @abstractmethod
    def validate(self, text: str) -> Validation:
        """Whether ``text`` (the whole constrained output) satisfies the constraint, and its value."""

    def search(self, text: str) -> Validation:
        """Find an answer inside free text (used to read the answers of unconstrained strategies)."""
        return self.validate(text.strip())

    @property
    def max_tokens(self) -> int | None:
        """An upper bound on tokens to finish from the start (EOS excluded), or None when unbounded."""
        return None

    def answer_schema(self) -> dict[str, Any]:
        raise ConstraintError(f"a {self.kind} constraint cannot describe a JSON answer field")

    def describe(self) -> str:
        return f"{self.kind}:{self.source}"

    def check(self) -> None:
        """Fail with a ConstraintError naming the problem if the engine rejects the grammar."""
        err = llguidance.LLMatcher.validate_grammar(self.grammar)
        if err:
            raise ConstraintError(f"invalid {self.kind} constraint {self.source!r}: {err.strip()}")


class TemplateConstraint(Constraint):
    kind = "template"

    def __init__(self, source: str) -> None:
        self.source = source
        self.template: Template = parse_template(source)

    @cached_property
    def grammar(self) -> str:
        return llguidance.grammar_from("lark", self.template.lark())

    def validate(self, text: str) -> Validation:
        vals = self.template.match(text)
        if vals is None:
            return Validation(False, error=f"does not match template {self.source!r}")
        return Validation(True, vals[0] if len(vals) == 1 else vals)

    def search(self, text: str) -> Validation:
        found = self.template.search_last(text)
        if found is None:
            return Validation(False, error=f"no occurrence of template {self.source!r}")
        vals = found[1]
        return Validation(True, vals[0] if len(vals) == 1 else vals)

    @property
    def max_tokens(self) -> int:
        return self.template.max_tokens()

    def answer_schema(self) -> dict[str, Any]:
        if self.template.is_single_slot:
            return self.template.slots[0].json_schema()
        return {"type": "string", "pattern": "^" + self.template.py_regex(capture=False) + "$"}


class RegexConstraint(Constraint):
    kind = "regex"

    def __init__(self, pattern: str) -> None:
        self.source = pattern
        try:
            self._re = re.compile(pattern)
        except re.error as e:
            raise ConstraintError(f"invalid regex {pattern!r}: {e}") from e

    @cached_property
    def grammar(self) -> str:
        return llguidance.grammar_from("regex", self.source)

    def validate(self, text: str) -> Validation:
        if self._re.fullmatch(text) is None:
            return Validation(False, error=f"does not fullmatch regex {self.source!r}")
        return Validation(True, text)

    def search(self, text: str) -> Validation:
        last = None
        for m in self._re.finditer(text):
            if m.group(0):
                last = m.group(0)
        if last is None:
            return Validation(False, error=f"no match of regex {self.source!r}")
        return Validation(True, last)

    def answer_schema(self) -> dict[str, Any]:
        return {"type": "string", "pattern": "^(?:" + self.source + ")$"}


class ChoiceConstraint(Constraint):
    kind = "choice"

    def __init__(self, options: list[str]) -> None:
        if not options or any(o == "" for o in options):
            raise ConstraintError("choice: needs non-empty alternatives, e.g. choice:yes|no")
        if len(set(options)) != len(options):
            raise ConstraintError(f"choice: duplicate alternatives in {options}")
        self.options = list(options)
        self.source = "|".join(options)

    @cached_property
    def grammar(self) -> str:
        alts = " | ".join(lark_string(o) for o in self.options)
        return llguidance.grammar_from("lark", f"start: {alts}\n")

    def validate(self, text: str) -> Validation:
        if text in self.options:
            return Validation(True, text)
        return Validation(False, error=f"{text!r} is not one of {self.options}")

    def search(self, text: str) -> Validation:
        best: tuple[int, str] | None = None
        for o in sorted(self.options, key=len, reverse=True):
            for m in re.finditer(r"(?<!\w)" + re.escape(o) + r"(?!\w)", text):
                if best is None or m.start() > best[0]:
                    best = (m.start(), o)
        if best is None:
            return Validation(False, error=f"none of {self.options} found")
        return Validation(True, best[1])

    @property
    def max_tokens(self) -> int:
        return max(len(o.encode()) for o in self.options)

    def answer_schema(self) -> dict[str, Any]:
        return {"enum": list(self.options)}


class JsonConstraint(Constraint):
    kind = "json"

    def __init__(self, schema: dict[str, Any], source: str | None = None) -> None:
        try:
            jsonschema.validators.validator_for(schema).check_schema(schema)
        except jsonschema.SchemaError as e:
            raise ConstraintError(f"invalid JSON schema: {e.message}") from e
        self.schema = schema
        self.source = source or json.dumps(schema, sort_keys=True)
        self._validator = jsonschema.validators.validator_for(schema)(schema)

    @cached_property
    def grammar(self) -> str:
        return llguidance.LLMatcher.grammar_from_json_schema(self.schema, overrides=JSON_OPTIONS)  # type: ignore[arg-type]

    def validate(self, text: str) -> Validation:
        try:
            value = json.loads(text)
        except json.JSONDecodeError as e:
            return Validation(False, error=f"not JSON: {e}")
        errors = sorted(self._validator.iter_errors(value), key=lambda e: list(e.path))
        if errors:
            return Validation(False, value, error=f"schema violation: {errors[0].message}")
        return Validation(True, value)

    def search(self, text: str) -> Validation:
        dec = json.JSONDecoder()
        last: Validation = Validation(False, error="no JSON value found")
        for m in re.finditer(r"[{\[]", text):
            try:
                value, _ = dec.raw_decode(text, m.start())
            except json.JSONDecodeError:
                continue
            if not list(self._validator.iter_errors(value)):
                last = Validation(True, value)
        return last

    def answer_schema(self) -> dict[str, Any]:
        return self.schema


class LarkConstraint(Constraint):
    kind = "lark"

    def __init__(self, grammar_text: str) -> None:
        self.source = grammar_text

    @cached_property
    def grammar(self) -> str:
        return llguidance.grammar_from("lark", self.source)

    def validate(self, text: str) -> Validation:
        # No Python Lark engine is used: the oracle is the engine itself run on the text's canonical bytes.
        from formtax.constraints.compile import validate_with_engine

        ok, err = validate_with_engine(self.grammar, text)
        return Validation(ok, text if ok else None, None if ok else err)


class JsonReasonAnswer(Constraint):
    """Paper 003's JSON strategy: ``{"reason": "<free text>", "answer": <typed answer>}``, compact.

    The reason string is capped at ``reason_tokens`` tokens by the engine (an llguidance ``max_tokens`` rule),
    after which the closing quote and the answer are forced: that is how the answer's budget is reserved.
    Our choice (documented): the reason is one line of text without double quotes or backslashes, because the
    cap can cut the text anywhere and an escape sequence cut in half would break the JSON.
    """

    kind = "json-reason"

    def __init__(self, answer: Constraint, reason_tokens: int) -> None:
        self.answer = answer
        self.reason_tokens = max(1, reason_tokens)
        self.answer_field = answer.answer_schema()
        self.source = f"reason+answer({answer.describe()})"
        self.schema: dict[str, Any] = {
            "type": "object",
            "properties": {"reason": {"type": "string"}, "answer": self.answer_field},
            "required": ["reason", "answer"],
            "additionalProperties": False,
        }
        self._validator = jsonschema.validators.validator_for(self.schema)(self.schema)

    @cached_property
    def grammar(self) -> str:
        # No escapes in the reason: the engine's max_tokens cut may fall anywhere, and every prefix of an
        # escape-free body is still a valid JSON string body (a cut inside "\\u12" would not be).
        body = r'/[^"\\\x00-\x1F\x7F]*/'
        if self._plain_string_answer():
            # A free-text answer (FC) gets the same capped, escape-free body as the reason.
            answer_rules = f'answer: "\\"" answer_body "\\""\nanswer_body[max_tokens={STR_SLOT_MAX_TOKENS}]: {body}\n'
        else:
            answer = "%json" + json.dumps(
                {**self.answer_field, "x-guidance": JSON_OPTIONS}, separators=(",", ":"), ensure_ascii=False
            )
            answer_rules = f"answer: {answer}\n"
        lark = (
            'start: "{\\"reason\\": \\"" reason "\\", \\"answer\\": " answer "}"\n'
            f"reason[max_tokens={self.reason_tokens}]: {body}\n" + answer_rules
        )
        return llguidance.grammar_from("lark", lark)

    def validate(self, text: str) -> Validation:
        try:
            value = json.loads(text)
        except json.JSONDecodeError as e:
            return Validation(False, error=f"not JSON: {e}")
        errors = list(self._validator.iter_errors(value))
        if errors:
            return Validation(False, value, error=f"schema violation: {errors[0].message}")
        return Validation(True, value)

    def _plain_string_answer(self) -> bool:
        return self.answer_field.get("type") == "string" and set(self.answer_field) <= {"type", "minLength"}

    @staticmethod
    def answer_bound(answer: Constraint, default: int) -> int:
        """Tokens the JSON-encoded answer can take: numbers as is; strings add quotes and, at worst, an escape
        per character."""
        inner = answer.max_tokens if answer.max_tokens is not None else default
        schema = answer.answer_schema()
        if schema.get("type") in ("integer", "number"):
            return inner
        if schema.get("type") == "string" and set(schema) <= {"type", "minLength"}:
            return STR_SLOT_MAX_TOKENS + 2
        return 2 * inner + 2

    @property
    def max_tokens(self) -> int | None:
        if self.answer.max_tokens is None:
            return None
        # Literal scaffolding bytes + the reason cap + the answer's bound.
        return JSON_SCAFFOLD + self.reason_tokens + self.answer_bound(self.answer, 0)


JSON_SCAFFOLD = len(b'{"reason": "", "answer": }')


def _read_arg(arg: str, what: str) -> str:
    if arg.startswith("@"):
        path = Path(arg[1:])
        try:
            return path.read_text(encoding="utf-8")
        except OSError as e:
            raise ConstraintError(f"{what}: cannot read {path}: {e.strerror}") from e
    return arg


def parse_spec(spec: str) -> Constraint:
    """Parse an answer SPEC (see the module docstring) and check it with the engine before any model call."""
    if not spec:
        raise ConstraintError("empty answer spec")
    c: Constraint
    if spec.startswith("regex:"):
        c = RegexConstraint(spec[len("regex:") :])
    elif spec.startswith("json:"):
        text = _read_arg(spec[len("json:") :], "json")
        try:
            schema = json.loads(text)
        except json.JSONDecodeError as e:
            raise ConstraintError(f"json: the schema is not valid JSON: {e}") from e
        if not isinstance(schema, dict):
            raise ConstraintError("json: the schema must be a JSON object")
        c = JsonConstraint(schema, source=text.strip())
    elif spec.startswith("choice:"):
        c = ChoiceConstraint(spec[len("choice:") :].split("|"))
    elif spec.startswith("lark:"):
        c = LarkConstraint(_read_arg(spec[len("lark:") :], "lark"))
    elif spec.startswith("template:"):
        c = TemplateConstraint(spec[len("template:") :])
    else:
        c = TemplateConstraint(spec)
    c.check()
    return c


def from_pydantic(model: type[Any]) -> JsonConstraint:
    """A JSON constraint from a Pydantic model class."""
    schema = model.model_json_schema()
    c = JsonConstraint(schema, source=model.__name__)
    c.check()
    return c


def as_constraint(answer: str | Constraint | type[Any] | dict[str, Any]) -> Constraint:
    """Accept a SPEC string, a Constraint, a Pydantic model class or a JSON schema dict."""
    if isinstance(answer, Constraint):
        return answer
    if isinstance(answer, str):
        return parse_spec(answer)
    if isinstance(answer, dict):
        c = JsonConstraint(answer)
        c.check()
        return c
    if hasattr(answer, "model_json_schema"):
        return from_pydantic(answer)
    raise ConstraintError(f"cannot make a constraint from {type(answer).__name__}")
