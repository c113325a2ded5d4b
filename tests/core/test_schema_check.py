"""The metaschema check reads one copy of each distinct subschema of a map (issue 58: 3,000 properties of one shape
are checked in milliseconds), with the same verdict as the whole schema."""

from __future__ import annotations

import jsonschema
import pytest

from formtax.constraints.spec import JsonConstraint, distinct_subschemas
from formtax.errors import ConstraintError


def test_repeated_subschemas_are_checked_once_with_the_same_verdict():
    good = {"type": "object", "properties": {f"k{i}": {"type": "string"} for i in range(50)},
            "$defs": {"a": {"type": "integer"}, "b": {"type": "integer"}}}
    slim = distinct_subschemas(good)
    assert len(slim["properties"]) == 1 and len(slim["$defs"]) == 1
    jsonschema.Draft202012Validator.check_schema(slim)
    JsonConstraint(good)
    bad = {"type": "object", "properties": {**{f"k{i}": {"type": "string"} for i in range(50)},
                                            "z": {"type": "strnig"}}}
    with pytest.raises(jsonschema.SchemaError):
        jsonschema.Draft202012Validator.check_schema(distinct_subschemas(bad))
    with pytest.raises(ConstraintError, match="properties.z.type"):
        JsonConstraint(bad)


def test_values_are_left_whole():
    s = {"enum": [{"a": 1}, {"a": 1}], "properties": {"x": {"const": {"k": 1}}, "y": {"const": {"k": 1}}}}
    slim = distinct_subschemas(s)
    assert slim["enum"] == s["enum"] and list(slim["properties"]) == ["x"]
