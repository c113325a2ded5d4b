"""Issue 57 point 7: a constrained answer that is complete when the budget ends (closing mode finishes it on the
last token) reports ``finish_reason "stop"``; clients such as instructor read ``length`` as a cut answer. A free
answer, or one that does not parse, at the budget stays ``length``."""

from __future__ import annotations

from formtax.serve import shapes
from formtax.strategies.base import Result


def res(**kw):
    return Result(strategy="constrained", model="m", text="The answer is: 7", **kw)


def test_a_complete_answer_at_the_budget_is_stop():
    assert shapes.finish(res(finish_reason="length", answer_text="The answer is: 7", parse_ok=True)) == "stop"


def test_a_cut_or_free_answer_at_the_budget_stays_length():
    assert shapes.finish(res(finish_reason="length", answer_text="The answer is:", parse_ok=False)) == "length"
    assert shapes.finish(res(finish_reason="length", answer_text=None, parse_ok=True)) == "length"
    assert shapes.finish(res(finish_reason="length-incomplete", answer_text="x", parse_ok=False)) == "length"
    assert shapes.finish(res(finish_reason="eos", answer_text="The answer is: 7", parse_ok=True)) == "stop"
