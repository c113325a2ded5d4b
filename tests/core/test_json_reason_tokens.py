"""Issue 49: the json strategy's ``reason`` string counts as reasoning tokens (it was 0: the whole object is one
answer phase to the policy). With the byte tokenizer every byte is a token, so the truth is the reason's UTF-8
length, computed here from the text."""

from __future__ import annotations

import json

import formtax
from formtax.backends.fake import FakeBackend, scripted
from formtax.constraints.jsonreason import string_value_span


def test_reason_tokens_are_reasoning_tokens():
    want = '{"reason": "3 + 4 = 7, \\"seven\\" \u00e9", "answer": 7}'
    r = formtax.generate(FakeBackend(scripted(want)), "3 + 4?", "json", "{int:0..99}", max_tokens=120)
    assert r.parse_ok and r.parsed == 7 and r.text == want
    reason = json.loads(r.text)["reason"]
    raw = r.text[r.text.index('"reason": "') + len('"reason": "'): r.text.index('", "answer"')]
    assert json.loads('"' + raw + '"') == reason
    assert r.tokens.by_phase["reasoning"] == len(raw.encode())
    assert r.tokens.by_phase["reasoning"] + r.tokens.by_phase["answer"] == r.tokens.total


def test_the_span_is_the_top_level_reason_string():
    assert string_value_span('{"x": {"reason": "no"}, "reason": "yes"}', "reason") == (34, 39)
    assert string_value_span('{ "answer": 1 , "reason" : "a\\"b" }', "reason") == (27, 33)
    assert string_value_span('{"reason": "cut', "reason") is None
    assert string_value_span('{"reason": 5}', "reason") is None
