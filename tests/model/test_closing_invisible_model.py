"""Closing mode on the embedded default model: where the model's own answer fits, closing changes nothing (issue 46).

For each prompt and constraint, the closing-off greedy answer is decoded once with room to spare; then closing-on
runs at every budget from that answer's length to 10 tokens above it and must be token-identical, with
``closing_changed_tokens == 0``. Before issue 46 the date below came back as ``1945-01-00`` at budgets 11 to 18.
"""

from __future__ import annotations

import pytest

import formtax

pytestmark = pytest.mark.model

DATE = "On what date did World War II end in Europe? Give only the date as YYYY-MM-DD."
CASES = [
    ("date", DATE, "regex:[0-9]{4}-[0-9]{2}-[0-9]{2}"),
    ("json", "Give a person called Ada who is 36 years old as JSON.",
     {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
      "required": ["name", "age"]}),
    ("choice", "Is the sky blue on a clear day? Answer yes or no.", "choice:yes|no|sometimes"),
    ("template", "Tom has 3 apples and buys 4 more. How many apples does he have?", "The answer is: {int}"),
]


@pytest.mark.parametrize(("name", "prompt", "answer"), CASES, ids=[c[0] for c in CASES])
def test_closing_is_invisible_on_the_model(default_model, name, prompt, answer):
    off = formtax.generate(default_model, prompt, "constrained", answer, max_tokens=64, closing=False)
    assert off.finish_reason in ("eos", "constraint-complete") and off.parse_ok, off.text
    n = off.tokens.total
    for budget in range(n, n + 11):
        on = formtax.generate(default_model, prompt, "constrained", answer, max_tokens=budget)
        assert on.token_ids == off.token_ids, (name, budget, off.text, on.text)
        assert on.stats["closing_changed_tokens"] == 0


def test_the_issue_example_answers_the_models_date_at_every_budget(default_model):
    want = formtax.generate(default_model, DATE, "constrained", CASES[0][2], max_tokens=16, closing=False).text
    assert want == "1945-01-01"
    for budget in (11, 12, 16, 18, 19, 64):
        assert formtax.generate(default_model, DATE, "constrained", CASES[0][2], max_tokens=budget).text == want
