"""The JSON object a text ends with (paper 003's one-field answer form, ``... {"answer": <answer>}``).

No formtax imports: the strict parser and the :class:`~formtax.constraints.jsonreason.JsonAnswerObject` oracle
both read the answer this way, so the free (unconstrained) level is read exactly as the constrained one.
"""

from __future__ import annotations

import json

_DECODER = json.JSONDecoder()


def trailing_json_object(text: str) -> str | None:
    """The text of the last JSON object that ends ``text`` (whitespace after it allowed), or None.

    Scans the ``{`` positions from the right and returns the first from which one JSON value reaches the end:
    so the object is the whole final value, not a nested object inside it."""
    stripped = text.rstrip()
    found: str | None = None
    pos = stripped.rfind("{")
    while pos != -1:
        try:
            value, end = _DECODER.raw_decode(stripped, pos)
        except json.JSONDecodeError:
            pass
        else:
            if end == len(stripped) and isinstance(value, dict):
                found = stripped[pos:end]  # an enclosing object found further left replaces a nested one
        pos = stripped.rfind("{", 0, pos)
    return found
