"""Closing mode's lower bound: the fewest bytes any instance of a JSON schema takes (issue 58).

A budget of ``n`` tokens carries at most ``n`` times the longest token's bytes, so a schema whose every instance takes
more bytes is refused at once, before any search: 1,000 required properties at 16 tokens cost a walk over the schema,
not a minute of search. The bound must never exceed the truth (a request that fits would be refused), so every rule
errs low (ours):

* a value of unknown shape takes 1 byte (``0``); a number or integer 1, whatever its range; ``true``/``null`` 4;
* a string takes its quotes and ``minLength`` bytes (a character is at least one byte), or the least width of its
  ``pattern`` where that is larger (a match must be inside it; a pattern Python cannot read counts 0);
* an object takes its braces, each required key as JSON writes it (raw UTF-8, the shortest spelling), a colon, its
  value's bound and a comma between members; ``minProperties`` beyond the required keys counts 4 bytes a member
  (``"":0``);
* an array takes its brackets and ``minItems`` items of their bound, a comma between;
* ``const``/``enum``: the shortest value as JSON writes it; ``anyOf``/``oneOf``: the least branch; ``allOf`` and a
  schema's own keywords beside them: the largest bound (an instance satisfies them all); a local ``$ref`` is followed
  (a cycle counts 0); every other keyword (``not``, ``if``, formats, ...) adds nothing.
"""

from __future__ import annotations

import functools
import json
import re
from typing import Any

_MAX_DEPTH = 64


def _dumps(value: Any) -> int:
    """The fewest bytes ``value`` takes as JSON: a number may be written shorter than Python writes it (``-2.0`` as
    ``-2``, equal under JSON Schema) and a container's members are not counted (brackets only)."""
    if isinstance(value, bool) or value is None:
        return 4
    if isinstance(value, int | float):
        return 1
    if isinstance(value, list | dict):
        return 2
    return len(json.dumps(value, ensure_ascii=False).encode())


@functools.lru_cache(maxsize=1024)
def _pattern_width(pattern: str) -> int:
    """The fewest characters a match of ``pattern`` takes (cached: a schema repeats its patterns)."""
    try:
        width = re._parser.parse(pattern).getwidth()[0]  # type: ignore[attr-defined, unused-ignore]
    except Exception:  # an ECMA-262 pattern Python does not read: it adds nothing
        return 0
    return int(min(width, 1 << 20))


def _resolve(root: Any, ref: str) -> Any:
    if not ref.startswith("#"):
        return None
    node = root
    for part in ref[1:].split("/")[1:]:
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node


def min_json_bytes(schema: Any) -> int:
    """A lower bound on the bytes of any instance of ``schema`` (module docstring)."""
    return _bound(schema, schema, 0)


def _bound(s: Any, root: Any, depth: int) -> int:
    if depth > _MAX_DEPTH or not isinstance(s, dict):
        return 0 if s is False or depth > _MAX_DEPTH else 1
    bounds = [_typed(s, root, depth)]
    if "const" in s:
        bounds.append(_dumps(s["const"]))
    if isinstance(s.get("enum"), list) and s["enum"]:
        bounds.append(min(_dumps(v) for v in s["enum"]))
    if isinstance(s.get("$ref"), str):
        target = _resolve(root, s["$ref"])
        bounds.append(0 if target is None else _bound(target, root, depth + 1))
    for key in ("anyOf", "oneOf"):
        if isinstance(s.get(key), list) and s[key]:
            bounds.append(min(_bound(b, root, depth + 1) for b in s[key]))
    if isinstance(s.get("allOf"), list):
        bounds.extend(_bound(b, root, depth + 1) for b in s["allOf"])
    return max(bounds)


def _typed(s: dict[str, Any], root: Any, depth: int) -> int:
    """The least bound over the types ``s`` admits (every type where it names none)."""
    types = s.get("type")
    names = [types] if isinstance(types, str) else types if isinstance(types, list) else \
        ["null", "boolean", "number", "string", "array", "object"]
    out = []
    for t in names:
        if t in ("number", "integer"):
            out.append(1)
        elif t in ("null", "boolean"):
            out.append(4)
        elif t == "string":
            n = s.get("minLength", 0)
            p = s.get("pattern")
            out.append(2 + max(n if isinstance(n, int) else 0, _pattern_width(p) if isinstance(p, str) else 0))
        elif t == "array":
            out.append(_array(s, root, depth))
        elif t == "object":
            out.append(_object(s, root, depth))
    return min(out, default=1)


def _array(s: dict[str, Any], root: Any, depth: int) -> int:
    n = s.get("minItems", 0)
    n = n if isinstance(n, int) and n > 0 else 0
    found = s.get("prefixItems")
    prefix: list[Any] = found if isinstance(found, list) else []
    items = s.get("items", True)
    each = [_bound(prefix[i] if i < len(prefix) else items, root, depth + 1) for i in range(min(n, 1 << 16))]
    return 2 + sum(each) + max(0, n - 1)


def _object(s: dict[str, Any], root: Any, depth: int) -> int:
    required = [k for k in s.get("required", []) if isinstance(k, str)] if isinstance(s.get("required"), list) else []
    given = s.get("properties")
    props: dict[str, Any] = given if isinstance(given, dict) else {}
    total = 2
    for k in dict.fromkeys(required):
        total += _dumps(k) + 1 + (_bound(props[k], root, depth + 1) if k in props else 1)
    members = len(set(required))
    extra = s.get("minProperties", 0)
    if isinstance(extra, int) and extra > members:
        total += 4 * (extra - members)
        members = extra
    return total + max(0, members - 1)
