"""Issue 49 (FC for integer prompts): formtax keeps paper 003's Assumption 1 over A.2's `str` (docs/ALGORITHMS.md
section 3, with the measured effect). These tests pin what that choice means: FC's grammar admits a bare number
where the prompt shows one, VC's does not admit a non-integer, and neither the strict parser nor VC's validator
counts 28.5 or 1e2 as a valid answer."""

from __future__ import annotations

import pytest

from formtax.constraints.parse import parse_spec
from formtax.parsing.strict import parse_strict
from formtax.tasks import Item, OutputFormat, get_task

GSM = get_task("gsm8k")
ITEM = Item(id="1", question="q", gold="100")


def _accepts(spec: str, text: str) -> bool:
    """The json strategy's whole-output constraint over ``spec`` (the reason + answer object) accepts ``text``."""
    from formtax.constraints.jsonreason import JsonReasonAnswer

    c = JsonReasonAnswer(parse_spec(spec), reason_tokens=64)
    return c.validate(text).ok


@pytest.mark.parametrize("number", ["28.5", "1e2", "100.0", "28"])
def test_fc_admits_every_number_and_vc_only_the_integer(number):
    text = '{"reason": "r", "answer": ' + number + "}"
    assert _accepts("number-or:{str}", text)
    assert _accepts("{int:0..}", text) == (number == "28")
    assert (parse_strict(text, GSM, ITEM, OutputFormat.JSON).status == "ok") == (number == "28")


def test_the_documented_choice_is_in_the_specification():
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "ALGORITHMS.md").read_text(encoding="utf-8")
    assert "FC's answer on integer tasks (ours; paper 003's A.2 sets it to `str`)" in doc
