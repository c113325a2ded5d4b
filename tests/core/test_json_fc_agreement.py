"""JSON at FC is format-only (paper 003, Assumption 1): the engine and the oracle agree on every string.

The reason and a free-text answer accept every JSON string body, escapes included (``\\"``, ``\\n``, ``\\u00e9``,
raw unicode), in every layout a JSON parser reads (the flexible default) or in ``json.dumps``' compact spelling;
the engine never accepts what the oracle rejects (``"answer": ""`` under the schema's minLength) and accepts
everything the oracle accepts in the wrapper's key order. The caps that bound those strings are kept by the
policy (constraints/jsonstrings.py): a model that writes escapes up to and across its reason's cap still closes
the string cleanly and answers.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from formtax.backends.fake import FakeBackend, random_logits, scripted
from formtax.constraints.compile import compile_grammar
from formtax.constraints.jsonreason import JsonLayout, JsonReasonAnswer
from formtax.constraints.parse import parse_spec
from formtax.strategies import get_strategy
from formtax.strategies.base import Request

TOK = FakeBackend(random_logits(seed=1)).tokenizer
FLEX = JsonReasonAnswer(parse_spec("{str}"), reason_tokens=40)
COMPACT = JsonReasonAnswer(parse_spec("{str}"), reason_tokens=40, layout=JsonLayout.COMPACT)
SERVER = JsonReasonAnswer(parse_spec("{str}"), reason_tokens=40, escapes=False)
TEXT = st.text(alphabet=st.sampled_from(list('ab z"\\/\n\t\r\b\f\x01\x7f\u00e9\u4e2d\U0001f600')), max_size=16)
Q = [{"role": "user", "content": "q"}]


def _engine_accepts(c: JsonReasonAnswer, text: str) -> bool:
    m = compile_grammar(c.grammar, TOK.engine).matcher(TOK.n_logits)
    for t in TOK.encode(text):
        if not m.consume(t):
            return False
    return m.error is None and m.accepting


def _write(reason: str, answer: str, ascii_only: bool, indent: int | None, seps: tuple[str, str]) -> str:
    return json.dumps({"reason": reason, "answer": answer}, ensure_ascii=ascii_only, indent=indent, separators=seps)


@settings(max_examples=300, deadline=None)
@given(reason=TEXT, answer=TEXT, ascii_only=st.booleans(), indent=st.sampled_from([None, 0, 1, 2]),
       seps=st.sampled_from([(", ", ": "), (",", ":"), (" ,", " : ")]))
def test_flexible_fc_accepts_exactly_what_the_oracle_accepts(reason, answer, ascii_only, indent, seps):
    text = _write(reason, answer, ascii_only, indent, seps)
    assert _engine_accepts(FLEX, text) == FLEX.validate(text).ok, text


@settings(max_examples=200, deadline=None)
@given(reason=TEXT, answer=TEXT, ascii_only=st.booleans())
def test_compact_fc_accepts_every_string_in_json_dumps_spelling(reason, answer, ascii_only):
    text = _write(reason, answer, ascii_only, None, (", ", ": "))
    assert _engine_accepts(COMPACT, text) == COMPACT.validate(text).ok, text


PLAIN = "abc xyz019.,"  # characters no JSON string escapes


@settings(max_examples=200, deadline=None)
@example(reason="abc", answer="x")  # accepted: the implication below is exercised on every run
@example(reason="r", answer="")  # rejected by the oracle (the answer's minLength): the engine must reject it too
@given(reason=st.one_of(TEXT, st.text(alphabet=PLAIN, max_size=20)),
       answer=st.one_of(TEXT, st.text(alphabet=PLAIN, max_size=8)))
def test_the_server_form_never_accepts_what_the_oracle_rejects(reason, answer):
    # a server takes the grammar alone: escape-free strings capped by the engine (documented), still never
    # accepted-but-invalid; half the draws are plain text, which the engine accepts wherever the oracle does
    text = _write(reason, answer, False, None, (", ", ": "))
    accepted, valid = _engine_accepts(SERVER, text), SERVER.validate(text).ok
    assert not accepted or valid, text
    plain = all(c in PLAIN for c in reason + answer)
    assert accepted or not (valid and plain), text


@settings(max_examples=100, deadline=None)
@given(reason=st.text(alphabet="abc xyz019.,", max_size=20), answer=st.text(alphabet="abc xyz019", min_size=1, max_size=8))
def test_the_server_form_accepts_escape_free_text_and_the_oracle_agrees(reason, answer):
    text = _write(reason, answer, False, None, (", ", ": "))
    assert _engine_accepts(SERVER, text) and SERVER.validate(text).ok, text


def test_the_issues_examples():
    ok = '{"reason": "a \\"b\\" c", "answer": "x"}'
    assert _engine_accepts(FLEX, ok) and _engine_accepts(COMPACT, ok) and FLEX.validate(ok).ok
    empty = '{"reason": "r", "answer": ""}'
    assert not _engine_accepts(FLEX, empty) and not FLEX.validate(empty).ok
    pretty = '{\n  "reason": "r",\n  "answer": "x"\n}\n'
    assert _engine_accepts(FLEX, pretty) and not _engine_accepts(COMPACT, pretty)


# -- the policy-kept caps -------------------------------------------------------------------------------------

PIECES = st.sampled_from(["x", "\\n", '\\"', "\\\\", "\\u00e9", "\\u4e2d", "\u00e9", "\u4e2d", "ab", " "])


@settings(max_examples=60, deadline=None)
@given(pieces=st.lists(PIECES, min_size=1, max_size=8), cap=st.integers(4, 12),
       layout=st.sampled_from(list(JsonLayout)))
def test_a_reason_written_across_its_cap_closes_cleanly(pieces, cap, layout):
    """A model that never closes its reason and writes escapes everywhere: at the cap the string ends on a
    clean boundary, the answer follows, and the whole output is the oracle's JSON."""
    script = '{"reason": "' + "".join(pieces) * 40
    spec = parse_spec("{int:0..9}")
    strategy = get_strategy("json")
    probe = Request(Q, spec, max_tokens=200, options={"json_layout": layout.value})
    budget = cap + (strategy.answer_overhead(probe) or 0)
    r = strategy.run(FakeBackend(scripted(script)), [Request(Q, spec, max_tokens=budget,
                                                             options={"json_layout": layout.value})])[0]
    assert r.parse_ok, (r.answer_text, r.parse_error, r.finish_reason)
    obj = json.loads(r.answer_text or "")
    assert isinstance(obj["answer"], int) and r.tokens.total <= budget
    assert obj["reason"], obj  # the model's text up to a clean cut, not an empty string


@pytest.mark.parametrize("seed", range(12))
def test_sampled_fc_outputs_always_parse(seed):
    r = get_strategy("json").run(FakeBackend(random_logits(seed=seed)), [
        Request(Q, parse_spec("{str}"), max_tokens=160, seed=seed, temperature=1.0)])[0]
    assert r.finish_reason != "constraint-error"
    if r.finish_reason == "eos":
        assert r.parse_ok and FLEX.validate(r.answer_text or "").ok, r.answer_text
