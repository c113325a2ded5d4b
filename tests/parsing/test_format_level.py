"""Issue 49 (format-level parse rate): paper 003 counts an output as parsing at the format level when it "can be
parsed according to the specified format schema". FC's schema types the answer as a string (or a number where the
prompt shows one), so ``null``, ``true``, ``[28]`` and ``{"x": 1}`` are not its shape; they were counted."""

from __future__ import annotations

import pytest

from formtax.parsing.strict import parse_strict
from formtax.records.schema import ParseRecord
from formtax.report.load import format_ok
from formtax.tasks import Item, OutputFormat, get_task

GSM = get_task("gsm8k")
ITEM = Item(id="0", question="q", gold="28")


@pytest.mark.parametrize(("answer", "shaped"), [
    ("null", False), ("true", False), ("[28]", False), ('{"x": 1}', False),
    ("28", True), ('"28"', True), ("28.0", True), ('"twenty-eight"', True),
])
@pytest.mark.parametrize("fmt", [OutputFormat.JSON, OutputFormat.REASON_JSON])
def test_only_the_formats_shape_counts(answer, shaped, fmt):
    text = ('{"reason": "r", "answer": ' + answer + "}") if fmt is OutputFormat.JSON else \
        ('I think so.\n{"answer": ' + answer + "}")
    p = parse_strict(text, GSM, ITEM, fmt)
    assert format_ok(ParseRecord(status=p.status, value=p.value, raw=p.raw)) == (1.0 if shaped else 0.0), (p, fmt)
