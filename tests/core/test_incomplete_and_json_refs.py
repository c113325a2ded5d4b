"""Issue 12's leftovers: an incomplete constrained answer is never parsed; json takes inline regex flags and
nested Pydantic models ($defs / $ref)."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

import formtax
from formtax.backends.fake import FakeBackend, random_logits
from formtax.constraints.jsonreason import JsonReasonAnswer
from formtax.constraints.spec import RegexConstraint


@given(seed=st.integers(0, 200), budget=st.integers(1, 3))
@settings(max_examples=60, deadline=None)
def test_an_incomplete_answer_is_never_parsed(seed, budget):
    r = formtax.generate(FakeBackend(random_logits(seed=seed)), "q", "constrained", "regex:.{1,5}", max_tokens=budget)
    if r.finish_reason == "length-incomplete":  # e.g. half a UTF-8 character, decoded as U+FFFD
        assert not r.parse_ok and r.parsed is None and "incomplete" in (r.parse_error or "")
    else:  # closing mode finished it: it parses and holds
        assert r.parse_ok and re.fullmatch(".{1,5}", r.answer_text or "", re.S), (r.text, r.finish_reason)


class Inner(BaseModel):
    x: int


class Outer(BaseModel):
    inner: Inner
    tag: str


@pytest.mark.parametrize("answer", ["regex:(?i)yes|no", Outer])
@pytest.mark.parametrize("seed", range(6))
def test_json_strategy_takes_inline_flags_and_refs(answer, seed):
    r = formtax.generate(FakeBackend(random_logits(seed=seed)), "q", "json", answer, max_tokens=240)
    assert r.error is None or r.finish_reason == "length-incomplete", r.error
    if r.parse_ok and answer is Outer:
        assert isinstance(r.parsed, Outer)
    elif r.parse_ok:
        assert re.fullmatch("(?i)yes|no", r.parsed)


def test_the_wrapper_schema_resolves_the_answers_refs():
    c = JsonReasonAnswer(formtax.constraints.as_constraint(Outer), reason_tokens=8)
    doc = {"reason": "r", "answer": {"inner": {"x": 1}, "tag": "t"}}
    jsonschema.validate(doc, c.schema)  # raised a referencing error before
    assert c.validate(json.dumps(doc)).ok
    assert not c.validate(json.dumps({"reason": "r", "answer": {"inner": {"x": "a"}, "tag": "t"}})).ok
    assert RegexConstraint("(?i)yes|no").answer_schema()["pattern"] == "(?i)^(?:yes|no)$"


@pytest.mark.parametrize("schema", [
    {"type": "number", "exclusiveMinimum": 0, "maximum": 1e-9},  # the engine admitted 0
    {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 0.001},
    {"type": "integer", "minimum": 2**53 + 1, "maximum": 2**53 + 3},  # the engine admitted 2^53
    {"type": "object", "properties": {"p": {"type": "integer", "minimum": 2**53 + 1, "maximum": 2**53 + 9}}},
])
def test_number_bounds_the_engine_gets_wrong_are_refused_up_front(schema):
    from formtax.errors import ConstraintError

    with pytest.raises(ConstraintError, match="grammar engine would accept"):
        formtax.constraints.as_constraint(schema)


@pytest.mark.parametrize("schema", [{"type": "integer", "minimum": 0, "maximum": 50},
                                    {"type": "number", "minimum": 0, "maximum": 1e-9},
                                    {"type": "integer", "exclusiveMinimum": 0, "maximum": 9}])
def test_exact_bounds_stay_accepted_and_hold(schema):
    c = formtax.constraints.as_constraint(schema)
    for seed in range(5):
        r = formtax.generate(FakeBackend(random_logits(seed=seed)), "q", "constrained", c, max_tokens=40)
        if r.parse_ok:
            jsonschema.validate(json.loads(r.answer_text), schema)


@pytest.mark.parametrize(("pattern", "needle"), [("[[:alpha:]]+", "set syntax"), ("[a-z&&[^aeiou]]", "set syntax"),
                                                 ("[a-z--[aeiou]]", "set syntax"), ("\\p{L}+", "Unicode property"),
                                                 ("abc\\z", "\\z")])
def test_regex_constructs_the_engine_and_oracle_read_differently_are_refused(pattern, needle):
    from formtax.errors import ConstraintError

    with pytest.raises(ConstraintError, match=re.escape(needle)):
        RegexConstraint(pattern)


AGREE = ["[0-9]{1,3}", "(yes|no)", "[a-c]+x?", "\\d{2}-\\w", "(?i)ab", "[^a]b*", "a.c", "\\s?[A-Z]{2}", "(ab|a)(bc|c)"]


@given(pattern=st.sampled_from(AGREE), text=st.text("abcxyAB019- \n_é٣", max_size=6))
@settings(max_examples=300, deadline=None)
def test_engine_and_oracle_agree_on_formtax_regex_dialect(pattern, text):
    """On the dialect formtax accepts, llguidance's regex and the oracle accept exactly the same texts (including
    Unicode digits and letters, where the two engines' tables could differ)."""
    from formtax.constraints.compile import validate_with_engine

    c = RegexConstraint(pattern)
    assert validate_with_engine(c.grammar, text)[0] == c.validate(text).ok, (pattern, text)
