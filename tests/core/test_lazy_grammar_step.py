"""A greedy grammar row on the host checks its top token first and computes the allowed set only where it must
(decoding/step.py: grammar_choice; constraints/compile.py: Matcher.holds, Matcher.not_alone, Matcher.check).

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

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from formtax.constraints import compile_grammar, parse_spec
from formtax.constraints.closing import start_witness
from formtax.constraints.compile import HELD, HELD_NOT_ALONE, Matcher, exact_words
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
        filled = Matcher(m.ll.deep_copy(), tok.engine, tok.n_logits)
        filled.allowed_words()  # its set computed: the bits answer
        for t in sorted(sample):
            assert probe.holds(t) == (t in allowed), (spec, t)
            for who in (probe, filled):  # check() fuses holds() and not_alone()
                assert who.check(t) == (0 if t not in allowed else HELD_NOT_ALONE if who.not_alone(t) else HELD)
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
    refused with None (its answer is the grammar's check too), not counted as a refusal of the model's choice,
    and not searched; the step's first choice is still the next token asked. A token it accepts is one the
    grammar allows."""
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
        assert closer.vet(t) is None  # not the grammar's (False: allowed, and refused)
    assert (closer.changed, closer.refused, searched) == (0, 0, [])
    assert closer._first  # the model's choice is still to come
    inside = [t for t in range(tok.engine.vocab_size) if (int(words[t >> 5]) >> (t & 31)) & 1][:50]
    assert all(m.holds(t) for t in inside if closer.vet(t))


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31 - 1), spec=st.sampled_from(WALK_SPECS), tokenizer=st.sampled_from(["smollm2", "bytes"]))
def test_the_budgets_last_token_finishes_as_advance_then_the_budget(seed: int, spec: str, tokenizer: str) -> None:
    """ConstrainedPolicy.advance_last (no engine consume: one check of the token then EOS) names the finish that
    advance then budget_exhausted name, for allowed tokens, refused ones and EOS, at states along a random walk
    (the walk ends where the grammar completes, so the last states accept)."""
    tok = planted_tokenizer(tokenizer)
    compiled = compile_grammar(parse_spec(spec).grammar, tok.engine)
    rng = random.Random(seed)
    seen: set[str] = set()
    walks = [None, start_witness(compiled, tok.n_logits)]  # a random walk, and the start witness (it completes)
    for walk in walks:
        m = compiled.matcher(tok.n_logits)
        for k in range(40 if walk is None else len(walk)):
            if m.stopped:
                break
            allowed = sorted(set(ids_from_words(m.allowed_words(), tok.n_logits).tolist()))
            nxt = rng.choice([t for t in allowed if t not in tok.eos_ids] or allowed) if walk is None else walk[k]
            for t in {nxt, *rng.sample(allowed, min(6, len(allowed))), rng.randrange(tok.engine.vocab_size),
                      *tok.eos_ids}:
                fast = ConstrainedPolicy(m.copy(), tok.eos_ids)
                slow = ConstrainedPolicy(m.copy(), tok.eos_ids)
                want = slow.advance(t) or slow.budget_exhausted()
                assert fast.advance_last(t) == want, (spec, t)
                seen.add(want)
            assert m.consume(nxt)
    assert {"length", "length-incomplete", "eos"} <= seen, seen


FORCED_SPECS = [*WALK_SPECS, "The answer is: {int:0..999}", "{choice:yes|no|maybe}", "regex:(ab|abc)d[0-9]{2}",
                'json:{"type":"array","items":{"enum":["red","green","blue"]},"minItems":2}',
                'json:{"type":"object","properties":{"k":{"const":"fixed value"},"n":{"type":"number"}},'
                '"required":["k","n"]}']


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31 - 1), spec=st.sampled_from(FORCED_SPECS),
       tokenizer=st.sampled_from(["smollm2", "bytes"]))
def test_a_state_with_forced_tokens_allows_its_first_alone(seed: int, spec: str, tokenizer: str) -> None:
    """The engine property Matcher.allowed_words rests on where the grammar forces tokens: where llguidance
    names forced tokens (``compute_ff_tokens`` non-empty), its mask allows the first of them and nothing else,
    so the set is that one token, without the mask (checked here against the engine's own mask, along random
    walks; ``Matcher.allowed_words`` reads the set that way, so the engine's mask is computed on a copy)."""
    tok = planted_tokenizer(tokenizer)
    m = compile_grammar(parse_spec(spec).grammar, tok.engine).matcher(tok.n_logits)
    rng = random.Random(seed)
    for _ in range(40):
        if m.stopped:
            break
        probe = m.ll.deep_copy()
        engine = np.zeros((tok.engine.vocab_size + 31) // 32, dtype=np.int32)
        probe.unsafe_compute_mask_ptr(engine.ctypes.data, engine.nbytes)
        want = ids_from_words(exact_words(engine, tok.engine.vocab_size), tok.n_logits).tolist()
        forced = probe.compute_ff_tokens()
        if forced:
            assert want == [forced[0]], (spec, forced, want[:8])
        assert ids_from_words(m.allowed_words(), tok.n_logits).tolist() == want, spec
        assert m.forced_token() == (forced[0] if forced and forced[0] < tok.n_logits else None)
        m.consume(rng.choice(want))


SPARSE_SPECS = [*WALK_SPECS, "regex:[0-9]{1,6}", 'json:{"type":"array","items":{"type":"integer"}}']


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31 - 1), spec=st.sampled_from(SPARSE_SPECS), tries=st.integers(1, 8),
       p_accept=st.sampled_from([0.0, 0.001, 0.3]), special=st.sampled_from(["", "-inf", "nan"]))
def test_a_proving_vetos_re_choices_by_its_own_checks_equal_ranking_then_vetting(
        seed: int, spec: str, tries: int, p_accept: float, special: str) -> None:
    """decoding/step.rejudged (closing's re-choices: each pick asked of the veto alone, whose None passes over a
    token the grammar does not allow) against rechosen over the state's mask (the allowed tokens ranked, then
    vetted): the same choice, and the veto asked of the same allowed tokens in the same order. States that force
    no bytes along random walks: dense ones (a string's inside) and sparse ones (digits), where the picks give
    out after DENSE_SPARE passed over and the mask's ranking goes on with the refusals so far; rows with -inf
    and NaN entries too."""
    import torch

    from formtax.decoding.plan import GrammarStep, Veto
    from formtax.decoding.sampling import GREEDY
    from formtax.decoding.step import rechosen, rejudged

    rng = random.Random(seed)
    tok = planted_tokenizer("smollm2")
    m = compile_grammar(parse_spec(spec).grammar, tok.engine).matcher(tok.n_logits)
    states = []
    for _ in range(14):
        if m.stopped:
            break
        if not m.forces():
            states.append(m.copy())
        m.consume(rng.choice(ids_from_words(m.allowed_words(), tok.n_logits).tolist()))
    if not states:
        return
    state = rng.choice(states)
    allowed = ids_from_words(state.allowed_words(), tok.n_logits)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tok.n_logits, generator=g) * 3
    if special:
        x[torch.rand(tok.n_logits, generator=g) < 0.1] = float(special)
    top = int(allowed[int(np.argmax(x.numpy()[allowed]))])  # the first choice, refused
    accepted = {int(t) for t in allowed if rng.random() < p_accept} - {top}
    fallback = int(rng.choice(allowed.tolist()))

    def step(asked: list[int]) -> GrammarStep:
        def accept(t: int) -> bool | None:
            if not state.holds(t):
                return None
            asked.append(t)
            return t in accepted

        return GrammarStep(state, None, Veto(accept, lambda: fallback, tries, proves=True))

    ours: list[int] = []
    theirs: list[int] = []
    got = rejudged(x, step(ours), top)
    want = rechosen(x, step(theirs).plan(), GREEDY, None, [top])
    assert got == want, (spec, top, got, want)
    assert ours == theirs
