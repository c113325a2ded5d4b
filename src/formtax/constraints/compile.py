"""Engine-level compile-and-cache, and the per-request matcher.

The split follows vLLM v1: a grammar is compiled once per (grammar, tokenizer) and kept in a cache; each request
gets a cheap ``deep_copy`` of the pristine matcher and drives it with consume / rollback / copy. The matcher never
raises in the middle of a decode loop: errors are an explicit state (``error``) that the strategy turns into an
error result.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import llguidance
import llguidance.hf
import numpy as np
import torch

from formtax.cache import LRU
from formtax.constraints.hints import grammar_hints
from formtax.errors import ConstraintError
from formtax.tensorops import bitmask_counts, unpack_bitmask, word_of


class EngineTokenizer:
    """A Hugging Face fast tokenizer together with its llguidance twin (built once: it costs ~0.5 s at 49k)."""

    def __init__(self, hf_tokenizer: Any, n_vocab: int | None = None, eos_ids: list[int] | None = None) -> None:
        self.hf = hf_tokenizer
        self.ll = llguidance.hf.from_tokenizer(hf_tokenizer, n_vocab=n_vocab, eos_token=eos_ids)
        self.vocab_size: int = self.ll.vocab_size
        s = hf_tokenizer.backend_tokenizer.to_str()
        self.key = hashlib.sha256(s.encode()).hexdigest()

    @cached_property
    def first_byte_tokens(self) -> list[int]:
        """For each token of two bytes or more, a token whose bytes are its first byte alone (-1: none, or a special
        token; -1 for every token of one byte or none). Built once per tokenizer (about 50 ms at 49k), at the first
        greedy grammar step that reads it (:meth:`Matcher.not_alone`). A list: read once per greedy step, where a
        list's index costs a third of numpy's ``item``."""
        ll, n = self.ll, self.vocab_size
        data = [b"" if ll.is_special_token(i) else bytes(ll.decode_bytes([i])) for i in range(n)]
        single: dict[int, int] = {}
        for i, b in enumerate(data):
            if len(b) == 1:
                single.setdefault(b[0], i)
        return [single.get(b[0], -1) if len(b) > 1 else -1 for b in data]


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
    m = llguidance.LLMatcher(tokenizer.ll, grammar, log_level=0)  # errors are read from the matcher, never printed
    if m.is_error():
        raise ConstraintError(f"the grammar engine rejected the constraint: {m.get_error().strip()}")
    return _CACHE.put(key, CompiledGrammar(grammar, tokenizer, m))


@dataclass
class _Prefilled:
    """A matcher's allowed set in one state (``version``): its packed words, and what was derived from them."""

    version: int
    words: np.ndarray
    empty: bool | None = None
    mask: torch.Tensor | None = None
    live: bool = False  # filled by fill_masks, which skips stopped matchers: this state is not stopped


HELD = 1
""":meth:`Matcher.check`: the token is held (whether it is alone is not known)."""
HELD_NOT_ALONE = 2
""":meth:`Matcher.check`: the token is held, and another token is too."""
REFUSED = -1
""":meth:`Matcher.check_proved`: the grammar allows the token and the proof refuses it."""


class Matcher:
    """Per-request grammar state: allowed set, consume, rollback, copy, explicit error state."""

    def __init__(self, ll: llguidance.LLMatcher, tokenizer: EngineTokenizer, n_logits: int) -> None:
        self._ll = ll
        self._tok = tokenizer
        self.n_logits = n_logits
        self._bitmask = np.full((tokenizer.vocab_size + 31) // 32, -1, dtype=np.int32)  # the engine writes here
        self._bitmask_ptr = self._bitmask.ctypes.data  # read once: numpy builds a ctypes object per access (~1.5 us)
        self.consumed = 0
        self.grammar = ""  # the grammar's text (closing mode's search reads its literals)
        self._version = 0  # bumped by every change of state: a prefilled mask is valid only for its version
        self._prefilled: _Prefilled | None = None  # this state's allowed set, once computed (or filled for a batch)
        self._forcing = (-1, False)  # (version, whether that state forces bytes): :meth:`forces`
        self._forced = (-1, -1)  # (version, the one token that state allows): :meth:`forced_token`

    # -- the allowed set ------------------------------------------------------------------------------------
    def _current(self) -> _Prefilled:
        pre = self._prefilled
        if pre is None or pre.version != self._version:
            words = self._forced_words()
            if words is None:
                self._ll.unsafe_compute_mask_ptr(self._bitmask_ptr, self._bitmask.nbytes)  # as llguidance.torch does
                words = exact_words(self._bitmask.copy(), self._tok.vocab_size)
            pre = self._prefilled = _Prefilled(self._version, words)
        return pre

    def _forced_words(self) -> np.ndarray | None:
        """The allowed set of a state where the engine names forced tokens: the first of them alone (the engine's
        mask allows nothing else there: tests/core/test_lazy_grammar_step.py checks this property of llguidance
        against its masks), packed, without the mask, which costs the engine 2-4 times more in such a state
        (a JSON object's opening keys); None elsewhere (the mask is computed)."""
        if not self.forces():
            return None
        forced = self._ll.compute_ff_tokens()
        if not forced:
            return None
        self._forced = (self._version, int(forced[0]))
        words = np.zeros_like(self._bitmask)
        words.view(np.uint32)[forced[0] >> 5] = np.uint32(1 << (forced[0] & 31))
        return words

    def allowed_words(self) -> np.ndarray:
        """This state's allowed set as llguidance's packed int32 words (no bit set past the tokenizer's
        vocabulary; EOS only where the grammar accepts). Read-only: it may be the row :func:`fill_masks` prepared."""
        return self._current().words

    def allowed_empty(self) -> bool:
        """Whether nothing at all is allowed in this state among the first ``n_logits`` tokens (the engine's dead
        end), from the words (counted for the whole batch by :func:`fill_masks`)."""
        pre = self._current()
        if pre.empty is None:
            if self.n_logits >= self._tok.vocab_size:
                pre.empty = not pre.words.any()
            else:
                pre.empty = bitmask_counts(pre.words, self.n_logits, self._tok.vocab_size)[0] == 0
        return pre.empty

    def allowed_mask(self) -> torch.Tensor:
        """Bool tensor [n_logits]: True where the token is allowed next (EOS only where the grammar accepts),
        unpacked from :meth:`allowed_words` once per state. Read-only."""
        pre = self._current()
        if pre.mask is None:
            pre.mask = unpack_bitmask(pre.words, self.n_logits, self._tok.vocab_size)
        return pre.mask

    def allowed_ids(self) -> list[int]:
        return self.allowed_mask().nonzero().flatten().tolist()

    def forces(self) -> bool:
        """Whether this state forces bytes (the engine's ``compute_ff_bytes``; asked once per state). Where it does,
        the engine's mask keeps to the canonical tokens of those bytes (``{"`` but not ``{``), which a check of one
        token (``validate_tokens``) does not see; where it does not, the two agree (:meth:`holds`)."""
        if self._forcing[0] != self._version:
            self._forcing = (self._version, bool(self._ll.compute_ff_bytes()))
        return self._forcing[1]

    def holds(self, token: int) -> bool:
        """Whether ``token`` is allowed next: one bit of this state's allowed set where it was computed; else, in a
        state that forces no bytes (:meth:`forces`), one engine check of that token alone (``validate_tokens``: the
        rule the mask applies to every token there, EOS only where the grammar accepts), without computing the
        set; else the set is computed. A token past the tokenizer or the logits is not held."""
        pre = self._prefilled
        if pre is None or pre.version != self._version:
            if not self.forces():
                return 0 <= token < min(self.n_logits, self._tok.vocab_size) and self._ll.validate_tokens([token]) == 1
            pre = self._current()
        return word_of(pre.words, self.n_logits, token) != 0

    def not_alone(self, token: int) -> bool:
        """Proof, without the allowed set, that a token this state allows is not the only one: the state forces no
        bytes (:meth:`forces`), the token's first byte is a token of its own
        (:attr:`EngineTokenizer.first_byte_tokens`), and in such a state the engine allows every token whose bytes
        are a prefix of an allowed token's (tests/core/test_lazy_grammar_step.py checks this property of
        llguidance against its masks). False says nothing: the caller counts the set."""
        if self.forces():
            return False
        return 0 <= self._tok.first_byte_tokens[token] < self.n_logits

    def forced_token(self) -> int | None:
        """The one token this state allows where the engine names forced tokens (their first: the set
        :meth:`allowed_words` builds from it), within the logits; else None (the set may still be one token)."""
        if not self.forces():
            return None
        self._current()
        version, token = self._forced
        return token if version == self._version and token < self.n_logits else None

    def check(self, token: int) -> int:
        """:meth:`holds` and :meth:`not_alone` in one call, for the host's greedy step (a grammar row's common step
        pays per call): 0 where ``token`` is not held, :data:`HELD_NOT_ALONE` where it is and is proved not the
        only token, :data:`HELD` where it is held and nothing is proved."""
        if self.forces():
            return HELD if self.holds(token) else 0
        pre = self._prefilled
        if pre is None or pre.version != self._version:
            if not (0 <= token < min(self.n_logits, self._tok.vocab_size) and self._ll.validate_tokens([token]) == 1):
                return 0
        elif not word_of(pre.words, self.n_logits, token):
            return 0
        return HELD_NOT_ALONE if 0 <= self._tok.first_byte_tokens[token] < self.n_logits else HELD

    def check_proved(self, token: int, proof: Callable[[int], bool | None]) -> int | None:
        """:meth:`check` where a proof that checks the token itself answers for the grammar (a proving veto's
        ``accept``: True, kept; False, allowed and refused; None, not allowed), in a state that forces no bytes,
        where a check of one token is the mask's bit: :meth:`check`'s answer for a kept token, :data:`REFUSED` for
        an allowed token the proof refuses, 0 for one the grammar does not allow. None where the state forces
        bytes (the proof is not asked). One call for a closing row's greedy step."""
        if self.forces():
            return None
        verdict = proof(token)
        if not verdict:
            return 0 if verdict is None else REFUSED
        return HELD_NOT_ALONE if 0 <= self._tok.first_byte_tokens[token] < self.n_logits else HELD

    @property
    def ll(self) -> llguidance.LLMatcher:
        """The engine's matcher (for searches that copy it, e.g. closing mode's witness)."""
        return self._ll

    @property
    def tokenizer(self) -> EngineTokenizer:
        return self._tok

    @property
    def hints(self) -> tuple[bytes, ...]:
        return grammar_hints(self.grammar) if self.grammar else ()

    # -- state ----------------------------------------------------------------------------------------------
    def consume(self, token: int) -> bool:
        self._version += 1
        ok = bool(self._ll.consume_token(token))
        if ok:
            self.consumed += 1
        return ok

    def takes_then_eos(self, token: int) -> int:
        """How many of ``token`` then EOS the engine takes from this state, which stays as it is: 0 (``token`` is
        not allowed: :meth:`consume` would fail), 1 (allowed, and the grammar does not accept after it), 2
        (allowed, and it accepts after it: :attr:`accepting` after :meth:`consume`)."""
        return int(self._ll.validate_tokens([token, int(self._tok.ll.eos_token)]))

    def consume_many(self, tokens: list[int]) -> bool:
        return all(self.consume(t) for t in tokens)

    def rollback(self, n: int) -> None:
        if n:
            self._version += 1
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
        """No token but EOS can follow (the grammar is complete), or the matcher is in error. (Known without asking
        the engine again for a state :func:`fill_masks` filled: it fills no stopped matcher.)"""
        pre = self._prefilled
        if pre is not None and pre.live and pre.version == self._version:
            return False
        return bool(self._ll.is_stopped())

    @property
    def error(self) -> str | None:
        return self._ll.get_error() if self._ll.is_error() else None


_EXECUTOR: llguidance.LLExecutor | None = None
PARALLEL_MIN_ROWS = 4
_PARALLEL = int(0.8 * (os.cpu_count() or 1)) >= 2
"""When a batch's masks go through llguidance's thread pool (``LLExecutor``); else the rows are filled one by one in
this thread. Ours, and why: the pool's own threads number 80% of the CPUs, so on a 2-core machine it has one and
only adds its dispatch (measured here: 12-16 us a call, the whole gain of batching at 8 rows, which made a
constrained row-step cost 65 us at batch 8 against 33 filled in this thread); below 4 rows the dispatch
always costs more than it saves."""


def fill_masks(matchers: list[Matcher]) -> None:
    """Compute the allowed sets of several matchers at once, before their policies plan: one call into the
    engine for the batch into one int32 bitmask (``LLExecutor``, parallel over its threads, where it has
    several: :data:`_PARALLEL`); each matcher's next :meth:`Matcher.allowed_words` in its present state returns
    its row (a read-only view), and whether it is empty is counted for the batch at once. Matchers in error or
    stopped are skipped (their policies stop without a mask). The same sets as one :meth:`Matcher.allowed_words`
    each: the engine computes each row from that matcher alone."""
    global _EXECUTOR
    groups: dict[tuple[int, int], list[Matcher]] = {}
    for m in matchers:
        if not m._ll.is_stopped():  # (stopped includes the error state)
            groups.setdefault((m.tokenizer.vocab_size, m.n_logits), []).append(m)
    for (vocab, n_logits), ms in groups.items():
        if len(ms) == 1:
            continue  # nothing to share: the matcher computes its own mask when asked
        bitmask = _bitmask_buffer(len(ms), vocab)
        row_bytes, ptr = bitmask.shape[1] * 4, bitmask.data_ptr()
        if len(ms) >= PARALLEL_MIN_ROWS and _PARALLEL:  # one call for the batch, as llguidance.torch's *_par does
            if _EXECUTOR is None:
                _EXECUTOR = llguidance.LLExecutor()
            _EXECUTOR.unsafe_compute_mask_ptr([(m._ll, k) for k, m in enumerate(ms)], ptr, row_bytes, len(ms))
        else:  # each matcher into its row of the same buffer, in this thread
            for k, m in enumerate(ms):
                m._ll.unsafe_compute_mask_ptr(ptr + k * row_bytes, row_bytes)
        words = exact_words(bitmask.numpy().copy(), vocab)  # the buffer is reused: each row keeps its own copy
        # a set is left unpacked until a plan reads it as a tensor (Plan.allowed): most greedy steps never do
        empty: list[bool | None] = [None] * len(ms)
        if n_logits >= vocab:  # (else counted on demand, below the logits' width: Matcher.allowed_empty)
            empty = [not bool(a) for a in np.asarray(words.any(axis=1)).tolist()]
        for k, m in enumerate(ms):
            m._prefilled = _Prefilled(m._version, words[k], empty[k], live=True)


def exact_words(words: np.ndarray, vocab: int) -> np.ndarray:
    """``words`` (llguidance's packed rows, [W] or [B, W], modified in place) with the last word's spare bits past
    ``vocab`` cleared, so a packed set names only the tokenizer's tokens, as :func:`unpack_bitmask`'s do."""
    if vocab % 32:
        u = words.view(np.uint32)
        u[..., vocab // 32] &= np.uint32((1 << (vocab % 32)) - 1)
        u[..., vocab // 32 + 1:] = 0
    return words


class MaskFill:
    """The masks of a step's grammar rows, filled while the device runs that step's forward pass (vLLM's overlap).

    The decode loop starts the fill right after it launches the forward pass (asynchronous on an accelerator) and
    waits for it before planning. With ``background`` the fill runs on one worker thread (llguidance computes
    masks outside the GIL, over its own pool where :data:`_PARALLEL`), so the host's mask work hides behind the
    device's; on the host's own device (CPU) the forward pass already uses every core, so it runs inline, after
    the forward pass, as before. Either way the masks are those :func:`fill_masks` computes."""

    _pool: ThreadPoolExecutor | None = None

    def __init__(self, background: bool) -> None:
        self.background = background
        self._pending: Future[None] | None = None

    def start(self, matchers: list[Matcher]) -> None:
        if not self.background:
            fill_masks(matchers)
            return
        if MaskFill._pool is None:
            MaskFill._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="formtax-masks")
        self._pending = MaskFill._pool.submit(fill_masks, matchers)

    def wait(self) -> None:
        if self._pending is not None:
            pending, self._pending = self._pending, None
            pending.result()


_BITMASKS = threading.local()  # per thread: decode loops in several threads (a server) never share a buffer


def _bitmask_buffer(n: int, vocab: int) -> torch.Tensor:
    """The first ``n`` rows of a preallocated int32 bitmask for ``vocab`` tokens (grown as batches grow): every
    row handed to the engine is written whole, and allocating a fresh one per step costs more than the fill."""
    rows, words = n, (vocab + 31) // 32  # llguidance's bitmask shape: 32 tokens a word
    if not hasattr(_BITMASKS, "by_words"):
        _BITMASKS.by_words = {}
    held: dict[int, torch.Tensor] = _BITMASKS.by_words
    buf = held.get(words)
    if buf is None or buf.shape[0] < rows:
        buf = held[words] = torch.full((max(rows, 64), words), -1, dtype=torch.int32)
    return buf[:rows]


def validate_with_engine(grammar: str, text: str) -> tuple[bool, str | None]:
    """Run the engine on ``text``'s bytes with the byte tokenizer: the oracle for Lark grammars."""
    from formtax.bytetok import byte_tokenizer

    tok = _byte_engine_tokenizer()
    m = llguidance.LLMatcher(tok.ll, grammar, log_level=0)
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
        from formtax.bytetok import byte_tokenizer

        _BYTE_TOK = EngineTokenizer(byte_tokenizer())
    return _BYTE_TOK
