"""Issue 57: formtax's vLLM reasoning parser (formtax.integrations.vllm_reasoning) splits InWriting's reasoning
from its answer, streamed and not, as ``formtax.parse`` reads the text; other requests are left alone. Driven with
the texts formtax's own InWriting writes (fake model), without a server."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

import formtax
from formtax.backends.fake import FakeBackend, random_logits, scripted

pytest.importorskip("vllm.reasoning")
pytestmark = [pytest.mark.vllm]

Q = [{"role": "user", "content": "What is 2+3?"}]
SPEC = "The answer is: {int:0..9}"


def parser(xargs):
    from formtax.integrations.vllm_reasoning import FormtaxReasoningParser

    p = FormtaxReasoningParser(None)
    request = SimpleNamespace(vllm_xargs=xargs)
    p.adjust_request(request)
    return p, request


def streamed(p, text, step=3):
    reasoning, content, prev = "", "", ""
    for k in range(0, len(text), step):
        cur = text[: k + step]
        d = p.extract_reasoning_streaming(prev, cur, cur[len(prev):], [], [], [])
        if d is not None:
            reasoning += d.reasoning or ""
            content += d.content or ""
        prev = cur
    return reasoning, content + (p.get_streaming_fallback_content(prev, None) or "")


@pytest.mark.parametrize("fn", [scripted("Let me think. 2+3=5.\nSo it is five. Done"), random_logits(seed=3)])
def test_inwritings_reasoning_and_answer_are_split(fn):
    res = formtax.generate(FakeBackend(fn), Q, "inwriting", SPEC, max_tokens=60)
    xargs = {"formtax_strategy": "inwriting", "formtax_answer": SPEC}
    p, request = parser(xargs)
    assert p.is_reasoning_end([]) is False
    reasoning, content = p.extract_reasoning(res.text, request)
    assert (reasoning or "", content) == (res.reasoning, res.answer_text)
    from formtax.integrations.vllm_reasoning import FormtaxReasoningParser

    def parse_delta(request):  # vLLM's stream parser: it holds the request, the reasoning parser is not told
        p = FormtaxReasoningParser(None)
        assert p.is_reasoning_end([]) is False
        return streamed(p, res.text)

    assert parse_delta(SimpleNamespace(vllm_xargs=xargs)) == (res.reasoning, res.answer_text)


def test_the_split_holds_after_validate_params_handed_the_engine_its_witnesses():
    # vLLM's OpenAI layer passes the client's vllm_xargs dict on as extra_args: validate_params adds to it
    res = formtax.generate(FakeBackend(scripted("Let me think. 2+3=5. So")), Q, "inwriting", SPEC, max_tokens=60)
    p, request = parser({"formtax_strategy": "inwriting", "formtax_answer": SPEC, "formtax_witnesses": {"k": [1]}})
    assert p.extract_reasoning(res.text, request) == (res.reasoning, res.answer_text)


def test_other_requests_are_left_alone():
    for xargs in (None, {"other": 1}, {"formtax_strategy": "constrained", "formtax_answer": SPEC}):
        p, request = parser(xargs)
        assert p.is_reasoning_end([]) is True  # vLLM's own structured outputs constrain them from the start
        assert p.extract_reasoning("The answer is: 4", request) == (None, "The answer is: 4")


def test_a_json_rows_reason_is_reasoning_content_beside_the_object():
    res = formtax.generate(FakeBackend(random_logits(seed=1)), Q, "json", "{int}", max_tokens=60)
    p, request = parser({"formtax_strategy": "json", "formtax_answer": "{int}"})
    reasoning, content = p.extract_reasoning(res.text, request)
    assert content == res.text and reasoning and reasoning in res.reasoning
