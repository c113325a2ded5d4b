"""Closing mode's fallback search: a beam over the model's own tokens (issue 20's first witness search).

Since issue 58 the witness is searched in bytes (:mod:`formtax.constraints.shortest`) and written in the model's
tokens; this beam runs only where that cannot be done (bytes the tokenizer cannot write, a state the byte engine
refused, a byte search stopped by its bounds). It is a breadth-first beam over ``deep_copy``'d matchers, states at
one depth deduplicated by their full-vocabulary allowed mask and the literals the path has begun, each state expanding
its allowed tokens shortest first, structural characters (quotes, brackets, separators) before digits and letters.
Any witness it returns is real (the matcher accepted every token): an upper bound on the shortest completion.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import llguidance
import numpy as np

from formtax.cache import LRU
from formtax.constraints.clock import past
from formtax.constraints.compile import EngineTokenizer

# First bytes in the order the search prefers them: what closes a structure, then separators, then the shortest
# values (digits before letters). Every other byte follows in byte order. Ours: a heuristic for which tokens a
# short completion is likely to start with; any order gives a valid witness.
_PREFERRED = b'"}])>' + b",:; \n." + b"0123456789" + b"abcdefghijklmnopqrstuvwxyz" + b"ABCDEFGHIJKLMNOPQRSTUVWXYZ"
_PREFERRED_ORDER = {b: i for i, b in enumerate(_PREFERRED)}
_UNUSABLE = np.iinfo(np.int64).max
BEAM_WIDTH = 8  # states kept per depth
EXPAND = 8  # tokens tried per state
MAX_DEPTH = 512  # the longest witness searched for (tokens)


@dataclass
class _Ranks:
    """Per tokenizer: every token's search rank (byte length first, then the preference of its first byte);
    special tokens are never part of a witness. ``ids``: token bytes -> id, to find the tokens that spell a hint."""

    rank: np.ndarray
    vocab: int
    ids: dict[bytes, int]
    symbols: np.ndarray  # the single-byte tokens of ASCII punctuation, in byte order
    top: LRU[tuple[bytes, int], tuple[int, ...]] = field(default_factory=lambda: LRU(512))
    """A mask's ``k`` best-ranked allowed tokens, by the mask's bytes: a search meets the same state's mask again
    and again (inside a string every state allows the same tokens), and ranking the whole vocabulary was most of
    its cost (issue 44's profile: 166 us a call at 49k tokens)."""


_RANKS: LRU[str, _Ranks] = LRU(8)


def _ranks(tok: EngineTokenizer) -> _Ranks:
    hit = _RANKS.get(tok.key)
    if hit is not None:
        return hit
    order = {b: i for i, b in enumerate(_PREFERRED)}
    n = tok.vocab_size
    rank = np.full(n, _UNUSABLE, dtype=np.int64)
    ids: dict[bytes, int] = {}
    for i in range(n):
        if tok.ll.is_special_token(i):
            continue
        b = tok.ll.decode_bytes([i])
        if b:
            rank[i] = len(b) * 1024 + order.get(b[0], len(_PREFERRED) + b[0])
            ids.setdefault(b, i)
    symbols = np.array([ids[bytes([c])] for c in range(33, 127) if not chr(c).isalnum() and bytes([c]) in ids],
                       dtype=np.int64)
    return _RANKS.put(tok.key, _Ranks(rank, n, ids, symbols))




def _continuations(path: bytes, hints: tuple[bytes, ...]) -> frozenset[bytes]:
    """What the hints say may come next after ``path``: the rest of every hint the path has begun."""
    out = set()
    for h in hints:
        for k in range(min(len(h) - 1, len(path)), 0, -1):
            if path.endswith(h[:k]):
                out.add(h[k:])
                break
    return frozenset(out)


def _allowed(mask: bytes, t: int) -> bool:
    """Bit ``t`` of an llguidance bitmask (32-bit little-endian words: byte ``t // 8``, bit ``t % 8``)."""
    return bool(mask[t >> 3] >> (t & 7) & 1)


def _ranked(mask: bytes, ranks: _Ranks, k: int) -> tuple[int, ...]:
    """The ``k`` best-ranked allowed tokens of ``mask``, best first (cached in ``ranks.top``)."""
    key = (mask, k)
    hit = ranks.top.get(key)
    if hit is not None:
        return hit
    bits = np.unpackbits(np.frombuffer(mask, dtype=np.uint8), bitorder="little")[: ranks.vocab]
    ids = np.flatnonzero(bits)
    ids = ids[ranks.rank[ids] != _UNUSABLE]
    if len(ids) > k:
        ids = ids[np.argpartition(ranks.rank[ids], k)[:k]]
    return ranks.top.put(key, tuple(int(i) for i in ids[np.argsort(ranks.rank[ids], kind="stable")]))


def _candidates(mask: bytes, ranks: _Ranks, k: int, path: bytes, hints: tuple[bytes, ...],
                symbols: bool = False) -> list[int]:
    hinted: list[int] = []
    # a literal the path has begun goes on first (shortest first); then fresh literals, those whose first byte
    # closes something first (the byte order of _PREFERRED: '"' before ' '), so a space literal of the answer
    # does not keep every state of the beam inside a string or a whitespace run; sorted fully, never by set order
    begun = _continuations(path, hints)
    order = _PREFERRED_ORDER
    fresh = sorted(set(hints) - begun, key=lambda h: (order.get(h[0], len(order) + h[0]), len(h), h))
    for c in sorted(begun, key=lambda h: (len(h), h)) + fresh:
        for j in range(len(c), 0, -1):  # the longest token first: fewer tokens
            t = ranks.ids.get(c[:j])
            if t is not None and t < ranks.vocab and _allowed(mask, t) and t not in hinted:
                hinted.append(t)
    # with ``symbols``, every allowed single-symbol token too: a structure often moves on only at a symbol the
    # ranking puts late (an email's "@", a URI's "/"), which a state allowing many letters would never try
    marks = [int(t) for t in ranks.symbols if _allowed(mask, int(t)) and int(t) not in hinted] if symbols else []
    rest = [i for i in _ranked(mask, ranks, k) if i not in hinted]
    best = (hinted + rest)[: max(k, len(hinted[:k]) + k // 2)]
    return best + [t for t in marks if t not in best]


def completes(ll: llguidance.LLMatcher, tokens: Sequence[int]) -> bool:
    """Whether ``tokens`` take a copy of ``ll`` to an accepting state (``ll`` itself is untouched)."""
    if ll.validate_tokens(list(tokens)) < len(tokens):  # checked first: a refused consume logs a warning
        return False
    c = ll.deep_copy()
    return all(c.consume_token(t) for t in tokens) and bool(c.is_accepting())


def search_witness(ll: llguidance.LLMatcher, tok: EngineTokenizer, max_depth: int = MAX_DEPTH,
                   hints: tuple[bytes, ...] = (), before: bytes = b"", deadline: float = float("inf")
                   ) -> list[int] | None:
    """A short token sequence from ``ll``'s state to an accepting one (see the module docstring), or None when
    the beam search finds none within ``max_depth`` tokens. ``ll`` is not modified. ``hints``: the grammar's
    literals (:func:`grammar_hints`); ``before``: the text already generated (a hint it has begun continues).
    The beam first tries each state's best-ranked tokens; only where that finds nothing does it search again
    with every allowed symbol as well (an email's "@"), so the common search costs what it did."""
    if ll.is_accepting():
        return []
    if ll.is_error():
        return None
    found = _beam(ll, tok, max_depth, hints, before, False, deadline)
    return found if found is not None else _beam(ll, tok, max_depth, hints, before, True, deadline)


def _beam(ll: llguidance.LLMatcher, tok: EngineTokenizer, max_depth: int, hints: tuple[bytes, ...], before: bytes,
          symbols: bool, deadline: float) -> list[int] | None:
    """One beam search of :func:`search_witness`."""
    ranks = _ranks(tok)
    Node = tuple[llguidance.LLMatcher, bytes, list[int], bytes]  # matcher, its mask, token path, byte path
    frontier: list[Node] = [(ll, ll.compute_bitmask(), [], before[-64:])]
    found: list[int] | None = None
    for _ in range(max_depth):
        if past(deadline):
            return None
        # every candidate of every state is tried for acceptance first (so a closing token never loses its
        # place in the beam to a longer path), then the beam takes the others round robin, each state's best
        # tokens first, one state per fingerprint
        children: list[list[tuple[llguidance.LLMatcher, list[int], bytes]]] = []
        for node, mask, path, text in frontier:
            mine = []
            for t in _candidates(mask, ranks, EXPAND, text, hints, symbols):
                child = node.deep_copy()
                if not child.consume_token(t):
                    continue
                if child.is_accepting():
                    found = path + [t]
                    break
                mine.append((child, path + [t], text + tok.ll.decode_bytes([t])))
            if found is not None:
                break
            children.append(mine)
        if found is not None:
            break
        seen: set[tuple[bytes, frozenset[bytes]]] = set()
        nxt: list[Node] = []
        for j in range(max((len(c) for c in children), default=0)):
            for mine in children:
                if j >= len(mine) or len(nxt) >= BEAM_WIDTH:
                    continue
                child, cpath, ctext = mine[j]
                cmask = child.compute_bitmask()
                key = (cmask, _continuations(ctext, hints))
                if key in seen:
                    continue
                seen.add(key)
                nxt.append((child, cmask, cpath, ctext[-64:]))
        if not nxt:
            break
        frontier = nxt
    if found is None:
        return None
    canonical = tok.ll.tokenize_bytes(tok.ll.decode_bytes(found))  # often fewer tokens than the search's path
    if len(canonical) < len(found) and completes(ll, canonical):
        return list(canonical)
    return found


