"""Native Python answer types (constraints/native.py): each is the equivalent constraint plus a typed value."""

from __future__ import annotations

import enum
import re
from typing import Literal

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, field_validator

import formtax
from formtax.backends.fake import FakeBackend, random_logits
from formtax.constraints.native import FLOAT_REGEX, INT_REGEX, as_constraint, from_pydantic
from formtax.errors import ConfigError, ConstraintError

Q = "What is the answer?"


class Color(enum.Enum):
    RED = "red"
    GREEN = "green"


class Person(BaseModel):
    name: str
    age: int


class Picky(BaseModel):
    n: int

    @field_validator("n")
    @classmethod
    def never(cls, v: int) -> int:
        raise ValueError("n is never acceptable")


CASES = [
    (int, int, lambda r: re.fullmatch(INT_REGEX, r.answer_text)),
    (float, float, lambda r: re.fullmatch(FLOAT_REGEX, r.answer_text)),
    (bool, bool, lambda r: r.answer_text in ("true", "false")),
    (["yes", "no"], str, lambda r: r.parsed in ("yes", "no")),
    (("a", "bb"), str, lambda r: r.parsed in ("a", "bb")),
    (Literal["x", "y"], str, lambda r: r.parsed in ("x", "y")),
    (Literal[1, 22], int, lambda r: r.parsed in (1, 22)),
    (Color, Color, lambda r: r.parsed in (Color.RED, Color.GREEN)),
    (re.compile(r"[0-9]{3}"), str, lambda r: re.fullmatch(r"[0-9]{3}", r.parsed)),
    (str, str, lambda r: "\n" not in r.parsed and r.parsed),
]


@pytest.mark.parametrize(("answer", "python_type", "check"), CASES)
@given(seed=st.integers(0, 10_000))
@settings(max_examples=8, deadline=None)
def test_native_answers_parse_to_their_type(answer, python_type, check, seed):
    r = formtax.generate(FakeBackend(random_logits(seed=seed)), Q, "constrained", answer, max_tokens=24)
    if answer is str and r.finish_reason == "length-incomplete":  # one unbounded line can outrun the budget
        assert not r.parse_ok
        return
    assert r.parse_ok, (answer, r.text, r.parse_error)
    assert isinstance(r.parsed, python_type), (answer, r.parsed)
    assert check(r), (answer, r.answer_text, r.parsed)


@given(seed=st.integers(0, 10_000))
@settings(max_examples=8, deadline=None)
def test_pydantic_answer_is_an_instance_of_a_closed_schema(seed):
    c = as_constraint(Person)
    assert c.schema["additionalProperties"] is False  # type: ignore[attr-defined]
    r = formtax.generate(FakeBackend(random_logits(seed=seed)), Q, "constrained", Person, max_tokens=60)
    if r.parse_ok:  # a random model may run out of budget inside an open string
        assert isinstance(r.parsed, Person)
        jsonschema.validate(r.parsed.model_dump(), c.schema)  # type: ignore[attr-defined]
        assert set(r.parsed.model_dump()) == {"name", "age"}
    else:
        assert r.finish_reason == "length-incomplete"


def test_open_schema_on_request_and_typed_failures_unparse():
    assert "additionalProperties" not in from_pydantic(Person, closed=False).schema
    r = formtax.generate(FakeBackend(random_logits(seed=1)), Q, "constrained", Picky, max_tokens=24)
    assert not r.parse_ok and r.parsed is None
    assert "never acceptable" in (r.parse_error or "")


def test_json_strategy_types_the_answer_field():
    r = formtax.generate(FakeBackend(random_logits(seed=3)), Q, "json", Literal[1, 22], max_tokens=80)
    assert r.parse_ok and r.parsed in (1, 22), (r.text, r.parse_error)


@pytest.mark.parametrize("bad", [object(), {1, 2}, 3.5, re.compile("a", re.IGNORECASE), [], ["a", "a"], list])
def test_unsupported_answers_name_what_is_accepted(bad):
    with pytest.raises(ConstraintError) as e:
        as_constraint(bad)
    msg = str(e.value)
    assert "\n" not in msg
    if not isinstance(bad, (list, re.Pattern)):
        assert "accepted: a SPEC string" in msg


def test_a_plain_transformers_model_gets_a_clear_error():
    class NotABackend:
        pass

    with pytest.raises(ConfigError, match="from_transformers"):
        formtax.generate(NotABackend(), Q)  # type: ignore[arg-type]
    from transformers import LlamaConfig, LlamaForCausalLM

    tiny = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                        num_key_value_heads=2, intermediate_size=32))
    with pytest.raises(ConfigError, match="tokenizer"):
        formtax.from_transformers(tiny, None)
    with pytest.raises(ConfigError, match="causal LM"):
        formtax.from_transformers(FakeBackend(random_logits(seed=0)), None)


def test_strings_are_user_messages_unless_raw():
    fb = FakeBackend(random_logits(seed=5))
    chat = formtax.generate(fb, Q, "free", max_tokens=8)
    msgs = formtax.generate(fb, [{"role": "user", "content": Q}], "free", max_tokens=8)
    raw = formtax.generate(fb, Q, "free", max_tokens=8, raw=True)
    assert chat.token_ids == msgs.token_ids
    assert chat.tokens.prompt == len(fb.tokenizer.prompt_ids([{"role": "user", "content": Q}]))
    assert raw.tokens.prompt == len(fb.tokenizer.prompt_ids(Q)) != chat.tokens.prompt
