"""Deco-G's flexible trie: a template becomes a minimal DFA over *tokens* (docs/ALGORITHMS.md section 7).

The template is parsed into literal phrases and content slots (``The answer is: {int}`` -> phrase
``The answer is: ``, slot ``{int}``). Each run of literal text, together with the free text allowed before or after
the template, is a byte-level trie/automaton (:mod:`formtax.fem.automata`); lifting it to tokens by running every
token's bytes through it gives the trie of *every* tokenisation of the phrase at once (the paper inserts
tokenisation variants one by one; the lift contains them all, canonical or not, so no variant is missing). A
leading-whitespace variant (an optional space before the first phrase) is a flag. A slot is a self-loop over the
tokens that stay inside the slot's own text language (digit tokens for ``{int}``, ...), with a token-length range:
by default 1 to the slot's worst-case token count, or any range given (e.g. 1-5 tokens for an argument). Slot
boundaries are token boundaries (our choice; it is what "a self-loop over an allowed token set" means at the token
level), with one exception that keeps natural tokenisations: a whitespace character (space or newline) ending the
phrase before a slot may share a token with the slot's first bytes, and that token then counts as a slot token
(SmolLM2 writes ``is: -3`` as ``":", " -", "3"`` and ``Rating: good`` as ``":", " good"``). The token-level NFA is
determinised by the subset construction over *token classes* (tokens that act alike in every automaton) and
minimised; the result is a total transition function over classes with one dead sink.

The language, precisely: a token string ``y`` (no special tokens) is accepted iff its bytes ``b(y)`` fullmatch
``PREFIX + [" "] + phrase_0 + slot_1 + phrase_1 + ... + SUFFIX`` *with a segmentation in which every slot's bytes
(with the whitespace ending the phrase before it, or without) are a whole number of tokens, between the slot's token
bounds*. ``PREFIX`` is ``""`` (``prefix="none"``), empty or
anything ending in a newline (``"line"``: the template is the last line, the ``reason-answer`` format), or anything
(``"any"``); ``SUFFIX`` is ``""``, anything (``"any"``), or ``"word"``: closing punctuation or emphasis
(``. , ; : ! ? * _``), then the end or whitespace and anything, so the slot's answer is a whole word as the
shared final-answer rule reads it (:mod:`formtax.constraints.finalanswer`); Deco-G's placement ``anywhere`` (the
key phrase must *appear*, e.g. GSM8K's ``The final answer is {int}`` anywhere in the text) uses it, so
``... is 19%`` is not the format (issue 60). Special tokens (EOS included) lead to the dead state; the
policy allows EOS itself only in accepting states.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from formtax.cache import LRU
from formtax.constraints.template import INT_LIMIT, LETTERS_MAX, Slot, Template
from formtax.fem.automata import (
    ANY_BYTE,
    BoolArray,
    ByteDFA,
    IntArray,
    Node,
    alt,
    byteset,
    cat,
    coaccessible,
    compile_bytes,
    int_range,
    lit,
    minimize,
    opt,
    rep,
    star,
    unique_rows,
)

PREFIXES = ("none", "line", "any")
SUFFIXES = ("none", "any", "word")
WORD_END = b".,;:!?*_"  # what may close an answer word (constraints/finalanswer.py's TRAILING)
WORD_SPACE = b" \t\n\r\x0b\x0c"
UNREACHABLE = np.iinfo(np.int32).max // 2


# -- the vocabulary as bytes -----------------------------------------------------------------------------------


@dataclass(eq=False)
class TokenVocab:
    """Every token id's bytes (special tokens have none), laid out for vectorised automaton runs."""

    tokens: list[bytes]
    special: BoolArray  # [V]: special ids (EOS, chat markers, ids past the tokenizer's vocabulary, empty tokens)
    eos_ids: tuple[int, ...]
    key: str = ""
    _layout: tuple[IntArray, np.ndarray, IntArray] | None = field(default=None, repr=False)

    @classmethod
    def from_bytes(cls, tokens: list[bytes], special: set[int] | frozenset[int], eos_ids: tuple[int, ...] = (),
                   key: str = "") -> TokenVocab:
        sp = np.zeros(len(tokens), dtype=bool)
        sp[list(special | set(eos_ids))] = True
        sp |= np.array([len(t) == 0 for t in tokens], dtype=bool)  # an empty token would let the text stall
        return cls(tokens=[b"" if sp[i] else t for i, t in enumerate(tokens)], special=sp, eos_ids=tuple(eos_ids),
                   key=key)

    @property
    def size(self) -> int:
        return len(self.tokens)

    def layout(self) -> tuple[IntArray, np.ndarray, IntArray]:
        """(order by decreasing length, padded bytes in that order [V, maxlen], active count per position)."""
        if self._layout is None:
            lengths = np.array([len(t) for t in self.tokens], dtype=np.int64)
            order = np.argsort(-lengths, kind="stable").astype(np.int32)
            maxlen = int(lengths.max()) if len(lengths) else 0
            data = np.frombuffer(b"".join(self.tokens) + b"\0", dtype=np.uint8)
            offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]])
            sorted_len = lengths[order]
            pos = np.arange(max(maxlen, 1))
            idx = np.minimum(offsets[order][:, None] + pos[None, :], len(data) - 1)
            padded = np.where(pos[None, :] < sorted_len[:, None], data[idx], 0).astype(np.uint8)
            active = np.array([(sorted_len > p).sum() for p in range(maxlen)], dtype=np.int32)
            self._layout = (order, padded, active)
        return self._layout

    def text(self, ids: list[int]) -> bytes:
        return b"".join(self.tokens[i] for i in ids)


_VOCABS: LRU[str, TokenVocab] = LRU(4)


def vocab_for(tokenizer: Any) -> TokenVocab:
    """The :class:`TokenVocab` of a backend's :class:`~formtax.decoding.engine.TokenizerInfo` (cached)."""
    eng = tokenizer.engine
    key = f"{eng.key}:{tokenizer.n_logits}"
    hit = _VOCABS.get(key)
    if hit is not None:
        return hit
    ll = eng.ll
    n = int(tokenizer.n_logits)
    v = min(n, int(ll.vocab_size))
    tokens = [bytes(ll.decode_bytes([i])) for i in range(v)] + [b""] * (n - v)
    special = {i for i in range(v) if ll.is_special_token(i)} | set(range(v, n))
    return _VOCABS.put(key, TokenVocab.from_bytes(tokens, special, tuple(sorted(tokenizer.eos_ids)), key=key))


def run_tokens(dfa: ByteDFA, states: IntArray, vocab: TokenVocab) -> IntArray:
    """``out[i, v]`` = the state ``dfa`` reaches from ``states[i]`` after token ``v``'s bytes (vectorised)."""
    order, padded, active = vocab.layout()
    cur = np.repeat(np.asarray(states, dtype=np.int32)[:, None], vocab.size, axis=1)
    for pos, n in enumerate(active):
        cur[:, :n] = dfa.table[cur[:, :n], padded[:n, pos]]
    out = np.empty_like(cur)
    out[:, order] = cur
    out[:, vocab.special] = dfa.dead
    return out


# -- the format ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FormatSpec:
    """What the FEM enforces: a template, where it sits in the text, and the slots' token-length ranges."""

    template: Template
    prefix: str = "line"  # none | line | any
    suffix: str = "none"  # none | any
    leading_space: bool = True  # allow one space before the first phrase (the paper's whitespace variant)
    slot_tokens: tuple[tuple[int, int] | None, ...] = ()  # per slot, (lo, hi) tokens; None = default

    def __post_init__(self) -> None:
        if self.prefix not in PREFIXES:
            raise ValueError(f"prefix must be one of {PREFIXES}, got {self.prefix!r}")
        if self.suffix not in SUFFIXES:
            raise ValueError(f"suffix must be one of {SUFFIXES}, got {self.suffix!r}")
        if len(self.slot_tokens) > len(self.template.slots):
            raise ValueError(f"{len(self.slot_tokens)} slot bounds for {len(self.template.slots)} slots")

    def bounds(self) -> list[tuple[int, int]]:
        out = []
        for k, slot in enumerate(self.template.slots):
            given = self.slot_tokens[k] if k < len(self.slot_tokens) else None
            lo, hi = given if given is not None else (1, slot.max_tokens())
            if not 1 <= lo <= hi:
                raise ValueError(f"slot {slot.source}: token bounds must satisfy 1 <= lo <= hi, got {lo}..{hi}")
            out.append((lo, hi))
        return out

    def phrases(self) -> list[str]:
        """The literal text between slots: ``len(slots) + 1`` entries (possibly empty)."""
        out = [""]
        for part in self.template.parts:
            if isinstance(part, Slot):
                out.append("")
            else:
                out[-1] += part
        return out

    def py_regex(self) -> bytes:
        """The equivalent byte regex (for ``re.fullmatch(..., re.DOTALL)``); slot groups are captured.

        Integer slots with a range are spelled as the superset ``-?(0|[1-9][0-9]*)``: check the value with
        :meth:`Slot.accepts` (the DFA itself is exact).
        """
        import re

        pre = {"none": b"", "line": rb"(?:.*\n)?", "any": rb".*"}[self.prefix]
        phrases = self.phrases()
        out = [pre]
        if self.leading_space and not phrases[0][:1].isspace():
            out.append(b" ?")
        for k, slot in enumerate(self.template.slots):
            out.append(re.escape(phrases[k].encode()))
            out.append(b"(" + slot.py_regex().encode() + b")")
        out.append(re.escape(phrases[-1].encode()))
        out.append({"any": rb".*", "word": rb"[.,;:!?*_]*(?:[ \t\n\r\x0b\x0c].*)?"}.get(self.suffix, b""))
        return b"".join(out)


def slot_node(slot: Slot) -> Node:
    """The exact byte language of a slot's text."""
    if slot.kind == "int":
        return int_range(-INT_LIMIT if slot.lo is None else slot.lo, INT_LIMIT if slot.hi is None else slot.hi)
    if slot.kind == "letters":
        n_lo = slot.n if slot.n is not None else 1
        n_hi = slot.n if slot.n is not None else LETTERS_MAX
        return rep(byteset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"), n_lo, n_hi)
    if slot.kind == "choice":
        return alt(*(lit(o) for o in slot.options))
    return rep(byteset(set(range(256)) - {10, 13}), 1, None)


BOUNDARY_WS = (" ", "\n")


def _piece_node(spec: FormatSpec, i: int, phrase: str) -> Node:
    """Piece ``i``'s byte language: its phrase, with the free prefix (piece 0) or suffix (the last piece)."""
    parts: list[Node] = []
    if i == 0:
        if spec.prefix == "line":
            parts.append(opt(cat(star(ANY_BYTE), lit("\n"))))
        elif spec.prefix == "any":
            parts.append(star(ANY_BYTE))
        if spec.leading_space and not spec.phrases()[0][:1].isspace():
            parts.append(opt(lit(" ")))
    parts.append(lit(phrase))
    if i == len(spec.phrases()) - 1 and spec.suffix == "any":
        parts.append(star(ANY_BYTE))
    elif i == len(spec.phrases()) - 1 and spec.suffix == "word":
        parts.append(star(byteset(WORD_END)))
        parts.append(opt(cat(byteset(WORD_SPACE), star(ANY_BYTE))))
    return cat(*parts)


def boundary_ws(spec: FormatSpec, i: int) -> str | None:
    """The whitespace ending phrase ``i`` that may share a token with slot ``i``'s first bytes, or None."""
    phrase = spec.phrases()[i]
    if i < len(spec.template.slots) and phrase[-1:] in BOUNDARY_WS:
        return phrase[-1]
    return None


# -- the token-level DFA ---------------------------------------------------------------------------------------


@dataclass(eq=False)
class TokenDFA:
    """A complete DFA over token classes: ``delta[state, token_class[token]]``; ``dead`` is the sink."""

    token_class: IntArray  # [V]
    delta: IntArray  # [n_states, n_classes]
    start: int
    accepting: BoolArray
    dead: int
    dist: IntArray  # fewest tokens from each state to an accepting state (UNREACHABLE for the sink)
    spec: FormatSpec | None = None
    _next: dict[int, IntArray] = field(default_factory=dict, repr=False)

    @property
    def n_states(self) -> int:
        return int(self.delta.shape[0])

    @property
    def n_classes(self) -> int:
        return int(self.delta.shape[1])

    @property
    def vocab_size(self) -> int:
        return int(self.token_class.shape[0])

    def step(self, state: int, token: int) -> int:
        return int(self.delta[state, self.token_class[token]])

    def run(self, tokens: list[int], state: int | None = None) -> int:
        s = self.start if state is None else state
        for t in tokens:
            s = int(self.delta[s, self.token_class[t]])
        return s

    def accepts(self, tokens: list[int]) -> bool:
        return bool(self.accepting[self.run(tokens)])

    def next_states(self, state: int) -> IntArray:
        """The successor of ``state`` under every token id, [V] (cached per state)."""
        hit = self._next.get(state)
        if hit is None:
            hit = self.delta[state][self.token_class]
            self._next[state] = hit
        return hit

    def describe(self) -> dict[str, Any]:
        return {"states": self.n_states, "classes": self.n_classes, "min_tokens": int(self.dist[self.start])}


def distances(delta: IntArray, accepting: BoolArray, dead: int) -> IntArray:
    """Fewest tokens to an accepting state (every class holds at least one token)."""
    dist = np.where(accepting, 0, UNREACHABLE).astype(np.int64)
    while True:
        nxt = np.minimum(dist, dist[delta].min(axis=1) + 1)
        nxt[dead] = UNREACHABLE
        if bool((nxt == dist).all()):
            return np.minimum(dist, UNREACHABLE).astype(np.int32)
        dist = nxt


def _longest_accepted(a: ByteDFA) -> IntArray:
    """Per state, the most bytes an accepted continuation can take (UNREACHABLE when unbounded or dead)."""
    alive = coaccessible(a.table, a.accepting)
    best = np.where(a.accepting, 0, -1).astype(np.int64)  # -1: no accepted continuation found yet
    for _ in range(a.n_states + 1):
        nxt = np.where(alive[a.table], best[a.table] + 1, -1).max(axis=1)
        nxt = np.where(alive, np.maximum(best, np.where(nxt > 0, nxt, -1)), -1)
        if bool((nxt == best).all()):
            return np.where(best >= 0, best, UNREACHABLE)
        best = nxt
    return np.full(a.n_states, UNREACHABLE, dtype=np.int64)  # a cycle among live states: unbounded


def build_token_dfa(spec: FormatSpec, vocab: TokenVocab) -> TokenDFA:
    """The minimal token DFA of ``spec`` over ``vocab`` (see the module docstring for the exact language)."""
    bounds = spec.bounds()
    phrases = spec.phrases()
    n_slots = len(spec.template.slots)
    # Automata: every piece in full, and trimmed of a boundary whitespace that then starts the slot instead.
    piece_of: list[tuple[int, int]] = []  # (piece index, variant: 0 full / 1 trimmed)
    pieces: list[ByteDFA] = []
    slots: list[ByteDFA] = []  # slots[2 * j + variant]: variant 1 begins with the boundary whitespace
    for i, phrase in enumerate(phrases):
        piece_of.append((i, 0))
        pieces.append(compile_bytes(_piece_node(spec, i, phrase)))
        ws = boundary_ws(spec, i)
        if ws is not None:
            piece_of.append((i, 1))
            pieces.append(compile_bytes(_piece_node(spec, i, phrase[: -len(ws)])))
    compiled: dict[tuple[Slot, str | None], ByteDFA] = {}  # repeated slots (one per role, say) compile once
    for j, slot in enumerate(spec.template.slots):
        ws = boundary_ws(spec, j)
        for lead in (None, ws):
            if (slot, lead) not in compiled:
                node = slot_node(slot)
                compiled[(slot, lead)] = compile_bytes(cat(lit(lead), node) if lead is not None else node)
            slots.append(compiled[(slot, lead)])
    # Each distinct automaton is run over the vocabulary once (a token's run is the costly part).
    distinct: dict[int, int] = {}
    autos: list[ByteDFA] = []
    for auto in pieces + slots:
        if id(auto) not in distinct:
            distinct[id(auto)] = len(autos)
            autos.append(auto)
    runs = [run_tokens(auto, np.arange(auto.n_states, dtype=np.int32), vocab) for auto in autos]
    sig = np.concatenate(runs, axis=0)  # [sum of states, V]
    sig[:, vocab.special] = -1
    token_class = unique_rows(sig.T).astype(np.int32)
    n_cls = int(token_class.max()) + 1
    rep_token = np.zeros(n_cls, dtype=np.int64)
    rep_token[token_class[::-1]] = np.arange(vocab.size)[::-1]
    by_class = [r[:, rep_token] for r in runs]  # [states, classes]
    rp = [by_class[distinct[id(auto)]] for auto in pieces]
    rs = [by_class[distinct[id(auto)]] for auto in slots]
    starts_of = {i: [a for a, (pi, _) in enumerate(piece_of) if pi == i] for i in range(len(phrases))}

    # NFA element: (0, piece automaton, state, 0) or (1, slot automaton 2j+variant, state, tokens in the slot)
    Elem = tuple[int, int, int, int]
    # A slot token count only matters while the slot's upper bound can still bind: once count + the most bytes
    # the slot can still take (each token holds at least one) is within the bound, counts past the lower bound
    # are interchangeable and are stored as the lower bound. Exact, and it keeps choice slots (a passage's
    # spans, say) from multiplying the subsets by every possible count.
    longest = [_longest_accepted(auto) for auto in slots]

    def _moved(e: Elem, q2: int) -> Elem:
        kind, a, _, cnt = e
        if kind == 0:
            return (0, a, q2, 0)
        lo, hi = bounds[a // 2]
        cnt += 1
        if cnt >= lo and cnt + longest[a][q2] <= hi:
            cnt = lo
        return (1, a, q2, cnt)

    def closure(elems: list[Elem]) -> frozenset[Elem]:
        seen: set[Elem] = set()
        stack = list(elems)
        while stack:
            e = stack.pop()
            if e in seen:
                continue
            seen.add(e)
            kind, a, q, c = e
            if kind == 0:
                i, variant = piece_of[a]
                if i < n_slots and pieces[a].accepting[q]:
                    sa = 2 * i + variant
                    stack.append((1, sa, slots[sa].start, 0))
            elif slots[a].accepting[q] and c >= bounds[a // 2][0]:
                stack.extend((0, b, pieces[b].start, 0) for b in starts_of[a // 2 + 1])
        return frozenset(seen)

    dead_set: frozenset[Elem] = frozenset()
    index: dict[frozenset[Elem], int] = {dead_set: 0}
    order: list[frozenset[Elem]] = [dead_set]
    start_set = closure([(0, b, pieces[b].start, 0) for b in starts_of[0]])
    index[start_set] = 1
    order.append(start_set)
    rows: list[IntArray] = [np.zeros(n_cls, dtype=np.int32), np.zeros(0, dtype=np.int32)]
    k = 1
    while k < len(order):
        # All classes at once: each element's successor per class (-1 = it dies), then one closure per distinct
        # column, since classes with the same successors lead to the same subset.
        elems = list(order[k])
        succ = np.full((len(elems), n_cls), -1, dtype=np.int64)
        for j, (kind, a, q, cnt) in enumerate(elems):
            if kind == 0:
                succ[j] = np.where(rp[a][q] == pieces[a].dead, -1, rp[a][q])
            elif cnt < bounds[a // 2][1]:
                succ[j] = np.where(rs[a][q] == slots[a].dead, -1, rs[a][q])
        live = np.flatnonzero((succ >= 0).any(axis=0))  # classes that kill every element go to the dead subset
        row = np.zeros(n_cls, dtype=np.int32)
        inverse = unique_rows(succ[:, live].T)
        first = np.zeros(int(inverse.max()) + 1 if len(inverse) else 0, dtype=np.int64)
        first[inverse[::-1]] = np.arange(len(inverse))[::-1]
        targets = np.empty(len(first), dtype=np.int32)
        for u, c in enumerate(first):
            col = succ[:, live[c]]
            moved: list[Elem] = [_moved(elems[j], int(col[j])) for j in np.flatnonzero(col >= 0)]
            nxt = closure(moved) if moved else dead_set
            target = index.get(nxt)
            if target is None:
                target = index[nxt] = len(order)
                order.append(nxt)
                rows.append(np.zeros(0, dtype=np.int32))
            targets[u] = target
        row[live] = targets[inverse]
        rows[k] = row
        k += 1
    last = len(phrases) - 1
    table = np.stack(rows).astype(np.int32)
    acc = np.array([any(e[0] == 0 and piece_of[e[1]][0] == last and pieces[e[1]].accepting[e[2]] for e in st)
                    for st in order], dtype=bool)
    alive = coaccessible(table, acc)
    table = np.where(alive[table], table, 0).astype(np.int32)
    table, acc, start = minimize(table, acc, 1)
    dead = int(np.flatnonzero(~coaccessible(table, acc))[0])
    # Classes that now act alike everywhere merge.
    col_class = unique_rows(table.T)
    n_new = int(col_class.max()) + 1
    new_table = np.zeros((table.shape[0], n_new), dtype=np.int32)
    new_table[:, col_class] = table
    token_class = col_class[token_class].astype(np.int32)
    return TokenDFA(token_class=token_class, delta=new_table, start=start, accepting=acc, dead=dead,
                    dist=distances(new_table, acc, dead), spec=spec)


_DFAS: LRU[tuple[FormatSpec, str], TokenDFA] = LRU(32)


def token_dfa(spec: FormatSpec, vocab: TokenVocab) -> TokenDFA:
    """:func:`build_token_dfa`, cached per (spec, vocabulary)."""
    key = (spec, vocab.key or str(id(vocab)))
    hit = _DFAS.get(key)
    if hit is not None:
        return hit
    return _DFAS.put(key, build_token_dfa(spec, vocab))
