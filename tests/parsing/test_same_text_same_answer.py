"""Issue 49 ("same text, same answer"): the key-phrase readers agree. Deco-G (placement anywhere) read "The final
answer is 19.99 dollars." as 19 while the strict parser of free:keyphrase read it as invalid; a slot stopped inside
a number. Now every reader takes the whole number: the strict key-phrase parser, the template's search (lenient
reading of free text) and Deco-G's answer span."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from formtax.constraints.native import as_constraint
from formtax.parsing.strict import parse_strict
from formtax.strategies.decog import _answer_span
from formtax.tasks import Item, OutputFormat, get_task

GSM = get_task("gsm8k")
ITEM = Item(id="0", question="q", gold="19")
SPEC = "The final answer is {int}"


@pytest.mark.parametrize(("text", "value"), [
    ("Half of 39.98 is 19.99. The final answer is 19.99 dollars.", None),
    ("So the total is 1,234. The final answer is 1,234 apples.", None),
    ("The final answer is 19.5e3", None),
    ("Adding up. The final answer is 19.", 19),
    ("The final answer is 19, since 10 + 9 = 19.", 19),
    ("The final answer is 19", 19),
])
def test_every_reader_gives_the_same_answer(text, value):
    strict = parse_strict(text, GSM, ITEM, OutputFormat.REASON_KEYPHRASE)
    assert (strict.status == "ok") == (value is not None) and (value is None or strict.value == str(value))
    c = as_constraint(SPEC)
    searched = c.search(text)
    assert searched.ok == (value is not None) and (value is None or searched.value == value)
    data = text.encode()
    span = _answer_span(data, c.template, SimpleNamespace(placement="anywhere"))
    assert span is not None
    decog = c.validate(data[span[0]:span[1]].decode())
    assert decog.ok == (value is not None) and (value is None or decog.value == value)
