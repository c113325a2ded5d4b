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
