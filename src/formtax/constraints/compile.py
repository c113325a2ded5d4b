"""Engine-level compile-and-cache, and the per-request matcher.

The split follows vLLM v1: a grammar is compiled once per (grammar, tokenizer) and kept in a cache; each request
gets a cheap ``deep_copy`` of the pristine matcher and drives it with consume / rollback / copy. The matcher never
raises in the middle of a decode loop: errors are an explicit state (``error``) that the strategy turns into an
error result.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import llguidance
import llguidance.hf
import llguidance.torch
import torch

from formtax.cache import LRU
from formtax.errors import ConstraintError

_SHIFTS = torch.arange(32, dtype=torch.int32)


class EngineTokenizer:
    """A Hugging Face fast tokenizer together with its llguidance twin (built once: it costs ~0.5 s at 49k)."""

    def __init__(self, hf_tokenizer: Any, n_vocab: int | None = None, eos_ids: list[int] | None = None) -> None:
        self.hf = hf_tokenizer
        self.ll = llguidance.hf.from_tokenizer(hf_tokenizer, n_vocab=n_vocab, eos_token=eos_ids)
        self.vocab_size: int = self.ll.vocab_size
        s = hf_tokenizer.backend_tokenizer.to_str()
        self.key = hashlib.sha256(s.encode()).hexdigest()


@dataclass
class CompiledGrammar:
    """A grammar compiled for one tokenizer; ``matcher()`` hands out per-request state."""

    grammar: str
    tokenizer: EngineTokenizer
    _pristine: llguidance.LLMatcher

    _empty: bool | None = None

    def matcher(self, n_logits: int) -> Matcher:
        m = Matcher(self._pristine.deep_copy(), self.tokenizer, n_logits)
        m.grammar = self.grammar
        return m

    def matches_nothing(self, n_logits: int, eos_ids: frozenset[int]) -> bool:
        """Whether no output satisfies the grammar: at the start state nothing but EOS is allowed and the
        matcher does not accept. Decided once per compiled grammar (it costs one mask)."""
        if self._empty is None:
            m = self.matcher(n_logits)
            self._empty = m.error is None and not m.accepting and all(i in eos_ids for i in m.allowed_ids())
        return self._empty


_CACHE: LRU[tuple[str, str], CompiledGrammar] = LRU(256)


def compile_grammar(grammar: str, tokenizer: EngineTokenizer) -> CompiledGrammar:
    """Compile (or fetch from the cache) ``grammar`` for ``tokenizer``; ConstraintError if the engine rejects it."""
    key = (grammar, tokenizer.key)
    hit = _CACHE.get(key)
    if hit is not None:
        return hit
    m = llguidance.LLMatcher(tokenizer.ll, grammar)
    if m.is_error():
        raise ConstraintError(f"the grammar engine rejected the constraint: {m.get_error().strip()}")
    return _CACHE.put(key, CompiledGrammar(grammar, tokenizer, m))


def cache_size() -> int:
    return len(_CACHE)


class Matcher:
    """Per-request grammar state: allowed set, consume, rollback, copy, explicit error state."""

    def __init__(self, ll: llguidance.LLMatcher, tokenizer: EngineTokenizer, n_logits: int) -> None:
        self._ll = ll
        self._tok = tokenizer
        self.n_logits = n_logits
        self._bitmask = llguidance.torch.allocate_token_bitmask(1, tokenizer.vocab_size)
        self.consumed = 0
        self.grammar = ""  # the grammar's text (closing mode's search reads its literals)

    # -- the allowed set ------------------------------------------------------------------------------------
    def allowed_mask(self) -> torch.Tensor:
        """Bool tensor [n_logits]: True where the token is allowed next (EOS only where the grammar accepts)."""
        llguidance.torch.fill_next_token_bitmask(self._ll, self._bitmask, 0)
        bits = ((self._bitmask[0].unsqueeze(1) >> _SHIFTS) & 1).bool().flatten()
        v = self._tok.vocab_size
        if self.n_logits <= v:
            return bits[: self.n_logits]
        out = torch.zeros(self.n_logits, dtype=torch.bool)
        out[:v] = bits[:v]
        return out

    def allowed_ids(self) -> list[int]:
        return self.allowed_mask().nonzero().flatten().tolist()

    @property
    def ll(self) -> llguidance.LLMatcher:
        """The engine's matcher (for searches that copy it, e.g. closing mode's witness)."""
        return self._ll

    @property
    def tokenizer(self) -> EngineTokenizer:
        return self._tok

    @property
    def hints(self) -> tuple[bytes, ...]:
        from formtax.constraints.closing import grammar_hints

        return grammar_hints(self.grammar) if self.grammar else ()

    # -- state ----------------------------------------------------------------------------------------------
    def consume(self, token: int) -> bool:
        ok = bool(self._ll.consume_token(token))
        if ok:
            self.consumed += 1
        return ok

    def consume_many(self, tokens: list[int]) -> bool:
        return all(self.consume(t) for t in tokens)

    def rollback(self, n: int) -> None:
        if n:
            self._ll.rollback(n)
            self.consumed -= n

    def copy(self) -> Matcher:
        m = Matcher(self._ll.deep_copy(), self._tok, self.n_logits)
        m.consumed, m.grammar = self.consumed, self.grammar
        return m

    @property
    def accepting(self) -> bool:
        return bool(self._ll.is_accepting())

    @property
    def stopped(self) -> bool:
        """No token but EOS can follow (the grammar is complete), or the matcher is in error."""
        return bool(self._ll.is_stopped())

    @property
    def error(self) -> str | None:
        return self._ll.get_error() if self._ll.is_error() else None

    def forced_tokens(self) -> list[int]:
        """Tokens the grammar forces from here (no choice left), without consuming them."""
        return list(self._ll.compute_ff_tokens())


def validate_with_engine(grammar: str, text: str) -> tuple[bool, str | None]:
    """Run the engine on ``text``'s bytes with the byte tokenizer: the oracle for Lark grammars."""
    from formtax.backends.bytetok import byte_tokenizer

    tok = _byte_engine_tokenizer()
    m = llguidance.LLMatcher(tok.ll, grammar)
    if m.is_error():
        return False, m.get_error()
    ids = byte_tokenizer().encode(text, add_special_tokens=False)
    if not m.consume_tokens(ids):
        first = (m.get_error() or "rejected").strip().splitlines()[0]
        return False, f"the grammar rejects the text: {first}"
    if not m.is_accepting():
        return False, "the text is an incomplete sentence of the grammar"
    return True, None


_BYTE_TOK: EngineTokenizer | None = None


def _byte_engine_tokenizer() -> EngineTokenizer:
    global _BYTE_TOK
    if _BYTE_TOK is None:
        from formtax.backends.bytetok import byte_tokenizer

        _BYTE_TOK = EngineTokenizer(byte_tokenizer())
    return _BYTE_TOK
