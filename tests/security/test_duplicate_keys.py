"""Issue 55 point 8: no JSON answer formtax constrains ever repeats a key. A model that favours a few key bytes
(so that keys repeat often when nothing stops them) under random logits, Hypothesis over seeds, schemas,
strategies, closing and temperature; the same model without the guard repeats keys, so the test can fail."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import formtax
from formtax.backends.fake import FakeBackend, random_logits
from formtax.constraints.jsonkeys import repeated_keys, schema_may_repeat_keys

FAVOURED = b'{}"a: 1,'
OPEN_SCHEMAS = [
    {"type": "object"},
    {"type": "object", "additionalProperties": {"type": "integer"}},
    {"type": "object", "properties": {"o": {"type": "object"}}, "required": ["o"], "additionalProperties": False},
    {"type": "array", "items": {"type": "object", "additionalProperties": {"type": "integer"}}, "minItems": 1},
]


def keyish(seed: int, boost: float):
    base = random_logits(seed=seed, scale=2.0, context=3)

    def fn(seq):
        x = base(seq).clone()
        x[list(FAVOURED)] += boost
        return x

    return fn


def no_repeats(pairs):
    keys = [k for k, _ in pairs]
    assert len(keys) == len(set(keys)), keys
    return dict(pairs)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), schema=st.sampled_from(OPEN_SCHEMAS), boost=st.floats(2.0, 8.0),
       strategy=st.sampled_from(["constrained", "inwriting", "json"]), closing=st.booleans(),
       temperature=st.sampled_from([0.0, 1.0]))
def test_no_answer_repeats_a_key(seed, schema, boost, strategy, closing, temperature):
    backend = FakeBackend(keyish(seed, boost))
    closing = closing or strategy != "constrained"  # an open answer fits a reasoning strategy's budget by closing
    r = formtax.generate(backend, "q", strategy, schema, max_tokens=48, closing=closing, temperature=temperature,
                         seed=seed)
    text = r.answer_text or ""
    assert repeated_keys(text) == 0, text
    if r.parse_ok:
        json.loads(text, object_pairs_hook=no_repeats)


def test_without_the_guard_the_same_model_repeats_keys(monkeypatch):
    import formtax.strategies.basic as basic

    monkeypatch.setattr(basic, "key_guard", lambda engine, constraint: None)
    repeats = 0
    for seed in range(30):
        r = formtax.generate(FakeBackend(keyish(seed, 6.0)), "q", "constrained", {"type": "object"}, max_tokens=48,
                             closing=False)
        repeats += repeated_keys(r.answer_text or "")
    assert repeats > 0


@pytest.mark.parametrize(("schema", "open_"), [
    ({"type": "object"}, True), ({}, True), ({"type": "object", "properties": {"a": {}}}, True),
    ({"type": "object", "properties": {"a": {"type": "integer"}}, "additionalProperties": False}, False),
    ({"type": "array", "items": {"type": "integer"}}, False),
    ({"enum": [{"a": 1}]}, False),
    ({"anyOf": [{"type": "string"}, {"type": "object", "additionalProperties": False}]}, False),
    ({"$defs": {"x": {"type": "object"}}, "$ref": "#/$defs/x"}, True),
])
def test_which_schemas_may_repeat_a_key(schema, open_):
    assert schema_may_repeat_keys(schema) is open_


def test_a_closed_schema_pays_nothing_and_keeps_vllm_grammar_rows():
    """No guard where the grammar already forbids repeats: the row lowers to a plain grammar row."""
    from formtax.constraints.spec import JsonConstraint
    from formtax.decoding.lowering import Lowering
    from formtax.strategies.basic import constrained_policy

    backend = FakeBackend(random_logits(seed=0))
    closed = JsonConstraint({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"],
                             "additionalProperties": False})
    opened = JsonConstraint({"type": "object"})
    assert constrained_policy(backend, closed).lowered(closed).kind == Lowering.GRAMMAR
    assert constrained_policy(backend, opened).lowered(opened).kind == Lowering.LIVE


def test_a_guarded_row_equals_the_unguarded_one_where_no_key_repeats(monkeypatch):
    """The guard is invisible where it need not act: same tokens with and without it when no key repeats."""
    import formtax.strategies.basic as basic

    texts = []
    for guarded in (True, False):
        if not guarded:
            monkeypatch.setattr(basic, "key_guard", lambda engine, constraint: None)
        out = []
        for seed in range(20):
            r = formtax.generate(FakeBackend(random_logits(seed=seed)), "q", "constrained",
                                 {"type": "object", "additionalProperties": {"type": "integer"}}, max_tokens=40,
                                 closing=False)
            out.append((r.token_ids, repeated_keys(r.answer_text or "")))
        texts.append(out)
    compared = [a == b for (a, _), (b, reps) in zip(texts[0], texts[1], strict=True) if reps == 0]
    assert compared, "no seed wrote an object without a repeated key: nothing was compared"
    assert all(compared), compared
