"""Answer SPECs -> constraints: the one parser of what users write (the syntax is in :mod:`formtax.constraints.spec`'s
docstring). It sits above every constraint module (``answer-json:`` wraps any SPEC in
:class:`~formtax.constraints.jsonreason.JsonAnswerObject`), so no constraint module imports it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from formtax.constraints.jsonreason import JsonAnswerObject, NumberOr
from formtax.constraints.record import RecordConstraint
from formtax.constraints.spec import (
    ChoiceConstraint,
    Constraint,
    DuplicateKey,
    JsonConstraint,
    LarkConstraint,
    RegexConstraint,
    TemplateConstraint,
    no_duplicate_keys,
)
from formtax.constraints.template import Slot, parse_template
from formtax.errors import ConstraintError


def _read_arg(arg: str, what: str) -> str:
    if arg.startswith("@"):
        path = Path(arg[1:])
        try:
            return path.read_text(encoding="utf-8")
        except OSError as e:
            raise ConstraintError(f"{what}: cannot read {path}: {e.strerror}") from e
    return arg


def parse_record(text: str) -> RecordConstraint:
    """A record from its fields as a JSON object ``{"key": "{slot}", ...}`` (the argument of ``record:``)."""
    try:
        obj = json.loads(text, object_pairs_hook=no_duplicate_keys)
    except DuplicateKey as e:
        raise ConstraintError(f"record: duplicate key {e.key!r}") from e
    except json.JSONDecodeError as e:
        raise ConstraintError(f"record: the fields are not valid JSON: {e}") from e
    if not isinstance(obj, dict):
        raise ConstraintError('record: write a JSON object of slots, e.g. record:{"Victim": "{str:5}"}')
    fields: list[tuple[str, Slot]] = []
    for key, src in obj.items():
        if not isinstance(src, str):
            raise ConstraintError(f'record: key {key!r} needs a slot string such as "{{str:5}}", got {src!r}')
        try:
            template = parse_template(src)
        except ConstraintError as e:
            raise ConstraintError(f"record: key {key!r}: {e}") from e
        if not template.is_single_slot:
            raise ConstraintError(
                f'record: key {key!r}: the value must be exactly one slot (e.g. "{{str:5}}"), got {src!r}'
            )
        fields.append((key, template.slots[0]))
    return RecordConstraint(fields)


def record_spec(fields: Sequence[tuple[str, str]]) -> str:
    """The SPEC ``record:{...}`` for (key, slot source) pairs, checked now (e.g. a choice alternative that
    would need a JSON escape fails here, not at the first model call)."""
    for pair in fields:
        if len(pair) != 2 or not all(isinstance(x, str) for x in pair):
            raise ConstraintError(f"record_spec: fields are (key, slot) string pairs, got {pair!r}")
    text = "{" + ", ".join(f"{json.dumps(k, ensure_ascii=False)}: {json.dumps(v, ensure_ascii=False)}"
                           for k, v in fields) + "}"
    parse_record(text)
    return "record:" + text


def parse_spec(spec: str) -> Constraint:
    """Parse an answer SPEC (see the module docstring) and check it with the engine before any model call."""
    if not spec:
        raise ConstraintError("empty answer spec")
    c: Constraint
    if spec.startswith("regex:"):
        c = RegexConstraint(spec[len("regex:") :])
    elif spec.startswith("json:"):
        text = _read_arg(spec[len("json:") :], "json")
        try:
            schema = json.loads(text)
        except json.JSONDecodeError as e:
            raise ConstraintError(f"json: the schema is not valid JSON: {e}") from e
        if not isinstance(schema, dict):
            raise ConstraintError("json: the schema must be a JSON object")
        c = JsonConstraint(schema, source=text.strip())
    elif spec.startswith("choice:"):
        c = ChoiceConstraint(spec[len("choice:") :].split("|"))
    elif spec.startswith("lark:"):
        c = LarkConstraint(_read_arg(spec[len("lark:") :], "lark"))
    elif spec.startswith("record:"):
        c = parse_record(_read_arg(spec[len("record:") :], "record"))
    elif spec.startswith("template:"):
        c = TemplateConstraint(spec[len("template:") :])
    elif spec.startswith("answer-json:"):
        c = JsonAnswerObject(parse_spec(spec[len("answer-json:") :]))
    elif spec.startswith("number-or:"):
        c = NumberOr(parse_spec(spec[len("number-or:") :]))
    else:
        c = TemplateConstraint(spec)
    c.check()
    return c
