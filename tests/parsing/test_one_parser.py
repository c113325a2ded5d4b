"""Issue 49 ("one parser"): ``formtax.generate(..., "nl2format", "The answer is: {int}", constrain=False)`` read
"The answer is: 5\\nBecause 2+3=5." as 5 while the runner's strict parser gave no_answer. The library's reading of
free text (``Constraint.search``, what ``read_answer`` uses) now gives the strict parser's verdict on paper 003's
answer line."""

from __future__ import annotations

import pytest

import formtax
from formtax.backends.fake import FakeBackend, scripted
from formtax.constraints.native import as_constraint
from formtax.constraints.spec import ANSWER_LINE
from formtax.parsing.strict import parse_strict
from formtax.tasks import Item, OutputFormat, get_task
from formtax.tasks.base import ANSWER_PREFIX

GSM = get_task("gsm8k")
ITEM = Item(id="0", question="q", gold="5")
TEXTS = [
    "The answer is: 5\nBecause 2+3=5.",
    "2+3=5.\nThe answer is: 5",
    "2+3=5.\nThe answer is: 5.\n",
    "The answer is: 5 apples",
    "I think The answer is: 5",
    "The answer is: 5.5",
    "no answer here",
]


def test_the_answer_line_constant_is_the_tasks_prefix():
    assert ANSWER_PREFIX.startswith(ANSWER_LINE)


@pytest.mark.parametrize("text", TEXTS)
def test_search_and_the_strict_parser_agree(text):
    strict = parse_strict(text, GSM, ITEM, OutputFormat.REASON_ANSWER)
    found = as_constraint("The answer is: {int}").search(text)
    assert found.ok == (strict.status == "ok"), (text, strict, found)
    if found.ok:
        assert str(found.value) == strict.value


def test_generate_unconstrained_nl2format_reads_as_the_runner_does():
    text = "The answer is: 5\nBecause 2+3=5."
    model = FakeBackend(scripted(text))
    res = formtax.generate(model, "q", "nl2format", "The answer is: {int}", max_tokens=64, constrain=False)
    assert res.text.startswith(text)
    assert not res.parse_ok
    assert parse_strict(res.text, GSM, ITEM, OutputFormat.REASON_ANSWER).status != "ok"
