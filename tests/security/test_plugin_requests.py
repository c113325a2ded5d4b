"""Issue 55 point 6 / issue 57: formtax's plugin checks a stock vLLM server's request whole before it is queued
(formtax.backends.vllm.rows.validate, run by ``validate_params``): everything that would make the row
unbuildable, vLLM's own masks beside formtax's, settings that would cut the row, and a set-up that would hold the
engine. Each is a ValueError (vLLM's 400) naming the problem. Fake tokenizer, no vLLM."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from formtax.backends.fake import FakeBackend
from formtax.backends.vllm.rows import SETUP_BOUND_ENV, EngineSide, caller_context, validate

ENGINE = EngineSide(FakeBackend().tokenizer, "fake")


def params(xargs, max_tokens=64, **kw):
    base = {"max_tokens": max_tokens, "seed": 0, "temperature": 0.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0,
            "structured_outputs": None, "allowed_token_ids": None, "bad_words": None, "stop": None,
            "stop_token_ids": None, "min_tokens": 0, "ignore_eos": False}
    return SimpleNamespace(**{**base, **kw, "extra_args": dict(xargs)})


INT = {"formtax_strategy": "constrained", "formtax_answer": "The answer is: {int}"}


def test_a_good_request_passes_and_others_are_left_alone():
    assert validate(params(INT), ENGINE).strategy == "constrained"
    assert validate(params({"other_plugin": 1}), ENGINE) is None


@pytest.mark.parametrize(("xargs", "max_tokens", "needle"), [
    ({"formtax_strategy": "json", "formtax_answer": "{int}"}, 3, "max_tokens"),
    ({"formtax_strategy": "inwriting", "formtax_answer": "The answer is: {int}"}, 2, "max_tokens"),
    ({"formtax_answer": "regex:a{50}"}, 8, "fits in"),
    ({"formtax_answer": "regex:[^\\s\\S]"}, 16, "matches nothing"),
    ({"formtax_answer": "json:" + json.dumps({"type": "object", "required": [f"k{i}" for i in range(8)],
                                               "properties": {f"k{i}": {"type": "integer"} for i in range(8)}})},
     12, "closing mode"),
    ({"formtax_answer": "regex:(?=a)b"}, 16, "formtax_answer"),
    ({"formtax_strategy": "suffix-last", "formtax_answer": "{int}"}, 16, "single-pass"),
    ({"formtax_strategy": "nl2format", "formtax_answer": "{int}"}, 16, "single-pass"),
    ({"formtax_witnesses": {}}, 16, "unknown formtax argument"),
])
def test_unbuildable_rows_are_refused_with_their_reason(xargs, max_tokens, needle):
    with pytest.raises(ValueError, match=needle) as e:
        validate(params(xargs, max_tokens), ENGINE)
    assert "\n" not in str(e.value)


def test_the_lookahead_regex_message_is_whole():
    with pytest.raises(ValueError) as e:
        validate(params({"formtax_answer": "regex:(?=a)b"}), ENGINE)
    assert not str(e.value).rstrip().endswith("regex parse error:")


@pytest.mark.parametrize(("field", "value", "needle"), [
    ("structured_outputs", {"json": {"type": "object"}}, "structured_outputs"),
    ("allowed_token_ids", [1, 2], "allowed_token_ids"),
    ("bad_words", ["x"], "bad_words"),
    ("stop", ["\n"], "stop"),
    ("stop_token_ids", [65], "stop_token_ids"),
    ("min_tokens", 5, "min_tokens"),
    ("ignore_eos", True, "ignore_eos"),
    ("max_tokens", None, "max_tokens"),
])
def test_vllms_own_masks_and_cutting_settings_are_refused(field, value, needle):
    with pytest.raises(ValueError, match=needle):
        validate(params(INT, **{field: value}), ENGINE)


def test_stop_is_fine_for_free_text_and_eos_stop_ids_for_every_row():
    validate(params({"formtax_strategy": "free"}, stop=["\n"]), ENGINE)
    validate(params(INT, stop_token_ids=sorted(ENGINE.tokenizer.eos_ids)), ENGINE)


def test_a_missing_client_max_tokens_is_refused_though_vllm_filled_it_in():
    # vLLM fills max_tokens with the context left; the client's own request says it sent none
    with pytest.raises(ValueError, match="max_tokens"):
        validate(params(INT, max_tokens=4000), ENGINE, client_max_tokens=None)

    class ChatRequest:  # what vLLM's OpenAI layer holds in a caller's frame
        vllm_xargs = INT
        max_tokens = None
        max_completion_tokens = None

    def serving(request):
        return caller_context()

    assert serving(ChatRequest())[1] is None
    ChatRequest.max_tokens = 64
    assert serving(ChatRequest())[1] == 64


def test_the_set_up_is_bounded_and_its_witnesses_travel_with_the_request(monkeypatch):
    schema = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(60)},
              "required": [f"p{i}" for i in range(60)]}
    monkeypatch.setenv(SETUP_BOUND_ENV, "0.05")
    big = params({"formtax_answer": "json:" + json.dumps(schema)}, max_tokens=4000)
    with pytest.raises(ValueError, match="formtax_closing 0|to set up"):
        validate(big, ENGINE)
    monkeypatch.delenv(SETUP_BOUND_ENV)
    p = params(INT)
    validate(p, ENGINE)
    handed = p.extra_args["formtax_witnesses"]
    assert handed and all(isinstance(w, list) for w in handed.values())


def test_an_answer_over_the_size_cap_is_refused_before_it_compiles(monkeypatch):
    from formtax.backends.vllm.rows import ANSWER_BYTES_ENV

    schema = {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(3000)}}
    with pytest.raises(ValueError, match="bytes, over"):
        validate(params({"formtax_answer": "json:" + json.dumps(schema)}, 16), ENGINE)
    monkeypatch.setenv(ANSWER_BYTES_ENV, "64")
    with pytest.raises(ValueError, match="bytes, over 64"):
        validate(params({"formtax_answer": "regex:" + "a" * 70}), ENGINE)
