"""With closing mode on, the only budget floor is the shortest completion (issue 45, point 9).

Closing already finishes every answer inside ``max_tokens`` whenever a completion fits, so json and InWriting no
longer refuse budgets by the byte-level worst case of their answer; they reserve what the answer plausibly takes
(``strategies.reserve.closing_room``: the shortest answer in the model's own tokens plus 16). Without closing the
worst-case bound stays, since nothing else would finish the answer.
"""

from __future__ import annotations

import pytest
from pydantic import BaseModel

import formtax
from formtax.backends.fake import FakeBackend, random_logits
from formtax.errors import ConfigError


class Apples(BaseModel):
    apples: int


SINGLE_PASS = ["constrained", "json", "inwriting"]


@pytest.mark.parametrize("strategy", SINGLE_PASS)
@pytest.mark.parametrize("seed", range(4))
def test_the_template_answers_at_64_tokens(strategy, seed):
    r = formtax.generate(FakeBackend(random_logits(seed=seed)), "q", strategy, "The answer is: {int}", max_tokens=64,
                         raw=True)
    assert r.parse_ok and r.tokens.total <= 64, (r.text, r.finish_reason)


@pytest.mark.parametrize(("strategy", "answer", "budget"), [("json", "{choice:yes|no}", 48),
                                                             ("json", "{choice:yes|no}", 40),
                                                             ("json", Apples, 64), ("inwriting", Apples, 48),
                                                             ("json", "The answer is: {int}", 64)])
def test_budgets_that_fit_are_no_longer_refused(strategy, answer, budget):
    for seed in range(4):
        r = formtax.generate(FakeBackend(random_logits(seed=seed)), "q", strategy, answer, max_tokens=budget, raw=True)
        assert r.parse_ok and r.tokens.total <= budget, (r.text, r.finish_reason)
        assert r.stats["closing"] is True


def test_without_closing_the_worst_case_still_applies():
    with pytest.raises(ConfigError, match=r"needs up to \d+ tokens; raise max_tokens$"):
        formtax.generate(FakeBackend(random_logits(seed=0)), "q", "json", "{choice:yes|no}", max_tokens=40,
                         raw=True, closing=False)


def test_a_budget_no_completion_fits_is_still_refused_with_closing():
    with pytest.raises(ConfigError, match="closing mode: no completion"):
        formtax.generate(FakeBackend(random_logits(seed=0)), "q", "json", "{choice:yes|no}", max_tokens=10, raw=True)


def test_the_reserve_is_what_the_answer_plausibly_takes():
    from formtax.constraints import as_constraint
    from formtax.strategies import Request, get_strategy

    b = FakeBackend(random_logits(seed=0))
    inw = get_strategy("inwriting")
    req = Request("q", as_constraint(Apples), max_tokens=64, closing=True)
    worst = inw.answer_overhead(req)
    room = inw.answer_overhead(req, b)
    assert worst == 65 and room == len('{"apples": 0}') + 16 + 1  # byte tokens: the shortest answer is 13 tokens
    off = Request("q", as_constraint(Apples), max_tokens=64, closing=False)
    assert inw.answer_overhead(off, b) == worst
    bounded = Request("q", as_constraint("The answer is: {int}"), max_tokens=64, closing=True)
    assert inw.answer_overhead(bounded, b) == inw.answer_overhead(bounded)  # never more than the worst case
