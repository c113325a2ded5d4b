"""Closing's shared witness pool holds the start witness's byte suffixes (constraints/closing.py: byte_suffixes).

What they are for: a row that writes the witness's structure in other tokens (a string opened with its first
characters in one token) stops between the witness's token boundaries; the witness's bytes from the next quote on
complete it, so the row needs no search. Oracle for "changes no output": the same requests decoded with the byte
suffixes left out (``BYTE_SUFFIXES = 0``, the pool as it was), token for token, at budgets that bind.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import formtax
from formtax.backends.fake import FakeBackend
from formtax.cache import LRU
from formtax.constraints import closing, compile_grammar, parse_spec
from formtax.constraints.closing import Closer, WitnessPool, byte_suffixes, fits, start_witness
from formtax.constraints.compile import Matcher
from formtax.planted.backend import planted_tokenizer
from formtax.tensorops import ids_from_words

SCHEMA = 'json:{"type":"object","properties":{"s":{"type":"string"}},"required":["s"]}'
SPECS = ['json:{"type":"object","properties":{"a":{"type":"string"},"b":{"type":"array","items":'
         '{"type":"integer"}}},"required":["a","b"]}',
         'json:{"type":"object","properties":{"p":{"type":"object","properties":{"q":{"type":"string",'
         '"minLength":2}},"required":["q"]}},"required":["p"],"additionalProperties":false}',
         "regex:[a-z]+ ok", 'lark:start: "(" item ("," item)* ")"\nitem: /[a-z]+/ | start']


@pytest.fixture
def fresh_pools(monkeypatch: pytest.MonkeyPatch):
    """Empty start-witness and pool caches (so each mode builds its own pools), and a count of the searches."""
    searches = []
    real = Closer._search

    def counted(self, *a, **k):
        searches.append(1)
        return real(self, *a, **k)

    monkeypatch.setattr(Closer, "_search", counted)

    def reset(suffixes: int) -> None:
        monkeypatch.setattr(closing, "_POOLS", LRU(256))
        monkeypatch.setattr(closing, "_START", LRU(256))
        monkeypatch.setattr(closing, "BYTE_SUFFIXES", suffixes)
        searches.clear()

    return reset, searches


def _walk(text: str, budget: int) -> Closer:
    """A closing row over the bench's one-string schema that emits ``text``'s canonical tokens (each vetted)."""
    tok = planted_tokenizer("smollm2")
    compiled = compile_grammar(parse_spec(SCHEMA).grammar, tok.engine)
    matcher = compiled.matcher(tok.n_logits)
    closer = Closer(matcher, budget, frozenset(tok.eos_ids)).start_from(start_witness(compiled, tok.n_logits))
    for step, t in enumerate(tok.engine.ll.tokenize_bytes(text.encode())):
        assert closer.begin_step(step) and closer.vet(t), (text, step, t)
        assert matcher.consume(t)
        closer.advance(t)
    return closer


def test_a_string_opened_in_one_token_is_completed_from_the_pool(fresh_pools):
    reset, searches = fresh_pools
    tok = planted_tokenizer("smollm2")
    text = '{"s": "+ Audubon'
    assert len(tok.engine.ll.tokenize_bytes(b'{"s": "+')) == 4  # ` "+` opens the string and writes a byte
    reset(0)
    searched = _walk(text, 40).witness
    assert searches, "without the byte suffixes the row searches for the string's end"
    reset(32)
    closer = _walk(text, 40)
    assert not searches and closer.pooled >= 1
    end = list(tok.engine.ll.tokenize_bytes(b'"}'))
    compiled = compile_grammar(parse_spec(SCHEMA).grammar, tok.engine)
    assert end in byte_suffixes(tok.engine, start_witness(compiled, tok.n_logits) or [])
    assert closer.witness == searched == end  # the completion it follows is the one the search found


def smollm2_backend(seed: int) -> FakeBackend:
    """The fake backend's random logits over the embedded default's tokenizer (49k tokens, many of several
    bytes: a model that writes the witness's bytes in other tokens)."""
    tok = planted_tokenizer("smollm2")

    def fn(seq: Sequence[int]) -> torch.Tensor:
        key = hashlib.blake2b(repr((seed, list(seq[-4:]))).encode(), digest_size=8).digest()
        g = torch.Generator().manual_seed(int.from_bytes(key, "little") & ((1 << 63) - 1))
        return torch.randn(tok.n_logits, generator=g) * 3.0

    b = FakeBackend(fn)
    b._tok = tok
    return b


@pytest.mark.parametrize("spec", SPECS)
def test_the_byte_suffixes_change_no_output_where_the_budget_binds(fresh_pools, spec):
    reset, searches = fresh_pools
    tokens: dict[int, list[list[object]]] = {}
    counts = {}
    for suffixes in (0, 32):
        reset(suffixes)
        tok = planted_tokenizer("smollm2")
        w = start_witness(compile_grammar(parse_spec(spec).grammar, tok.engine), tok.n_logits)
        assert w is not None
        runs = [formtax.generate(smollm2_backend(seed), "q", "constrained", spec, max_tokens=len(w) + slack,
                                 raw=True, temperature=t, seed=seed)
                for seed in range(4) for slack in (0, 3) for t in (0.0, 1.0)]
        assert all(r.parse_ok for r in runs)
        tokens[suffixes] = [[*r.token_ids, r.finish_reason, r.stats.get("closing_changed_tokens")] for r in runs]
        counts[suffixes] = len(searches)
    assert tokens[32] == tokens[0]
    assert counts[32] <= counts[0]


def test_byte_suffixes_start_at_a_character_and_are_the_witness_own_bytes():
    tok = planted_tokenizer("smollm2").engine
    data = '{"s": "é, ü ok", "t": "日本"}'.encode()
    got = byte_suffixes(tok, list(tok.ll.tokenize_bytes(data)))
    texts = [bytes(tok.ll.decode_bytes(w)) for w in got]
    assert all(data.endswith(t) and t for t in texts)
    assert [t.decode() for t in texts]  # each starts at a character's first byte (strict UTF-8 decodes it)
    assert b'"}' in texts and '", "t": "日本"}'.encode() in texts
    assert len(texts) == len(set(texts)) and texts == sorted(texts, key=len)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31 - 1), spec=st.sampled_from(SPECS))
def test_the_pools_answer_is_the_shortest_fitting_witness_of_both(seed: int, spec: str) -> None:
    """Closer._pooled checks the row's own pool only before the shared pool's first fit, and skips what the
    shared pool has (tried there already): the answer is still the shortest fitting witness of the two pools
    together (ties by the lower tokens), or None. Brute force over every pooled witness is the oracle, along a
    random walk, with two pools drawn from the same witnesses (the start witness's and searches' along the walk),
    so each pool's first fit comes first in some states, and they share some witnesses."""
    rng = random.Random(seed)
    tok = planted_tokenizer("smollm2")
    compiled = compile_grammar(parse_spec(spec).grammar, tok.engine)

    def row() -> tuple[Matcher, Closer]:
        m = compiled.matcher(tok.n_logits)
        return m, Closer(m, 64, frozenset(tok.eos_ids)).start_from(start_witness(compiled, tok.n_logits))

    m, closer = row()
    walk, found = [], list(closer._shared.items)
    for _ in range(10):
        if m.stopped:
            break
        walk.append(rng.choice(ids_from_words(m.allowed_words(), tok.n_logits).tolist()))
        assert m.consume(walk[-1])
        closer.advance(walk[-1])
        w = closer._search(m.ll.deep_copy(), 12, b"")  # this state's shortest completion
        found += [tuple(w[k:]) for k in range(len(w))] if w else []
    m, closer = row()
    closer._shared = WitnessPool([w for w in found if rng.random() < 0.5])
    closer._own = WitnessPool([w for w in found if rng.random() < 0.5])
    eos = int(tok.engine.ll.eos_token)
    for t in walk:
        left, skip = rng.randint(0, 8), rng.choice([None, list(rng.choice(found))])
        fitting = [w for w in {*closer._shared.items, *closer._own.items}
                   if len(w) <= left and list(w) != skip and fits(m.ll, [t], w, eos)]
        want = min(fitting, key=lambda w: (len(w), w), default=None)
        assert closer._pooled([t], left, skip) == (None if want is None else list(want)), (spec, t, left)
        assert m.consume(t)
