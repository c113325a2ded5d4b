"""Which JSON Schemas let a grammar write an object that repeats a key (constraints/jsonkeys.py bans the repeats).

Its own module, with no formtax import, so the constraint types (spec.py) can ask it without an import cycle.
"""

from __future__ import annotations

from typing import Any

_SCHEMA_KEYWORDS_WITH_SCHEMAS = ("items", "additionalProperties", "not", "if", "then", "else", "contains",
                                 "propertyNames", "unevaluatedProperties", "unevaluatedItems",
                                 "additionalItems")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")


def schema_may_repeat_keys(schema: Any) -> bool:
    """Whether a JSON Schema lets the grammar write an object that repeats a key: some subschema admits objects
    with keys beyond its declared properties (module docstring). Conservative: a schema it cannot read is open."""
    stack = [schema]
    seen = 0
    while stack:
        node = stack.pop()
        seen += 1
        if seen > 100_000:
            return True
        if node is True:
            return True  # any value, objects with any keys included
        if not isinstance(node, dict):
            continue
        if _admits_open_object(node):
            return True
        for k in _SCHEMA_KEYWORDS_WITH_SCHEMAS:
            if k in node:
                stack.append(node[k])
        for k in _SCHEMA_LISTS:
            if isinstance(node.get(k), list):
                stack.extend(node[k])
        for k in _SCHEMA_MAPS:
            if isinstance(node.get(k), dict):
                stack.extend(node[k].values())
    return False


def _admits_open_object(node: dict[str, Any]) -> bool:
    if any(k in node for k in ("const", "enum", "$ref", "anyOf", "oneOf", "allOf")) and "type" not in node:
        return False  # its branches or target are walked on their own
    kinds = node.get("type")
    objects = kinds is None or kinds == "object" or (isinstance(kinds, list) and "object" in kinds)
    if not objects or "const" in node or "enum" in node:
        return False
    return node.get("additionalProperties", True) is not False or bool(node.get("patternProperties"))
