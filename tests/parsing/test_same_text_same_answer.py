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


# Issue 60: the texts on which Deco-G's reader and the key-phrase reader disagreed (6 of 10), and SummEval's.
EDGES = [
    ("The final answer is 19%.", None),
    ("**The final answer is 19**", 19),
    ("The final answer is **19**.", 19),
    ("So 19 or 20. The final answer is 19-20 apples.", None),
    ("The final answer is 19;", 19),
    ("The final answer is 19!", 19),
    ("The final answer is 19.", 19),
    ("The final answer is 7E...", None),
    ("The final answer is 19. Then again, The final answer is 20", 20),
    ("The final answer is 19. Then again, The final answer is twenty.", None),
    ("The final answer is", None),
    ("The final answer is -0", None),
]


@pytest.mark.parametrize(("text", "value"), EDGES)
def test_one_reading_rule_for_every_reader(text, value):
    """Deco-G's answer span, the strict key-phrase parser and the library's search read each edge text alike."""
    strict = parse_strict(text, GSM, ITEM, OutputFormat.REASON_KEYPHRASE)
    assert (strict.status == "ok", strict.value) == (value is not None, None if value is None else str(value))
    c = as_constraint(GSM.answer_spec("vc", ITEM, OutputFormat.REASON_KEYPHRASE))  # The final answer is {int:0..}
    searched = c.search(text)
    assert (searched.ok, searched.value if searched.ok else None) == (value is not None, value)
    data = text.encode()
    span = _answer_span(data, c.template, SimpleNamespace(placement="anywhere"))
    if span is None:  # no key phrase at all
        assert strict.status == "no_answer"
        return
    answer_text = data[span[0]:span[1]].decode()
    assert parse_strict(answer_text, GSM, ITEM, OutputFormat.REASON_KEYPHRASE) == strict  # what the runner parses


SUMMEVAL = get_task("summeval")
S_ITEM = Item(id="A0-S0-coherence", question="q", gold="4.0000")


@pytest.mark.parametrize(("text", "fmt", "value"), [
    ("Clear and organised.\nThe rating is 4", OutputFormat.REASON_ANSWER, "4"),
    ("The rating is 4.", OutputFormat.ANSWER_ONLY, "4"),
    ("The rating is 4/5.", OutputFormat.REASON_KEYPHRASE, None),
    ("The rating is 4/5.", OutputFormat.REASON_ANSWER, None),
    ("The answer is: 4", OutputFormat.REASON_ANSWER, None),  # not this task's answer line
])
def test_summeval_reads_its_own_answer_line(text, fmt, value):
    got = parse_strict(text, SUMMEVAL, S_ITEM, fmt)
    assert got.value == value and (got.status == "ok") == (value is not None)
