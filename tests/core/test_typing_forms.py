"""The typing forms Outlines accepts as answer types (issue 36, point 2): Optional[int], list[int], int | str,
dict[str, int], a TypedDict, a dataclass, a tuple. Each becomes a JSON constraint from Pydantic's schema for the
type; ``parsed`` is the value Pydantic validates the JSON into."""

from __future__ import annotations

import dataclasses
import typing
from typing import Optional

import pytest
from typing_extensions import TypedDict

import formtax
from formtax.backends.fake import FakeBackend, random_logits
from formtax.constraints.native import as_constraint
from formtax.errors import ConstraintError


class Person(TypedDict):
    name: str
    age: int


@dataclasses.dataclass
class Point:
    x: int
    y: int


def _check_list_of_int(v):
    return isinstance(v, list) and all(type(x) is int for x in v)


CASES = [
    (Optional[int], lambda v: v is None or type(v) is int),  # noqa: UP045 - the form users write
    (list[int], _check_list_of_int),
    (int | str, lambda v: type(v) in (int, str)),
    (dict[str, int], lambda v: isinstance(v, dict) and all(type(x) is int for x in v.values())),
    (Person, lambda v: isinstance(v, dict) and set(v) == {"name", "age"} and type(v["age"]) is int),
    (Point, lambda v: isinstance(v, Point)),
    (tuple[int, str], lambda v: isinstance(v, tuple) and type(v[0]) is int and type(v[1]) is str),
]


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("tp, check", CASES, ids=[repr(c[0]) for c in CASES])
def test_typing_forms_are_answer_types(tp, check, seed):
    r = formtax.generate(FakeBackend(random_logits(seed=seed)), "q", "constrained", tp, max_tokens=80)
    assert r.parse_ok, (r.answer_text, r.error)
    assert check(r.parsed), repr(r.parsed)


def test_a_typed_dict_is_closed():
    schema = as_constraint(Person).answer_schema()
    assert schema["additionalProperties"] is False and set(schema["required"]) == {"name", "age"}


def test_a_value_instead_of_a_type_is_refused_clearly():
    with pytest.raises(ConstraintError, match="from the value 5; pass a type"):
        as_constraint(5)


def test_typing_typeddict_on_python_311_gets_one_clear_line():
    class Old(typing.TypedDict):
        a: int

    import sys

    if sys.version_info >= (3, 12):
        assert as_constraint(Old).answer_schema()["required"] == ["a"]
        return
    with pytest.raises(ConstraintError, match="typing_extensions.TypedDict") as e:
        as_constraint(Old)
    assert "\n" not in str(e.value)
