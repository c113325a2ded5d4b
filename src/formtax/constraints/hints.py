"""The literal strings of a grammar (Lark string literals, the literal runs of regexes, JSON property names and
enum values), which closing mode's witness search follows (constraints/closing.py) and a compiled grammar exposes
(``Matcher.hints``). Pure text analysis of formtax's own grammar envelopes: no engine, no matcher.
"""

from __future__ import annotations

import contextlib
import json
import re
from typing import Any

from formtax.cache import LRU

# -- hints: the grammar's own literals ---------------------------------------------------------------------------
# A mask says which tokens may follow, not how far acceptance is: on a byte vocabulary the states after "e" and
# after "0" in (\w+ )*end\. allow the same bytes. So the search also follows the grammar's literal strings (Lark
# string literals, the literal runs of regexes, JSON property names and enum values): a token that starts or
# continues one is tried first, and a state's progress along them is part of its fingerprint.

_REGEX_CLASS_ESCAPES = set("wWdDsSbBAZzpPhHvVRXKGkQE0123456789")
_REGEX_BREAK = set("()|*+?^$.")


def _regex_literals(pattern: str) -> list[str]:
    runs, cur, i = [], "", 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\" and i + 1 < len(pattern):
            e = pattern[i + 1]
            i += 2
            if e in _REGEX_CLASS_ESCAPES:
                runs.append(cur)
                cur = ""
            else:
                cur += {"n": "\n", "t": "\t", "r": "\r"}.get(e, e)
            continue
        if c == "[":  # a class: skip to its end
            j = i + 1
            while j < len(pattern) and pattern[j] != "]":
                j += 2 if pattern[j] == "\\" else 1
            i = j + 1
            runs.append(cur)
            cur = ""
            continue
        if c == "{":
            j = pattern.find("}", i)
            if j > i and re.fullmatch(r"\d*,?\d*", pattern[i + 1:j]):
                i = j + 1
                runs.append(cur)
                cur = ""
                continue
        if c in _REGEX_BREAK:
            runs.append(cur)
            cur = ""
        else:
            cur += c
        i += 1
    runs.append(cur)
    return [r for r in runs if r]


def _schema_literals(schema: Any, out: list[str]) -> None:
    if isinstance(schema, dict):
        for name in schema.get("properties") or {}:
            out.append(json.dumps(name))
        for v in schema.get("enum") or []:
            out.append(json.dumps(v, ensure_ascii=False))
        if isinstance(schema.get("pattern"), str):
            out.extend(_regex_literals(schema["pattern"]))
        if "const" in schema:
            out.append(json.dumps(schema["const"], ensure_ascii=False))
        for v in schema.values():
            _schema_literals(v, out)
    elif isinstance(schema, list):
        for v in schema:
            _schema_literals(v, out)


def _lark_literals(text: str) -> list[str]:
    out: list[str] = []
    plain = []
    for line in text.splitlines():  # a %json{...} schema is JSON, not Lark: its literals are the schema's own
        head, sep, schema = line.partition("%json")
        plain.append(head)
        if sep:
            with contextlib.suppress(ValueError):
                _schema_literals(json.loads(schema.strip()), out)
    for m in re.finditer(r'"((?:[^"\\]|\\.)*)"|/((?:[^/\\\n]|\\.)+)/', "\n".join(plain)):
        if m.group(1) is not None:
            try:
                out.append(json.loads(f'"{m.group(1)}"'))
            except ValueError:
                out.append(m.group(1))
        else:
            out.extend(_regex_literals(m.group(2)))
    return out


_HINTS: LRU[str, tuple[bytes, ...]] = LRU(256)


def grammar_hints(grammar: str) -> tuple[bytes, ...]:
    """The literal strings of a formtax grammar (an llguidance envelope or Lark text), as UTF-8 bytes."""
    hit = _HINTS.get(grammar)
    if hit is not None:
        return hit
    found: list[str] = []
    if grammar.lstrip().startswith("{"):
        try:
            top = json.loads(grammar)
        except ValueError:
            top = {}
        for g in top.get("grammars") or []:
            if g.get("lark_grammar"):
                found.extend(_lark_literals(g["lark_grammar"]))
            if g.get("json_schema") is not None:
                _schema_literals(g["json_schema"], found)
    else:
        found.extend(_lark_literals(grammar))
    hints = tuple(sorted({h.encode() for h in found if h and len(h) <= 64}))
    return _HINTS.put(grammar, hints)
