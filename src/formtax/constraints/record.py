"""Records: a JSON object of named slots (``record:{"Victim": "{str:5}", ...}``; the EAE study's answer), each
field a single template slot, every key present and each value either the slot's JSON value or null.

The grammar is written field by field from the slots (integers as bare JSON integers with their bounds, strings
without escapes), so the constraint's language and its Python validator agree exactly.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from functools import cached_property
from typing import Any

import llguidance

from formtax.constraints.spec import NEEDS_ESCAPE, NO_ESCAPE_CHAR, Constraint, Validation, no_duplicate_keys
from formtax.constraints.template import (
    INT_LIMIT,
    Slot,
    lark_string,
)
from formtax.errors import ConstraintError


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
    if NEEDS_ESCAPE.search(value):
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
            if NEEDS_ESCAPE.search(option):
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
            value = json.loads(text, object_pairs_hook=no_duplicate_keys)
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
        dec = json.JSONDecoder(object_pairs_hook=no_duplicate_keys)
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
