"""The json strategy keeps a template's language exactly: text around a slot, several slots, bounds, caps.

The answer field used to be a JSON-schema pattern (a superset: ``The answer is: 1234`` for ``{int:0..999}`` came
back with parse_ok=True). Now the template's own rules sit inside the string's quotes and the template's own
oracle checks the value. Oracle here: an independent regex and range check.
"""

from __future__ import annotations

import json
import re

import pytest

import formtax
from formtax.backends.fake import FakeBackend, random_logits
from formtax.constraints.jsonreason import JsonReasonAnswer
from formtax.constraints.parse import parse_spec
from formtax.errors import ConstraintError

Q = "What is 12 + 30?"


@pytest.mark.parametrize("seed", range(25))
def test_bounded_slot_inside_text_is_never_out_of_range(seed):
    r = formtax.generate(FakeBackend(random_logits(seed=seed)), Q, "json", "The answer is: {int:0..999}",
                         max_tokens=120, temperature=1.0, seed=seed)
    assert r.parse_ok, (r.text, r.finish_reason)  # closing mode: every answer finishes inside the budget
    answer = json.loads(r.answer_text or "")["answer"]
    m = re.fullmatch(r"The answer is: (-?\d+)", answer)
    assert m is not None and 0 <= int(m.group(1)) <= 999, answer


@pytest.mark.parametrize("seed", range(10))
def test_free_text_slot_keeps_its_cap_and_is_never_empty(seed):
    r = formtax.generate(FakeBackend(random_logits(seed=seed)), Q, "json", "Label: {str:3}", max_tokens=120,
                         temperature=1.0, seed=seed)
    assert r.parse_ok, (r.text, r.finish_reason)  # closing mode: every answer finishes inside the budget
    answer = json.loads(r.answer_text or "")["answer"]
    assert answer.startswith("Label: ") and 1 <= len(answer) - len("Label: ") <= 3 * 4, answer


def test_adjacent_slots_try_every_split():
    c = JsonReasonAnswer(parse_spec("{int:0..9}{int:10..99}"), reason_tokens=8)
    assert c.validate('{"reason": "", "answer": "242"}').ok  # 2 | 42, after 24 | 2 fails its bound
    assert not c.validate('{"reason": "", "answer": "2 42"}').ok
    assert parse_spec("{int:0..9}{int:10..99}").validate("242").value == [2, 42]


def test_text_that_needs_json_escaping_is_refused_up_front():
    with pytest.raises(ConstraintError, match="needs JSON escaping"):
        JsonReasonAnswer(parse_spec('Say "{int}"'), reason_tokens=8).grammar  # noqa: B018
