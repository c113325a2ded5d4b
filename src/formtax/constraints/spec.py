"""Constraint specifications: what a user writes, checked before any model call.

A :class:`Constraint` is tokenizer-independent. It knows

* ``grammar``: the llguidance grammar text (what masks tokens),
* ``validate(text)``: an *independent* Python oracle (``re.fullmatch`` / ``jsonschema``) that says whether a finished
  output satisfies the constraint and extracts its value (so engine bugs show up as parse failures, never silently),
* ``max_tokens``: an upper bound on the tokens needed to finish it from the start, when the language is bounded
  (strategies reserve that much of the budget so the answer always completes),
* ``answer_schema()``: the JSON Schema of the answer, for the ``json`` (reason + answer) strategy.

SPEC strings (CLI ``--answer``): a template by default (``The answer is: {int}``), or ``regex:PATTERN``,
``json:SCHEMA`` (inline JSON or ``@file``), ``choice:a|b|c``, ``lark:GRAMMAR`` (inline or ``@file``),
``record:FIELDS`` (inline JSON or ``@file``), ``answer-json:SPEC`` (paper 003's one-field object
``{"answer": <SPEC's value>}``, constraints/jsonreason.py).

``record:{"Victim": "{str:5}", "Place": "{choice:none|a b|c}", "Count": "{int:0..}"}`` is a flat JSON object
with exactly these keys in this order, written compactly as ``json.dumps(..., ensure_ascii=False)`` writes it
(``{"Victim": "the mayor", "Place": null, "Count": 2}``). Each value is ``null`` or typed by its template
slot: ``{int...}`` values are bare JSON integers; ``{str}``, ``{str:N}``, ``{letters...}`` and
``{choice:...}`` values are JSON strings whose content the slot accepts and which hold no ``"``, ``\\``,
control character or DEL, so no escape is ever written (an engine ``max_tokens`` cut of a ``{str:N}`` body can
then never split an escape; choice alternatives that would need one are refused when the record is built).
:func:`record_spec` writes the SPEC from (key, slot) pairs. With the ``json`` strategy the record is the
``answer`` field, under the same exact grammar.
"""

from __future__ import annotations

import functools
import json
import re
import warnings
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import jsonschema
import llguidance

from formtax.constraints.template import (
    INT_LIMIT,
    Slot,
    Template,
    lark_string,
    parse_template,
)
from formtax.errors import ConstraintError

# Compact JSON with fixed separators, the same as Python's json.dumps: engines that let the model pick its
# whitespace are known to run away on newlines.
JSON_OPTIONS: dict[str, Any] = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}

# One character of a JSON string body that needs no escape (DEL excluded too): every prefix of a body made of
# these is still a valid body, so an engine max_tokens cut can never leave half an escape behind.
NO_ESCAPE_CHAR = r'[^"\\\x00-\x1F\x7F]'
_NEEDS_ESCAPE = re.compile(r'["\\\x00-\x1f\x7f]')


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
    converter: Callable[[Any], Any] | None = None  # native answer types: the parsed value's Python form
    python_type: str | None = None

    def to_python(self, value: Any) -> Any:
        """The parsed value as the answer's Python type (``constraints.native``); unchanged without a converter."""
        return value if self.converter is None else self.converter(value)

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


_DIALECT = (
    (re.compile(r"\\[pP]\{|\\[pP][A-Za-z]"), "Unicode property classes (\\p{...}) follow different Unicode tables in the "
     "engine and the oracle"),
    (re.compile(r"\\z"), "\\z is Rust's end of text, unknown to Python's re; drop it (the constraint is anchored "
     "anyway)"),
)


def _check_dialect(pattern: str) -> None:
    """formtax's regex dialect is what Rust's regex (the engine) and Python's re (the oracle) read alike; constructs
    where they differ are refused up front, naming the construct (set operations inside classes are caught by
    Python's own FutureWarning in :class:`RegexConstraint`)."""
    for rx, why in _DIALECT:
        if rx.search(pattern):
            raise ConstraintError(f"regex {pattern!r}: {why}")


REGEX_TIMEOUT_S = 0.25
"""Time the regex oracle may take on one output before the linear-time matcher decides."""


def _linear_fullmatch(grammar: str, text: str) -> bool:
    """Whether ``text`` is in the grammar's language, by llguidance over a byte-level tokenizer (ids 0-255 are
    the bytes): linear in the text, whatever the pattern."""
    from formtax.constraints.compile import compile_grammar

    m = compile_grammar(grammar, _byte_engine()).matcher(BYTE_LOGITS)
    return all(m.consume(b) for b in text.encode("utf-8")) and m.error is None and m.accepting


BYTE_LOGITS = 260  # 256 bytes + EOS, PAD and two role markers (bytetok.py)


@functools.lru_cache(maxsize=1)
def _byte_engine() -> Any:
    from formtax.bytetok import byte_tokenizer  # a leaf module: tokenizers and transformers only
    from formtax.constraints.compile import EngineTokenizer

    return EngineTokenizer(byte_tokenizer(), eos_ids=[256])


class RegexConstraint(Constraint):
    kind = "regex"

    def __init__(self, pattern: str) -> None:
        self.source = pattern
        _check_dialect(pattern)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error", FutureWarning)
                self._re = re.compile(pattern)
        except FutureWarning:
            raise ConstraintError(
                f"regex {pattern!r} uses set syntax inside a class ([[:alpha:]], &&, --, ~~) that the grammar engine "
                "(Rust's regex) and the oracle (Python's re) read differently; write the class out, e.g. [a-zA-Z]"
            ) from None
        except re.error as e:
            raise ConstraintError(f"invalid regex {pattern!r}: {e}") from e

    @cached_property
    def grammar(self) -> str:
        return llguidance.grammar_from("regex", self.source)

    def validate(self, text: str) -> Validation:
        """Fullmatch with the ``regex`` module under a time limit; a pattern that backtracks past it (e.g.
        ``(x+x+)+y``, exponential in Python's engines) is decided instead by llguidance's linear-time matcher
        replaying the text's bytes, so validation is never super-linear (ours: the fast path stays an engine
        independent of the one that decoded)."""
        try:
            ok = self._fast.fullmatch(text, timeout=REGEX_TIMEOUT_S) is not None
        except TimeoutError:
            ok = _linear_fullmatch(self.grammar, text)
        if not ok:
            return Validation(False, error=f"does not fullmatch regex {self.source!r}")
        return Validation(True, text)

    @cached_property
    def _fast(self) -> Any:
        import regex

        return regex.compile(self.source, flags=regex.VERSION0)

    def search(self, text: str) -> Validation:
        last = None
        try:
            for m in self._fast.finditer(text, timeout=REGEX_TIMEOUT_S):
                if m.group(0):
                    last = m.group(0)
        except TimeoutError:  # lenient search only: a pathological pattern finds nothing rather than hanging
            last = None
        if last is None:
            return Validation(False, error=f"no match of regex {self.source!r}")
        return Validation(True, last)

    def answer_schema(self) -> dict[str, Any]:
        # inline global flags such as (?i) must stay at the very start of the anchored pattern
        m = re.match(r"\(\?[aiLmsux]+\)", self.source)
        flags, body = (m.group(0), self.source[m.end() :]) if m else ("", self.source)
        return {"type": "string", "pattern": flags + "^(?:" + body + ")$"}


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

    def check(self) -> None:
        super().check()
        _check_number_bounds(self.schema)


_BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")


def _outside(key: str, bound: float, integer: bool) -> list[str]:
    """JSON numbers just outside a bound: the ones a correct grammar must refuse."""
    if key.startswith("exclusive"):
        texts = [json.dumps(bound)]
        if float(bound).is_integer():
            texts.append(str(int(bound)))
        return texts
    if integer and float(bound).is_integer():
        return [str(int(bound) + (1 if key == "maximum" else -1))]
    return []


def _check_number_bounds(schema: Any) -> None:
    """Refuse numeric bounds the grammar engine gets wrong (found by the fuzz suite: ``exclusiveMinimum: 0`` with
    a tiny maximum admits ``0``; integer bounds past 2^53 admit neighbours, float precision): each bound's
    just-outside values are run through the engine's grammar of that sub-schema, and one it accepts is an error
    up front instead of an answer the oracle rejects at run time."""
    if isinstance(schema, list):
        for v in schema:
            _check_number_bounds(v)
        return
    if not isinstance(schema, dict):
        return
    for v in schema.values():
        if isinstance(v, (dict, list)):
            _check_number_bounds(v)
    kinds = schema.get("type")
    if kinds not in ("number", "integer") or "$ref" in schema or not any(k in schema for k in _BOUNDS):
        return
    from formtax.constraints.compile import validate_with_engine

    sub = {k: v for k, v in schema.items() if k in (*_BOUNDS, "type", "multipleOf")}
    grammar = llguidance.LLMatcher.grammar_from_json_schema(sub, overrides=JSON_OPTIONS)  # type: ignore[arg-type]
    for key in _BOUNDS:
        bound = sub.get(key)
        if not isinstance(bound, (int, float)) or isinstance(bound, bool):
            continue
        for text in _outside(key, bound, kinds == "integer"):
            if validate_with_engine(grammar, text)[0]:
                raise ConstraintError(f"JSON schema: the grammar engine would accept {text}, outside {key} = {bound} "
                                      "(an engine limit for such bounds); widen or drop the bound")


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


class _DuplicateKey(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(f"duplicate key {key!r}")
        self.key = key


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A json ``object_pairs_hook``: a dict (order kept) that refuses the repeated keys a dict would merge."""
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise _DuplicateKey(k)
        out[k] = v
    return out


def _json_int(lo: int, hi: int) -> str:
    return "%json" + json.dumps({"type": "integer", "minimum": lo, "maximum": hi}, separators=(",", ":"))


def _int_alternatives(slot: Slot) -> list[str]:
    """An integer slot's Lark alternatives, split around 0: the engine's JSON integer alone would also write
    ``-0``, which ``json.dumps`` never does (the record oracle compares with the compact re-serialisation)."""
    lo = -INT_LIMIT if slot.lo is None else slot.lo
    hi = INT_LIMIT if slot.hi is None else slot.hi
    alts = []
    if lo < 0:
        alts.append(_json_int(lo, min(hi, -1)))
    if lo <= 0 <= hi:
        alts.append('"0"')
    if hi > 0:
        alts.append(_json_int(max(lo, 1), hi))
    return alts


def _field_rules(name: str, slot: Slot) -> list[str]:
    """Lark rules for one record value named ``name``: ``null`` or the slot's JSON value, escape-free."""
    quote = lark_string('"')
    if slot.kind == "int":
        return [f'{name}: "null" | ' + " | ".join(_int_alternatives(slot))]
    if slot.kind == "choice":
        options = (lark_string(json.dumps(o, ensure_ascii=False)) for o in slot.options)
        return [f'{name}: "null" | ' + " | ".join(options)]
    head = f'{name}: "null" | {quote} {name}_body {quote}'
    if slot.kind == "letters":
        return [head, f"{name}_body: {slot.lark_body()}"]
    return [head, f"{name}_body[max_tokens={slot.max_tokens()}]: /{NO_ESCAPE_CHAR}+/"]


def _field_error(slot: Slot, value: Any) -> str | None:
    """Why ``value`` (decoded JSON) is not a valid record value for ``slot``, or None when it is."""
    if value is None:
        return None
    if slot.kind == "int":
        if type(value) is not int:
            return f"{value!r} is not a JSON integer"
        return None if slot.accepts(str(value)) else f"{value} is outside {slot.source}"
    if not isinstance(value, str):
        return f"{value!r} is not a JSON string"
    if _NEEDS_ESCAPE.search(value):
        return f'{value!r} holds a character that needs a JSON escape (", \\, a control character or DEL)'
    return None if slot.accepts(value) else f"{value!r} is not accepted by {slot.source}"


def _check_record_fields(fields: tuple[tuple[str, Slot], ...]) -> None:
    if not fields:
        raise ConstraintError('record: needs at least one field, e.g. record:{"Victim": "{str:5}"}')
    seen: set[str] = set()
    for key, slot in fields:
        if not isinstance(key, str) or not key:
            raise ConstraintError(f"record: keys must be non-empty strings, got {key!r}")
        if key in seen:
            raise ConstraintError(f"record: duplicate key {key!r}")
        seen.add(key)
        if not isinstance(slot, Slot):
            raise ConstraintError(f"record: key {key!r} needs a template Slot, got {type(slot).__name__}")
        for option in slot.options:
            if _NEEDS_ESCAPE.search(option):
                raise ConstraintError(
                    f"record: key {key!r}: choice alternative {option!r} would need a JSON escape "
                    '(", \\, a control character or DEL); record strings are written without escapes'
                )


class RecordConstraint(Constraint):
    """A flat JSON object with fixed keys in a fixed order, each value ``null`` or typed by a template slot.

    Written compactly, exactly as ``json.dumps(value, ensure_ascii=False)`` writes it, with escape-free
    strings (see the module docstring): one spelling per value, so the oracle can demand the exact text, and a
    ``{str:N}`` body cut by the engine's token cap is still a valid JSON string.
    """

    kind = "record"

    def __init__(self, fields: Sequence[tuple[str, Slot]]) -> None:
        self.fields: tuple[tuple[str, Slot], ...] = tuple(fields)
        _check_record_fields(self.fields)
        self.source = json.dumps({k: s.source for k, s in self.fields}, ensure_ascii=False)

    @property
    def keys(self) -> tuple[str, ...]:
        return tuple(k for k, _ in self.fields)

    def _literals(self) -> list[str]:
        """The fixed text around the values: ``{"k0": ``, ``, "k1": ``, ..., ``}`` (one more than fields)."""
        keys = [json.dumps(k, ensure_ascii=False) + ": " for k in self.keys]
        return ["{" + keys[0], *(", " + k for k in keys[1:]), "}"]

    def lark_rules(self, top: str = "start") -> str:
        """Lark rules whose rule ``top`` is this record (other rules are named ``{top}_f{i}...``), so that the
        record can be embedded in a larger grammar, e.g. as the ``answer`` of :class:`JsonReasonAnswer`."""
        literals = self._literals()
        seq: list[str] = []
        rules: list[str] = []
        for i, (_, slot) in enumerate(self.fields):
            name = f"{top}_f{i}"
            seq += [lark_string(literals[i]), name]
            rules += _field_rules(name, slot)
        seq.append(lark_string(literals[-1]))
        return "\n".join([f"{top}: {' '.join(seq)}", *rules]) + "\n"

    @cached_property
    def grammar(self) -> str:
        return llguidance.grammar_from("lark", self.lark_rules())

    def validate(self, text: str) -> Validation:
        try:
            value = json.loads(text, object_pairs_hook=_no_duplicates)
        except ValueError as e:  # JSONDecodeError or a duplicate key
            return Validation(False, error=f"not a JSON object with distinct keys: {e}")
        return self._check_value(value, text)

    def _check_value(self, value: Any, text: str) -> Validation:
        if not isinstance(value, dict):
            return Validation(False, error="not a JSON object")
        if tuple(value) != self.keys:
            error = f"keys {list(value)} are not exactly {list(self.keys)} in order"
            return Validation(False, value, error=error)
        for key, slot in self.fields:
            err = _field_error(slot, value[key])
            if err is not None:
                return Validation(False, value, error=f"{key!r}: {err}")
        if json.dumps(value, ensure_ascii=False) != text:
            error = "not written compactly (separators ', ' and ': ', no escapes)"
            return Validation(False, value, error=error)
        return Validation(True, value)

    def search(self, text: str) -> Validation:
        """The last JSON object in free text whose value is a valid record. Free text is read leniently:
        whitespace and escapes are not held against the object (its compact re-serialisation must validate).
        """
        dec = json.JSONDecoder(object_pairs_hook=_no_duplicates)
        found = Validation(False, error=f"no JSON object with the keys {list(self.keys)}")
        for m in re.finditer(r"\{", text):
            try:
                value, _ = dec.raw_decode(text, m.start())
            except ValueError:
                continue
            if isinstance(value, dict):
                v = self._check_value(value, json.dumps(value, ensure_ascii=False))
                if v.ok:
                    found = v
        return found

    @property
    def max_tokens(self) -> int:
        # Every token carries at least one byte: the literal bytes bound their tokens; a value is at most
        # "null" or its slot's bound (+ 2 quotes for strings, which need no escapes).
        literal = sum(len(p.encode()) for p in self._literals())
        return literal + sum(self._value_bound(slot) for _, slot in self.fields)

    @staticmethod
    def _value_bound(slot: Slot) -> int:
        if slot.kind != "int":
            return max(4, slot.max_tokens() + 2)
        if slot.lo is not None and slot.hi is not None:  # canonical integers in [lo, hi]: no longer than ends
            return max(4, len(str(slot.lo)), len(str(slot.hi)))
        return max(4, slot.max_tokens())

    def answer_schema(self) -> dict[str, Any]:
        return {
            "type": "object",
            "properties": {k: {"anyOf": [{"type": "null"}, s.json_schema()]} for k, s in self.fields},
            "required": list(self.keys),
            "additionalProperties": False,
        }
