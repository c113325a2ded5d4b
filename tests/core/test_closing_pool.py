"""Closing's shared witness pool holds the start witness's byte suffixes (constraints/closing.py: byte_suffixes).

What they are for: a row that writes the witness's structure in other tokens (a string opened with its first
characters in one token) stops between the witness's token boundaries; the witness's bytes from the next quote on
complete it, so the row needs no search. Oracle for "changes no output": the same requests decoded with the byte
suffixes left out (``BYTE_SUFFIXES = 0``, the pool as it was), token for token, at budgets that bind.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import pytest
import torch

import formtax
from formtax.backends.fake import FakeBackend
from formtax.cache import LRU
from formtax.constraints import closing, compile_grammar, parse_spec
from formtax.constraints.closing import Closer, byte_suffixes, start_witness
from formtax.planted.backend import planted_tokenizer

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
