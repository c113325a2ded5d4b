"""A greedy grammar row on the host checks its top token first and computes the allowed set only where it must
(decoding/step.py: grammar_choice; constraints/compile.py: Matcher.holds, Matcher.not_alone).

Two properties of the grammar engine make this exact, and both are checked here against the engine's own mask:
- ``validate_tokens([t])`` allows exactly the tokens the mask allows (``Matcher.holds`` without the mask);
- the mask holds every token whose bytes are a prefix of an allowed token's bytes, so a held token of several
  bytes whose first byte is a token of its own is never the only one allowed (``Matcher.not_alone``: the
  ``forced`` flag without the mask).
Oracle for the outputs: the same requests decoded through the planned step, which computes every mask
(``ConstrainedPolicy.grammar_step`` switched off), token for token with the same flags, finish reasons and
closing statistics, on random logits over the 49k tokenizer (tokens of many bytes) and the byte tokenizer.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from formtax.constraints import compile_grammar, parse_spec
from formtax.constraints.closing import start_witness
from formtax.constraints.compile import Matcher
from formtax.decoding.loop import decode
from formtax.decoding.plan import RowRequest
from formtax.decoding.policies import ConstrainedPolicy
from formtax.planted.backend import planted_tokenizer
from formtax.tensorops import ids_from_words
from tests.core.test_closing_pool import SPECS, smollm2_backend

WALK_SPECS = [*SPECS, 'json:{"type":"object","properties":{"n":{"type":"integer"},"t":{"type":"string",'
                      '"maxLength":5}},"required":["n","t"]}']


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31 - 1), spec=st.sampled_from(WALK_SPECS), tokenizer=st.sampled_from(["smollm2", "bytes"]))
def test_the_engine_check_of_one_token_and_the_prefix_rule_agree_with_its_mask(seed: int, spec: str,
                                                                                tokenizer: str) -> None:
    tok = planted_tokenizer(tokenizer)
    m = compile_grammar(parse_spec(spec).grammar, tok.engine).matcher(tok.n_logits)
    firsts = tok.engine.first_byte_tokens
    rng = random.Random(seed)
    for _ in range(12):
        if m.stopped:
            break
        words = m.allowed_words()
        ids = ids_from_words(words, tok.n_logits)
        allowed = set(ids.tolist())
        probe = Matcher(m.ll.deep_copy(), tok.engine, tok.n_logits)  # no computed set: the engine checks
        firsts_allowed = sorted({int(firsts[t]) for t in allowed if firsts[t] >= 0})
        sample = {*rng.sample(range(tok.engine.vocab_size), min(400, tok.engine.vocab_size)), *rng.sample(sorted(allowed), min(400, len(allowed))),
                  *firsts_allowed, *tok.eos_ids}
        for t in sorted(sample):
            assert probe.holds(t) == (t in allowed), (spec, t)
        if not bytes(m.ll.compute_ff_bytes()):  # a state that forces no bytes: every prefix of an allowed token is
            assert all(f in allowed for f in firsts_allowed), spec  # allowed
            assert all(probe.not_alone(t) == (firsts[t] >= 0) for t in sorted(allowed))
        else:
            assert not any(probe.not_alone(t) for t in sorted(allowed))  # no proof claimed there
        assert m.consume(rng.choice(sorted(allowed)))


def _runs(spec: str, closing: bool) -> list[tuple[object, ...]]:
    """Greedy grammar rows (the bench's rows: the policy alone, no key guard) of 2 prompts over random logits on
    the 49k tokenizer, at budgets that bind (with closing: the start witness's length and a little over it) and
    that do not; all decoded in one batch per seed."""
    tok = planted_tokenizer("smollm2")
    compiled = compile_grammar(parse_spec(spec).grammar, tok.engine)
    w = start_witness(compiled, tok.n_logits) if closing else None
    budgets = (len(w), len(w) + 4) if w is not None else (12, 40)
    out: list[tuple[object, ...]] = []
    for seed in range(3):
        rows = []
        for b in budgets:
            for k in range(2):
                policy = ConstrainedPolicy(compiled.matcher(tok.n_logits), tok.eos_ids,
                                           closing_limit=b if closing else None)
                if policy.closer is not None:
                    policy.closer.start_from(w)
                rows.append(RowRequest(tok.prompt_ids(f"q{k}"), policy, b))
        for o in decode(smollm2_backend(seed), rows):
            out.append((o.tokens, [(s.forced, s.masked) for s in o.steps], o.finish_reason, o.events))
    return out


@pytest.mark.parametrize("closing", [False, True], ids=["constrained", "closing"])
@pytest.mark.parametrize("spec", SPECS)
def test_the_top_token_first_step_equals_the_masked_step(spec: str, closing: bool,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    computed: list[int] = []
    real = Matcher._current

    def counted(self: Matcher):  # type: ignore[no-untyped-def]
        pre = self._prefilled
        if pre is None or pre.version != self._version:
            computed.append(1)
        return real(self)

    monkeypatch.setattr(Matcher, "_current", counted)
    lazy = _runs(spec, closing)
    lazy_masks = len(computed)
    monkeypatch.setattr(ConstrainedPolicy, "grammar_step", lambda self, step: None)
    computed.clear()
    planned = _runs(spec, closing)
    assert lazy == planned
    flags = {f for run in lazy for f in run[1]}  # type: ignore[attr-defined]
    assert (False, True) in flags
    if spec.startswith("json:"):  # a key's bytes are forced: forced steps occur too, and their flags agree
        assert (True, True) in flags
    assert lazy_masks < len(computed)  # and the top-token check really skipped masks


def test_closing_refuses_a_token_the_grammar_does_not_allow_without_effect() -> None:
    """Closing's veto may be asked before the grammar (``Veto.proves``): a token the grammar does not allow is
    refused, not counted as a refusal of the model's choice, and not searched; the step's first choice is still
    the next token asked. A token it accepts is one the grammar allows."""
    tok = planted_tokenizer("smollm2")
    compiled = compile_grammar(parse_spec(SPECS[0]).grammar, tok.engine)
    policy = ConstrainedPolicy(compiled.matcher(tok.n_logits), tok.eos_ids, closing_limit=30)
    closer = policy.closer
    assert closer is not None
    closer.start_from(start_witness(compiled, tok.n_logits))
    m = policy.matcher
    for t in tok.engine.ll.tokenize_bytes(b'{"a": "x'):
        assert m.consume(t)
        closer.advance(t)
    searched: list[int] = []
    real = closer._search
    closer._search = lambda *a, **k: searched.append(1) or real(*a, **k)  # type: ignore[method-assign]
    assert closer.begin_step(m.consumed)
    words = m.allowed_words()
    outside = [t for t in range(tok.engine.vocab_size) if not (int(words[t >> 5]) >> (t & 31)) & 1][:50]
    assert outside and min(tok.eos_ids) in outside  # EOS too: the grammar does not accept here
    for t in outside:
        assert not closer.vet(t)
    assert (closer.changed, closer.refused, searched) == (0, 0, [])
    assert closer._first  # the model's choice is still to come
    inside = [t for t in range(tok.engine.vocab_size) if (int(words[t >> 5]) >> (t & 31)) & 1][:50]
    assert all(m.holds(t) for t in inside if closer.vet(t))
