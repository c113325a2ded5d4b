"""Python API footguns a new user met (issue 36, point 2): each is now one clear error or fixed."""

from __future__ import annotations

import pytest

import formtax
from formtax.backends.fake import FakeBackend
from formtax.errors import ConfigError


def test_a_string_is_not_a_batch_of_prompts():
    with pytest.raises(ConfigError, match="got one string"):
        formtax.generate_batch(FakeBackend(), "abc")


def test_a_message_without_content_is_named():
    with pytest.raises(ConfigError, match="chat message 0 needs a 'role' and a string 'content'"):
        formtax.generate(FakeBackend(), [{"role": "user"}])


def test_a_schema_with_a_minimum_prints_nothing(capfd):
    r = formtax.generate(FakeBackend(), "q", "constrained", {"type": "integer", "minimum": 0, "maximum": 9},
                         max_tokens=10)
    assert r.parse_ok
    assert "Parser Error" not in capfd.readouterr().err


def test_inwriting_text_does_not_glue_reasoning_and_answer():
    from formtax.backends.fake import scripted

    m = FakeBackend(scripted("I think it is 42."))
    r = formtax.generate(m, "q", "inwriting", "The answer is: {int}", max_tokens=60)
    assert r.text == f"{r.reasoning}\n{r.answer_text}" and r.reasoning == "I think it is 42."
    assert m.tokenizer.decode_text(r.token_ids) == r.reasoning + r.answer_text  # the emitted tokens, unchanged


def test_reader_text_leaves_what_is_not_glued():
    from formtax.strategies.inwriting import reader_text

    assert reader_text("a.\n", "The answer is: 3", "a.\nThe answer is: 3") == "a.\nThe answer is: 3"
    assert reader_text("", "x", "x") == "x"
    assert reader_text("a", "b", "something else") == "something else"
