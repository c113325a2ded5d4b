"""Byte-level regular expressions as small combinators, compiled to minimal DFAs.

The format estimation module works on *tokens*, but a template's literal phrases and its slots are defined on
text. This module builds the text side exactly: a tiny regex AST (literal, byte set, concatenation, alternation,
bounded or unbounded repetition), Thompson's NFA, the subset construction over byte classes, and Moore's
partition refinement to a minimal complete DFA with one dead sink. :mod:`formtax.fem.dfa` lifts these DFAs to
tokens. There is no regex *parser* on purpose: every pattern the module needs (template literals, integer ranges,
letters, choices, one-line strings, free text) is built from the combinators, so no regex dialect question arises.

Everything is over bytes (0-255), the unit byte-level BPE tokens are made of; a template's text is UTF-8 encoded.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

IntArray = npt.NDArray[np.int32]
BoolArray = npt.NDArray[np.bool_]

# -- the regex AST ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Lit:
    data: bytes


@dataclass(frozen=True)
class ByteSet:
    members: frozenset[int]


@dataclass(frozen=True)
class Cat:
    parts: tuple[Node, ...]


@dataclass(frozen=True)
class Alt:
    options: tuple[Node, ...]


@dataclass(frozen=True)
class Rep:
    node: Node
    lo: int
    hi: int | None  # None = unbounded


Node = Lit | ByteSet | Cat | Alt | Rep

ANY_BYTE = ByteSet(frozenset(range(256)))
DIGITS = ByteSet(frozenset(b"0123456789"))


def lit(text: str | bytes) -> Node:
    return Lit(text.encode() if isinstance(text, str) else bytes(text))


def byteset(members: Iterable[int] | bytes | str) -> Node:
    if isinstance(members, str):
        members = members.encode()
    return ByteSet(frozenset(int(b) for b in members))


def cat(*parts: Node) -> Node:
    return Cat(tuple(parts))


def alt(*options: Node) -> Node:
    return Alt(tuple(options))


def opt(node: Node) -> Node:
    return Rep(node, 0, 1)


def star(node: Node) -> Node:
    return Rep(node, 0, None)


def rep(node: Node, lo: int, hi: int | None) -> Node:
    if lo < 0 or (hi is not None and hi < lo):
        raise ValueError(f"bad repetition bounds {{{lo},{hi}}}")
    return Rep(node, lo, hi)


# -- integer ranges ----------------------------------------------------------------------------------------------


def _digit_range(a: int, b: int) -> Node:
    return byteset(bytes(range(ord("0") + a, ord("0") + b + 1)))


def _equal_length_range(lo: str, hi: str) -> Node:
    """Decimal strings of len(lo) digits whose value lies in [lo, hi] (leading zeros allowed here)."""
    if not lo:
        return lit(b"")
    if lo[0] == hi[0]:
        return cat(lit(lo[0]), _equal_length_range(lo[1:], hi[1:]))
    rest = len(lo) - 1
    d_lo, d_hi = int(lo[0]), int(hi[0])
    options: list[Node] = []
    if lo[1:] == "0" * rest:  # the whole lower digit is free below
        first_full = d_lo
    else:
        options.append(cat(lit(lo[0]), _equal_length_range(lo[1:], "9" * rest)))
        first_full = d_lo + 1
    last_full = d_hi if hi[1:] == "9" * rest else d_hi - 1  # the whole upper digit is free above
    if first_full <= last_full:
        options.append(cat(_digit_range(first_full, last_full), rep(DIGITS, rest, rest)))
    if hi[1:] != "9" * rest:
        options.append(cat(lit(hi[0]), _equal_length_range("0" * rest, hi[1:])))
    return alt(*options)


def _nonneg_range(a: int, b: int) -> Node | None:
    """Canonical decimal spellings (no leading zeros) of the integers in [a, b], 0 <= a; None if empty."""
    if a > b:
        return None
    options: list[Node] = []
    for n in range(len(str(a)), len(str(b)) + 1):
        lo = max(a, 10 ** (n - 1) if n > 1 else 0)
        hi = min(b, 10**n - 1)
        if lo <= hi:
            options.append(_equal_length_range(str(lo).zfill(n), str(hi).zfill(n)))
    return alt(*options) if options else None


def int_range(lo: int, hi: int) -> Node:
    """Exactly the spellings of the integers in [lo, hi] that templates accept: optional ``-``, no leading zeros,
    and ``-0`` for 0 where the range admits negatives (as ``Slot.accepts`` and the grammar engine do)."""
    if lo > hi:
        raise ValueError(f"empty integer range {lo}..{hi}")
    options: list[Node] = []
    pos = _nonneg_range(max(lo, 0), hi) if hi >= 0 else None
    if pos is not None:
        options.append(pos)
    if lo < 0 <= hi:
        options.append(lit("-0"))
    if lo < 0:
        neg = _nonneg_range(max(1, -min(hi, -1)), -lo)
        if neg is not None:
            options.append(cat(lit("-"), neg))
    return alt(*options)


# -- Thompson NFA ----------------------------------------------------------------------------------------------


class _Nfa:
    def __init__(self) -> None:
        self.eps: list[list[int]] = []
        self.edges: list[list[tuple[frozenset[int], int]]] = []

    def new(self) -> int:
        self.eps.append([])
        self.edges.append([])
        return len(self.eps) - 1

    def build(self, node: Node) -> tuple[int, int]:
        s = self.new()
        if isinstance(node, Lit):
            cur = s
            for b in node.data:
                nxt = self.new()
                self.edges[cur].append((frozenset((b,)), nxt))
                cur = nxt
            return s, cur
        if isinstance(node, ByteSet):
            e = self.new()
            if node.members:
                self.edges[s].append((node.members, e))
            return s, e
        if isinstance(node, Cat):
            cur = s
            for part in node.parts:
                ps, pe = self.build(part)
                self.eps[cur].append(ps)
                cur = pe
            return s, cur
        if isinstance(node, Alt):
            e = self.new()
            for option in node.options:
                os_, oe = self.build(option)
                self.eps[s].append(os_)
                self.eps[oe].append(e)
            return s, e
        cur = s
        for _ in range(node.lo):
            ps, pe = self.build(node.node)
            self.eps[cur].append(ps)
            cur = pe
        if node.hi is None:
            ps, pe = self.build(node.node)
            self.eps[cur].append(ps)
            self.eps[pe].append(cur)
            return s, cur
        end = self.new()
        self.eps[cur].append(end)
        for _ in range(node.hi - node.lo):
            ps, pe = self.build(node.node)
            self.eps[cur].append(ps)
            self.eps[pe].append(end)
            cur = pe
        return s, end


# -- DFAs ------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ByteDFA:
    """A complete DFA over bytes: ``table[state, byte]``; ``dead`` is the one sink that never accepts."""

    table: IntArray  # [n_states, 256]
    start: int
    accepting: BoolArray  # [n_states]
    dead: int

    @property
    def n_states(self) -> int:
        return int(self.table.shape[0])

    def run(self, data: bytes, state: int | None = None) -> int:
        s = self.start if state is None else state
        for b in data:
            s = int(self.table[s, b])
        return s

    def matches(self, data: bytes) -> bool:
        return bool(self.accepting[self.run(data)])


def unique_rows(m: np.ndarray) -> np.ndarray:
    """``inverse`` of ``np.unique(m, axis=0)`` up to relabelling, via a 64-bit random hash of each row (verified;
    ``np.unique`` on rows sorts lexicographically and is ~50x slower on wide vocabularies)."""
    m = np.ascontiguousarray(m)
    if m.shape[0] == 0:
        return np.zeros(0, dtype=np.int64)
    w = np.random.default_rng(0x5EED).integers(1, 2**62, size=m.shape[1], dtype=np.int64)
    with np.errstate(over="ignore"):
        h = (m.astype(np.int64) * w).sum(axis=1) if m.shape[1] <= 8 else m.astype(np.int64) @ w
    _, first, inverse = np.unique(h, return_index=True, return_inverse=True)
    inverse = inverse.reshape(-1)
    if not bool((m[first[inverse]] == m).all()):  # a hash collision: fall back to the exact sort
        _, inverse = np.unique(m, axis=0, return_inverse=True)
        inverse = inverse.reshape(-1)
    return inverse


def minimize(table: IntArray, accepting: BoolArray, start: int) -> tuple[IntArray, BoolArray, int]:
    """Moore's partition refinement on a complete DFA (all states reachable): the minimal equivalent DFA.

    Works for any alphabet width (bytes here, token classes in :mod:`formtax.fem.dfa`).
    """
    part = accepting.astype(np.int64)
    n_blocks = len(np.unique(part))
    while True:
        sig = np.concatenate([part[:, None], part[table]], axis=1)
        new = unique_rows(sig)
        n_new = int(new.max()) + 1
        part = new
        if n_new == n_blocks:
            break
        n_blocks = n_new
    rep_state = np.zeros(n_blocks, dtype=np.int64)
    rep_state[part[::-1]] = np.arange(len(part))[::-1]  # first state of each block
    new_table = part[table[rep_state]].astype(np.int32)
    new_acc = accepting[rep_state].copy()
    return new_table, new_acc, int(part[start])


def coaccessible(table: IntArray, accepting: BoolArray) -> BoolArray:
    """States from which an accepting state can be reached."""
    alive = accepting.copy()
    while True:
        nxt = alive | alive[table].any(axis=1)
        if bool((nxt == alive).all()):
            return alive
        alive = nxt


def compile_bytes(node: Node) -> ByteDFA:
    """Thompson NFA -> subset construction over byte classes -> minimal complete DFA with a dead sink."""
    nfa = _Nfa()
    s0, final = nfa.build(node)
    # Byte classes: bytes that every edge set treats alike.
    sets = {label for edges in nfa.edges for label, _ in edges}
    sig = np.zeros((256, len(sets)), dtype=bool)
    for j, label in enumerate(sets):
        sig[list(label), j] = True
    byte_class = unique_rows(sig)
    n_cls = int(byte_class.max()) + 1
    rep_byte = [int(np.flatnonzero(byte_class == c)[0]) for c in range(n_cls)]

    closure_cache: dict[int, frozenset[int]] = {}

    def closure_of(u: int) -> frozenset[int]:
        hit = closure_cache.get(u)
        if hit is not None:
            return hit
        seen = {u}
        stack = [u]
        while stack:
            x = stack.pop()
            for y in nfa.eps[x]:
                if y not in seen:
                    seen.add(y)
                    stack.append(y)
        out = frozenset(seen)
        closure_cache[u] = out
        return out

    def closure(states: Iterable[int]) -> frozenset[int]:
        out: set[int] = set()
        for u in states:
            out |= closure_of(u)
        return frozenset(out)

    dead_set: frozenset[int] = frozenset()
    index: dict[frozenset[int], int] = {dead_set: 0}
    order: list[frozenset[int]] = [dead_set]
    rows: list[list[int]] = [[0] * n_cls]
    start_set = closure([s0])
    if start_set not in index:
        index[start_set] = len(order)
        order.append(start_set)
        rows.append([])
    k = 1
    while k < len(order):
        cur = order[k]
        row = []
        for c in range(n_cls):
            b = rep_byte[c]
            targets = [t for u in cur for label, t in nfa.edges[u] if b in label]
            nxt = closure(targets) if targets else dead_set
            if nxt not in index:
                index[nxt] = len(order)
                order.append(nxt)
                rows.append([])
            row.append(index[nxt])
        rows[k] = row
        k += 1
    cls_table = np.asarray(rows, dtype=np.int32)
    accepting = np.array([final in st for st in order], dtype=bool)
    # Merge every non-coaccessible state into the dead sink before minimising (they are all equivalent).
    alive = coaccessible(cls_table, accepting)
    cls_table = np.where(alive[cls_table], cls_table, 0).astype(np.int32)
    table, acc, start = minimize(cls_table[:, byte_class], accepting, index[start_set])
    dead_blocks = np.flatnonzero(~coaccessible(table, acc))
    if len(dead_blocks):  # always one block: the empty subset is never co-accessible
        dead = int(dead_blocks[0])
    else:
        table, acc, dead = _add_dead(table, acc)
    return ByteDFA(table=table, start=start, accepting=acc, dead=dead)


def _add_dead(table: IntArray, acc: BoolArray) -> tuple[IntArray, BoolArray, int]:
    n = table.shape[0]
    table = np.concatenate([table, np.full((1, table.shape[1]), n, dtype=np.int32)])
    return table, np.concatenate([acc, [False]]), n
