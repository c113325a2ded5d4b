"""JSON Schema to grammar: the grammar the engine compiles for a schema, exact where it can be and otherwise a
flagged approximation (issue 36), and the refusal of numeric bounds the engine would get wrong.

Apart from the constraint types (spec.py) because it is a translation driven by the grammar engine's own errors,
with its own rules and cache, while ``JsonConstraint`` holds the oracle that checks every answer against the schema
as given. Light (no torch): spec.py imports it, and the engine's byte tokenizer is loaded only when a schema is
first translated.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable
from typing import Any

import llguidance

from formtax.errors import ConstraintError

# Compact JSON with fixed separators, the same as Python's json.dumps: engines that let the model pick its
# whitespace are known to run away on newlines.
JSON_OPTIONS: dict[str, Any] = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
"""The keywords whose value maps names to subschemas (its keys are names, not keywords)."""


_UNIMPLEMENTED = re.compile(r'Unimplemented keys: \[(.*?)\]')
_UNKNOWN_FORMAT = re.compile(r"Unknown format: (.+)")
APPROXIMATION_ROUNDS = 8


def approximate_schema(schema: dict[str, Any]) -> tuple[str, tuple[str, ...]]:
    """:func:`_approximate` of ``schema``, cached by its JSON text (a server builds a constraint per request). The
    text keeps the schema's key order: the grammar writes an object's properties in the order they are declared."""
    return _approximate_text(json.dumps(schema))


@functools.lru_cache(maxsize=256)
def _approximate_text(text: str) -> tuple[str, tuple[str, ...]]:
    return _approximate(json.loads(text))


def _approximate(schema: dict[str, Any]) -> tuple[str, tuple[str, ...]]:
    """The grammar for ``schema``: exact where the grammar engine implements every keyword, else a flagged
    approximation, driven by the engine's own errors (ours, issue 36):

    * ``oneOf`` -> ``anyOf`` (llguidance's ``coerce_one_of``): the grammar may admit a value two branches match;
    * an unknown ``format`` -> a plain string of that type;
    * a keyword the engine does not implement (``not``, ``uniqueItems``, ``if``/``then``/``else``, ``contains``,
      ``dependentRequired``, ``propertyNames``, ...) -> dropped from the grammar wherever it stands.

    Each approximation only widens what the grammar admits, and every answer is checked again against the schema
    as given (:meth:`~formtax.constraints.spec.JsonConstraint.validate`), so an answer that breaks a dropped rule comes back unparsed, never
    as valid. Returns (grammar, the approximations made, each as a short phrase). Raises ConstraintError for what
    cannot be approximated (an unresolvable ``$ref``, a schema the engine rejects for another reason)."""
    from formtax.constraints.compile import _byte_engine_tokenizer  # lazy: compile loads torch

    engine = _byte_engine_tokenizer()
    options = dict(JSON_OPTIONS)
    work: Any = _integral_counts(schema)
    made: list[str] = []
    for _ in range(APPROXIMATION_ROUNDS):
        grammar = llguidance.LLMatcher.grammar_from_json_schema(work, overrides=options)  # type: ignore[arg-type]
        m = llguidance.LLMatcher(engine.ll, grammar, log_level=0)
        if not m.is_error():
            return grammar, tuple(made)
        error = m.get_error().strip()
        if "coerce_one_of" in error and not options.get("coerce_one_of"):
            options["coerce_one_of"] = True
            made.append("oneOf as anyOf")
            continue
        keys = _UNIMPLEMENTED.search(error)
        fmt = _UNKNOWN_FORMAT.search(error)
        if keys:
            names = frozenset(k.strip().strip('"') for k in keys.group(1).split(",") if k.strip())
            work = _without(work, _named(names))
            made.extend(f"{k}: checked by the oracle only" for k in sorted(names))
        elif fmt:
            name = fmt.group(1).strip().strip('"')
            work = _without(work, _format(name))
            made.append(f"format {name}: a plain string")
        else:
            break
    reason = " ".join(line.strip() for line in error.splitlines() if line.strip())  # the engine's own reason, whole
    raise ConstraintError(f"the grammar engine rejected the JSON schema: {reason}")


_COUNTS = ("maxItems", "minItems", "maxLength", "minLength", "maxProperties", "minProperties", "minContains",
           "maxContains")


def _integral_counts(schema: Any, in_map: bool = False) -> Any:
    """``schema`` with every count keyword written as an integral float (``"maxItems": 2.0``, valid JSON Schema)
    as the integer the engine expects: the same schema, not an approximation."""
    if isinstance(schema, list):
        return [_integral_counts(x) for x in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for k, v in schema.items():
        if not in_map and k in _COUNTS and isinstance(v, float) and v.is_integer():
            out[k] = int(v)
        elif not in_map and k in ("const", "enum", "default", "examples"):
            out[k] = v
        else:
            out[k] = _integral_counts(v, in_map=not in_map and k in SCHEMA_MAPS)
    return out


def _named(names: frozenset[str]) -> Callable[[str, Any], bool]:
    return lambda key, _value: key in names


def _format(name: str) -> Callable[[str, Any], bool]:
    return lambda key, value: key == "format" and value == name


def _without(schema: Any, drop: Callable[[str, Any], bool], in_map: bool = False) -> Any:
    """A copy of ``schema`` less every keyword ``drop(key, value)`` names, in every subschema (not in the keys of
    ``properties`` and the like, which are names, not keywords; nor inside ``const`` / ``enum`` values)."""
    if isinstance(schema, list):
        return [_without(x, drop) for x in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for k, v in schema.items():
        if in_map:
            out[k] = _without(v, drop)
        elif drop(k, v):
            continue
        elif k in ("const", "enum", "default", "examples"):
            out[k] = v
        else:
            out[k] = _without(v, drop, in_map=k in SCHEMA_MAPS)
    return out


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


def check_number_bounds(schema: Any) -> None:
    """Refuse numeric bounds the grammar engine gets wrong (found by the fuzz suite: ``exclusiveMinimum: 0`` with
    a tiny maximum admits ``0``; integer bounds past 2^53 admit neighbours, float precision): each bound's
    just-outside values are run through the engine's grammar of that sub-schema, and one it accepts is an error
    up front instead of an answer the oracle rejects at run time."""
    if isinstance(schema, list):
        for v in schema:
            check_number_bounds(v)
        return
    if not isinstance(schema, dict):
        return
    for v in schema.values():
        if isinstance(v, (dict, list)):
            check_number_bounds(v)
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
