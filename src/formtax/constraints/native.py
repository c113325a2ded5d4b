"""Native Python answer types, as Outlines and vLLM take them: ``answer=int``, ``answer=["yes", "no"]``,
``answer=re.compile(...)``, ``answer=Literal[...]``, an ``Enum``, a Pydantic model, a JSON Schema dict.

Each becomes one of formtax's own constraints (regex, choice, JSON), so every strategy, the engine's masks and the
oracle treat it exactly as the equivalent SPEC string; what it adds is the *typed value*: the constraint carries a
converter, and ``Result.parsed`` is an ``int``, a ``bool``, the ``Enum`` member, the ``Literal`` value or an
instance of the Pydantic model instead of the answer's text or a dict. A conversion that fails (a Pydantic
validator the JSON Schema cannot express) makes the answer unparsed with the validator's message, never a crash.

Our choices, where the libraries differ: ``int`` is an optionally signed decimal integer without leading zeros, at
most 19 digits (a bounded language, so InWriting and json can reserve its length; Outlines' is unbounded);
``float`` a decimal number with optional fraction and exponent, bounded alike; ``bool`` the words ``true`` / ``false`` (JSON's);
``str`` one non-empty line. A Pydantic model's schema is *closed* (``additionalProperties: false`` on every object
that does not say otherwise), as the model means: with an open schema the engine lets the model add undeclared
keys until the budget runs out. ``from_pydantic(Model, closed=False)`` keeps the schema as Pydantic writes it.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import datetime
import decimal
import enum
import re
import types
import typing
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import typing_extensions

from formtax.constraints.parse import parse_spec
from formtax.constraints.spec import ChoiceConstraint, Constraint, JsonConstraint, RegexConstraint
from formtax.errors import ConstraintError

INT_REGEX = r"-?(0|[1-9][0-9]{0,18})"  # bounded (to 19 digits), so strategies can reserve its length
FLOAT_REGEX = r"-?(0|[1-9][0-9]{0,14})(\.[0-9]{1,15})?([eE][+-]?[0-9]{1,3})?"  # a double's digits
LINE_REGEX = r"[^\n]+"
DECIMAL_REGEX = r"-?(0|[1-9][0-9]{0,27})(\.[0-9]{1,28})?"  # a plain decimal, as Decimal(text) reads it exactly
FORMAT_TYPES = (datetime.datetime, datetime.date, datetime.time, uuid.UUID)
"""Answer types written as a JSON string of a format (date-time, date, time, uuid: Pydantic's schema), which the
grammar constrains and the oracle's format checker checks; ``parsed`` is the Python value."""
# RFC 3339 exactly (ours): the engine's date/time formats admit Feb 30 and 17:32:60, which the format checker
# (and Python) refuse, so each form adds a pattern the grammar intersects with its format: real calendar dates
# (29 February in leap years only), hours 00-23, minutes and seconds 00-59 (no leap second: Python has none)
_LEAP = r"(?:[0-9]{2}(?:0[48]|[2468][048]|[13579][26])|(?:[02468][048]|[13579][26])00)"
_DATE = (r"(?:[0-9]{4}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)"
         rf"|02-(?:0[1-9]|1[0-9]|2[0-8]))|{_LEAP}-02-29)")
_TIME = r"(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\.[0-9]{1,6})?(?:[Zz]|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])"
FORMAT_PATTERNS = {datetime.datetime: f"^{_DATE}[Tt]{_TIME}$", datetime.date: f"^{_DATE}$",
                   datetime.time: f"^{_TIME}$"}
ACCEPTED = ("a SPEC string (e.g. 'The answer is: {int}', 'choice:yes|no', 'regex:...', 'json:...'), a Constraint, "
            "int, float, bool, str, datetime, date, time, UUID, Decimal, a list or tuple of strings (a choice), typing.Literal[...], an Enum class, "
            "re.compile(...), a Pydantic model class, a typing form (Optional[int], list[int], int | str, "
            "dict[str, int], a TypedDict, a dataclass), or a JSON Schema dict")
_TYPING_ORIGINS = (list, dict, tuple, set, frozenset, typing.Union, types.UnionType, typing.Annotated,
                   collections.abc.Sequence, collections.abc.Mapping)


def typed(c: Constraint, convert: Callable[[Any], Any], type_name: str) -> Constraint:
    """``c`` with a converter for its parsed value (``Constraint.to_python``)."""
    c.converter = convert
    c.python_type = type_name
    return c


def _closed(schema: Any) -> Any:
    """Every object schema without its own ``additionalProperties`` gets ``false`` (recursively, ``$defs`` too)."""
    if isinstance(schema, dict):
        out = {k: _closed(v) for k, v in schema.items()}
        if out.get("type") == "object" and "properties" in out and "additionalProperties" not in out:
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_closed(v) for v in schema]
    return schema


def from_pydantic(model: type[Any], closed: bool = True) -> JsonConstraint:
    """A JSON constraint from a Pydantic model class; ``parsed`` is an instance of the model. ``closed``: forbid
    undeclared keys (module docstring)."""
    schema = model.model_json_schema()
    if closed:
        schema = _closed(schema)
    c = JsonConstraint(schema, source=model.__name__ + ("" if closed else " (open)"))
    c.check()

    def convert(value: Any) -> Any:
        return model.model_validate(value)

    return typed(c, convert, model.__name__)  # type: ignore[return-value]


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or repr(tp).replace("typing.", "")


def is_typing_form(answer: Any) -> bool:
    """Whether ``answer`` is a typing form :func:`from_type` takes (a generic alias, a union, a TypedDict, a
    dataclass), as opposed to the plain types with a form of their own (``int``, ``str``, ...)."""
    return (typing.get_origin(answer) in _TYPING_ORIGINS or typing_extensions.is_typeddict(answer)
            or (isinstance(answer, type) and dataclasses.is_dataclass(answer)))


def from_type(tp: Any, pattern: str | None = None) -> JsonConstraint:
    """A JSON constraint from a typing form (``Optional[int]``, ``list[int]``, ``int | str``, ``dict[str, int]``,
    a ``TypedDict``, a dataclass), as Outlines takes them: the answer is the JSON value, its schema is Pydantic's
    for the type (objects closed, as for a model) and ``parsed`` is the value Pydantic validates it into (a
    ``list`` of ``int``, ``None`` for JSON ``null``, the dataclass instance, ...). ``pattern``: a string
    pattern the schema adds (:data:`FORMAT_PATTERNS`)."""
    from pydantic import PydanticSchemaGenerationError, PydanticUserError, TypeAdapter

    try:
        adapter: TypeAdapter[Any] = TypeAdapter(tp)
        schema = _closed(adapter.json_schema())
        if pattern is not None:
            schema["pattern"] = pattern
    except (PydanticSchemaGenerationError, PydanticUserError, TypeError) as e:
        first = str(e).strip().splitlines()[0]
        raise ConstraintError(f"cannot make an answer constraint from the type {_type_name(tp)}: {first}") from e
    c = JsonConstraint(schema, source=_type_name(tp))
    c.check()
    return typed(c, adapter.validate_python, _type_name(tp))  # type: ignore[return-value]


def _choice(values: Sequence[Any], type_name: str) -> Constraint:
    """A choice over the values' texts, parsed back to the values themselves."""
    if not values:
        raise ConstraintError(f"an answer of type {type_name} needs at least one alternative")
    texts: dict[str, Any] = {}
    for v in values:
        if isinstance(v, enum.Enum):
            text = str(v.value)
        elif isinstance(v, bool):
            text = "true" if v else "false"
        elif isinstance(v, (str, int)):
            text = str(v)
        else:
            raise ConstraintError(f"{type_name}: alternatives must be strings or integers, got {v!r}")
        if text in texts:
            raise ConstraintError(f"{type_name}: two alternatives read {text!r}")
        texts[text] = v
    c = ChoiceConstraint(list(texts))
    c.check()
    return typed(c, texts.__getitem__, type_name)


def _regex(pattern: str, convert: Callable[[str], Any], type_name: str) -> Constraint:
    c = RegexConstraint(pattern)
    c.check()
    return typed(c, convert, type_name)


def as_constraint(answer: Any) -> Constraint:
    """Any accepted answer form (``ACCEPTED``) as a Constraint, with a typed converter where the form has a type."""
    if isinstance(answer, Constraint):
        return answer
    if isinstance(answer, str):
        return parse_spec(answer)
    if answer is int:
        return _regex(INT_REGEX, int, "int")
    if answer is float:
        return _regex(FLOAT_REGEX, float, "float")
    if answer is bool:
        return _choice([True, False], "bool")
    if answer is str:
        return _regex(LINE_REGEX, str, "str")
    if answer in FORMAT_TYPES:
        return from_type(answer, FORMAT_PATTERNS.get(answer))
    if answer is decimal.Decimal:
        return _regex(DECIMAL_REGEX, decimal.Decimal, "Decimal")
    if isinstance(answer, re.Pattern):
        if not isinstance(answer.pattern, str):
            raise ConstraintError("a bytes regex cannot be an answer; compile a str pattern")
        if answer.flags & ~re.UNICODE:
            raise ConstraintError(f"regex flags are not supported ({answer.flags!r}); write them into the pattern, "
                                  "e.g. [Yy]es instead of re.IGNORECASE")
        return _regex(answer.pattern, str, "str")
    if isinstance(answer, (list, tuple)):
        return _choice(list(answer), "choice")
    if isinstance(answer, str | int | float | bool | bytes) or answer is None:
        raise ConstraintError(f"cannot make an answer constraint from the value {answer!r}; pass a type or a SPEC "
                              f"string; accepted: {ACCEPTED}")
    if typing.get_origin(answer) is typing.Literal:
        return _choice(list(typing.get_args(answer)), "Literal")
    if isinstance(answer, type) and issubclass(answer, enum.Enum):
        return _choice(list(answer), answer.__name__)
    if isinstance(answer, dict):
        c = JsonConstraint(answer)
        c.check()
        return c
    if isinstance(answer, type) and hasattr(answer, "model_json_schema"):
        return from_pydantic(answer)
    if is_typing_form(answer):
        return from_type(answer)
    raise ConstraintError(f"cannot make an answer constraint from {answer!r} (a {type(answer).__name__}); "
                          f"accepted: {ACCEPTED}")
