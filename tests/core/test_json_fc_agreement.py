"""JSON at FC: the engine and the oracle agree on every string they are given (Hypothesis).

The engine never accepts what the oracle rejects (``"answer": ""`` was the counterexample: the engine allowed an
empty answer the FC schema's minLength refuses). On escape-free strings within the caps they accept the same
texts. Strings with escapes are the documented gap: the engine's reason cap can cut anywhere, so it excludes
escapes (constraints/spec.py); the oracle, a JSON parser, accepts them.
"""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from formtax.backends.fake import FakeBackend, random_logits
from formtax.constraints.compile import compile_grammar
from formtax.constraints.spec import JsonReasonAnswer, parse_spec

TOK = FakeBackend(random_logits(seed=1)).tokenizer
FC = JsonReasonAnswer(parse_spec("{str}"), reason_tokens=40)
COMPILED = compile_grammar(FC.grammar, TOK.engine)
TEXT = st.text(alphabet=st.sampled_from(list('ab z"\\\n\t\u00e9')), max_size=24)


def _engine_accepts(text: str) -> bool:
    m = COMPILED.matcher(TOK.n_logits)
    for t in TOK.encode(text):
        if not m.consume(t):
            return False
    return m.error is None and m.accepting


@settings(max_examples=300, deadline=None)
@given(reason=TEXT, answer=TEXT)
def test_engine_never_accepts_what_the_oracle_rejects(reason, answer):
    text = '{"reason": ' + json.dumps(reason, ensure_ascii=False) + ', "answer": ' + json.dumps(
        answer, ensure_ascii=False) + "}"
    engine, oracle = _engine_accepts(text), FC.validate(text).ok
    assert not engine or oracle, text  # never accepted-but-invalid
    escape_free = not any(c in s for s in (reason, answer) for c in '"\\\n\t')
    if escape_free:
        assert engine == oracle, text
