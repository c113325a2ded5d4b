"""Issue 49 ("one source of truth"): the validator of an integer JSON answer accepts exactly the literals its
grammar writes. JSON Schema's ``integer`` takes ``1e2`` and ``100.0``, and JSON reads ``-0`` as 0, but the grammar
refuses all three; the validator used to accept them. Oracle: the engine run on the same text."""

from __future__ import annotations

import pytest

from formtax.constraints.compile import validate_with_engine
from formtax.constraints.jsonreason import JsonReasonAnswer
from formtax.constraints.native import as_constraint

LITERALS = ["0", "7", "100", "-5", "1e2", "1E2", "100.0", "-0", "0.0", "007", "2e0", "12345678"]


@pytest.mark.parametrize("spec", ["answer-json:{int:0..}", "answer-json:{int}", "answer-json:{int:-10..10}"])
@pytest.mark.parametrize("literal", LITERALS)
def test_the_answer_objects_validator_is_its_grammar(spec, literal):
    c = as_constraint(spec)
    text = '{"answer": ' + literal + "}"
    assert c.validate(text).ok == validate_with_engine(c.grammar, text)[0], (spec, literal)


@pytest.mark.parametrize("literal", LITERALS)
def test_the_json_strategys_validator_is_its_grammar(literal):
    c = JsonReasonAnswer(as_constraint("{int}"), reason_tokens=8, escapes=False)
    text = '{"reason": "r", "answer": ' + literal + "}"
    assert c.validate(text).ok == validate_with_engine(c.grammar, text)[0], literal
