r"""Constraint specifications: what a user writes, checked before any model call.

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
``{"answer": <SPEC's value>}``, constraints/jsonreason.py), ``number-or:TEMPLATE`` (a JSON answer that is
the template's text as a string or a JSON number: paper 003's FC where the prompt's answer is a number).

``record:{"Victim": "{str:5}", "Place": "{choice:none|a b|c}", "Count": "{int:0..}"}`` is a flat JSON object
with exactly these keys in this order, written compactly as ``json.dumps(..., ensure_ascii=False)`` writes it
(``{"Victim": "the mayor", "Place": null, "Count": 2}``). Each value is ``null`` or typed by its template
slot: ``{int...}`` values are bare JSON integers; ``{str}``, ``{str:N}``, ``{letters...}`` and
``{choice:...}`` values are JSON strings whose content the slot accepts and which hold no ``"``, ``\``,
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
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import jsonschema
import llguidance

from formtax.constraints.bounded_re import bounded_checks
from formtax.constraints.finalanswer import answer_after
from formtax.constraints.formats import CHECKED_FORMATS, schema_validator
from formtax.constraints.schema_approx import SCHEMA_MAPS, approximate_schema, check_number_bounds
from formtax.constraints.template import (
    Template,
    key_phrase_of,
    lark_string,
    parse_template,
)
from formtax.errors import ConstraintError

# One character of a JSON string body that needs no escape (DEL excluded too): every prefix of a body made of
# these is still a valid body, so an engine max_tokens cut can never leave half an escape behind.
NO_ESCAPE_CHAR = r'[^"\\\x00-\x1F\x7F]'


NEEDS_ESCAPE = re.compile(r'["\\\x00-\x1f\x7f]')


@dataclass(frozen=True)
class Validation:
    """The oracle's verdict on one output."""

    ok: bool
    value: Any = None
    error: str | None = None
    unchecked: str | None = None  # a part of the check that could not be decided in its time bound (bounded_re.py)


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

    @property
    def may_repeat_keys(self) -> bool:
        """Whether the grammar lets a JSON object repeat a key (the policy then bans repeats:
        constraints/jsonkeys.py)."""
        return False

    def answer_schema(self) -> dict[str, Any]:
        raise ConstraintError(f"a {self.kind} constraint cannot describe a JSON answer field")

    def describe(self) -> str:
        return f"{self.kind}:{self.source}"

    def brief(self, width: int = 80) -> str:
        """:meth:`describe` cut to ``width`` characters, for one-line messages (a schema can be kilobytes)."""
        d = " ".join(self.describe().split())
        return d if len(d) <= width else d[: width - 1] + "…"

    def check(self) -> None:
        """Fail with a ConstraintError naming the problem if the engine rejects the grammar."""
        err = grammar_error(self.grammar)
        if err:
            raise ConstraintError(f"invalid {self.kind} constraint {self.source!r}: {err.strip()}")


@functools.lru_cache(maxsize=256)
def grammar_error(grammar: str) -> str:
    """llguidance's verdict on a grammar ("" when it compiles), cached by the grammar's text: vLLM's plugin checks
    a request's answer in ``validate_params`` and again when it builds the row, about 5 ms each (issue 44's
    profile), and a server sees the same few answers again and again."""
    return str(llguidance.LLMatcher.validate_grammar(grammar) or "")


ANSWER_LINE = "The answer is:"
"""The opening of paper 003's answer line, which the strict parser reads only as the output's last line
(:data:`formtax.tasks.base.ANSWER_PREFIX` starts with it)."""


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
        """The answer in free text, read as the runner's strict parser reads it (issue 49: one parser). A template
        that opens with :data:`ANSWER_LINE` (``The answer is: {int}``, paper 003's answer line) names a line: the
        last non-empty line, stripped, must be the template (any white space after its opening, as the strict
        parser strips it), with one optional trailing period, so ``The answer is: 5\nBecause 2+3=5.`` has no
        answer. Any other template (a key phrase such as ``The final answer is {int}``, or a bare slot) is read at
        its last occurrence anywhere, as the strict key-phrase parser reads it: a phrase and one word-like slot by
        the shared final-answer rule (:mod:`formtax.constraints.finalanswer`)."""
        first = self.template.parts[0] if self.template.parts else None
        if isinstance(first, str) and first.startswith(ANSWER_LINE):
            lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
            last = lines[-1] if lines else ""
            if last.startswith(first):  # the strict parser strips the white space after the line's prefix
                last = first + last[len(first):].lstrip()
            for candidate in (last, last[:-1]) if last.endswith(".") else (last,):
                vals = self.template.match(candidate)
                if vals is not None:
                    return Validation(True, vals[0] if len(vals) == 1 else vals)
            return Validation(False, error=f"the last line is not the template {self.source!r}")
        phrase = key_phrase_of(self.template)
        if phrase is not None:  # the one final-answer rule every strategy's reader shares (issue 60)
            raw = answer_after(text, phrase)
            if raw is None:
                return Validation(False, error=f"no occurrence of template {self.source!r}")
            return self.validate(phrase + raw)
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


def refuse_constant(name: str) -> Any:
    """A json ``parse_constant``: ``NaN``, ``Infinity`` and ``-Infinity`` are not JSON (RFC 8259 has no such
    numbers), though ``json.loads`` reads them; a JSONDecodeError, as for any other text that is not JSON."""
    raise json.JSONDecodeError(f"{name} is not a JSON number (RFC 8259)", name, 0)


def load_json(text: str) -> Any:
    """``json.loads`` that refuses repeated keys (:class:`DuplicateKey`), which ``json.loads`` would merge into the
    last one: ``{"a": 1, "a": "x"}`` is no valid answer to a schema whatever its last value; and ``NaN`` /
    ``Infinity`` (:func:`refuse_constant`), which jsonschema would take for numbers."""
    return json.loads(text, object_pairs_hook=no_duplicate_keys, parse_constant=refuse_constant)


def schema_error(e: jsonschema.SchemaError) -> str:
    """A schema error that names where it is: ``properties.a.type: 'integr' is not valid ...``."""
    where = ".".join(str(p) for p in e.path)
    message = e.message
    if e.context:  # an anyOf/oneOf of the metaschema: the deepest cause says what is wrong
        best = jsonschema.exceptions.best_match(e.context)
        if best is not None:
            message = best.message
            where = ".".join(str(p) for p in (*e.path, *best.path)) or where
    return f"{where}: {message}" if where else message


def distinct_subschemas(schema: Any, in_map: bool = False) -> Any:
    """``schema`` with each ``properties`` / ``$defs`` / ... map keeping one entry per distinct subschema: what the
    metaschema check needs, since it checks every entry of such a map against the same metaschema, so a repeated
    subschema has the verdict of its first copy. 1,000 properties of one shape take jsonschema's ``check_schema`` 0.5-1.8
    s of CPU; their distinct shapes, milliseconds (issue 58: a hopeless budget is refused in under a second). Entries
    are dropped only from the copy checked; ``$ref`` targets are not resolved by that check."""
    if isinstance(schema, list):
        return [distinct_subschemas(x) for x in schema]
    if not isinstance(schema, dict):
        return schema
    if in_map:
        seen: set[str] = set()
        kept: dict[str, Any] = {}
        for k, v in schema.items():
            text = json.dumps(v, sort_keys=True)
            if text not in seen:
                seen.add(text)
                kept[k] = distinct_subschemas(v)
        return kept
    return {k: (v if k in ("const", "enum", "default", "examples")
                else distinct_subschemas(v, in_map=k in SCHEMA_MAPS)) for k, v in schema.items()}


def formats_in(schema: Any) -> set[str]:
    """Every ``format`` value a schema names (in any subschema)."""
    out: set[str] = set()
    if isinstance(schema, dict):
        fmt = schema.get("format")
        if isinstance(fmt, str):
            out.add(fmt)
        for k, v in schema.items():
            if k not in ("const", "enum", "default", "examples"):
                out |= formats_in(v)
    elif isinstance(schema, list):
        for v in schema:
            out |= formats_in(v)
    return out


class JsonConstraint(Constraint):
    kind = "json"

    def __init__(self, schema: dict[str, Any], source: str | None = None) -> None:
        try:
            jsonschema.validators.validator_for(schema).check_schema(distinct_subschemas(schema))
        except jsonschema.SchemaError as e:
            raise ConstraintError(f"invalid JSON schema: {schema_error(e)}") from e
        self.schema = schema
        self.source = source or json.dumps(schema, sort_keys=True)
        self._validator = schema_validator(schema)

    @property
    def unchecked_formats(self) -> tuple[str, ...]:
        """Formats the oracle's checker does not know (constraints/formats.py): the answer's value for them is
        checked by nothing but, where the engine knows the format, the grammar (``Result.stats
        ["formats_unchecked"]``)."""
        return tuple(sorted(formats_in(self.schema) - CHECKED_FORMATS))

    @cached_property
    def _form(self) -> tuple[str, tuple[str, ...]]:
        return approximate_schema(self.schema)

    @property
    def grammar(self) -> str:
        return self._form[0]

    @cached_property
    def may_repeat_keys(self) -> bool:
        from formtax.constraints.openobjects import schema_may_repeat_keys

        return schema_may_repeat_keys(self.schema)

    @property
    def approximations(self) -> tuple[str, ...]:
        """What the grammar leaves to the oracle (empty: the grammar is the schema); see
        :func:`~formtax.constraints.schema_approx.approximate_schema`. The oracle (``validate``) always checks the schema as given."""
        return self._form[1]

    def validate(self, text: str) -> Validation:
        try:
            value = load_json(text)
        except json.JSONDecodeError as e:
            return Validation(False, error=f"not JSON: {e}")
        except DuplicateKey as e:
            return Validation(False, error=f"not a valid object: {e}")
        return self._judge(value)

    def _judge(self, value: Any) -> Validation:
        """The schema's verdict on a parsed value, every regex search bounded in time (bounded_re.py): a check
        that cannot be decided in its bound is reported unchecked, never a hang."""
        with bounded_checks() as checks:
            errors = sorted(self._validator.iter_errors(value), key=lambda e: list(e.path))
        if errors:
            return Validation(False, value, error=f"schema violation: {errors[0].message}",
                              unchecked=checks.unchecked)
        return Validation(True, value, unchecked=checks.unchecked)

    def search(self, text: str) -> Validation:
        dec = json.JSONDecoder(object_pairs_hook=no_duplicate_keys)
        last: Validation = Validation(False, error="no JSON value found")
        for m in re.finditer(r"[{\[]", text):
            try:
                value, _ = dec.raw_decode(text, m.start())
            except (json.JSONDecodeError, DuplicateKey):
                continue
            verdict = self._judge(value)
            if verdict.ok:
                last = verdict
        return last

    def answer_schema(self) -> dict[str, Any]:
        return self.schema

    def check(self) -> None:
        super().check()
        check_number_bounds(self.schema)


class LarkConstraint(Constraint):
    kind = "lark"

    def __init__(self, grammar_text: str) -> None:
        self.source = grammar_text

    @cached_property
    def grammar(self) -> str:
        return llguidance.grammar_from("lark", self.source)

    @property
    def may_repeat_keys(self) -> bool:
        return "%json" in self.source  # an embedded JSON schema (tool calls): conservatively open

    def validate(self, text: str) -> Validation:
        # No Python Lark engine is used: the oracle is the engine itself run on the text's canonical bytes.
        from formtax.constraints.compile import validate_with_engine

        ok, err = validate_with_engine(self.grammar, text)
        return Validation(ok, text if ok else None, None if ok else err)


class DuplicateKey(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(f"duplicate key {key!r}")
        self.key = key


def no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A json ``object_pairs_hook``: a dict (order kept) that refuses the repeated keys a dict would merge."""
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise DuplicateKey(k)
        out[k] = v
    return out
