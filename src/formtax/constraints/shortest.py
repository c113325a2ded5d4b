"""Closing mode's witness search in bytes: the shortest completion of a grammar from any state (issue 58).

Why bytes: the grammar engine's language is a language of bytes, and a token is only a way of writing some of them.
The same grammar compiled for the 260-entry byte tokenizer costs about a microsecond per copy, consume or mask
(against ~100 us for a mask over a 49k vocabulary), so a search over bytes can afford to be exhaustive where the
token-level beam had to guess. :mod:`formtax.constraints.closing` then writes the bytes found in the model's own
tokens (their canonical tokenisation, checked by the model's matcher) and keeps the token beam only as a fallback.

The search (ours) is a uniform-cost search over byte strings: every state at byte length ``n`` is expanded before
any at ``n + 1``, and the first accepting state met is a shortest completion. Two refinements keep it small:

* **bytes the grammar forces** (``compute_ff_bytes``: the rest of a property name, ``": "``) are taken in one step,
  so a required key costs one node, not one per byte (a uniform-cost search over lengths, not a breadth-first one
  over steps);
* **one representative per class of interchangeable bytes**: where a state allows *every* lowercase letter, only
  ``a`` is tried (likewise ``A``, ``0`` and ``1``, one control byte, one non-ASCII byte where ASCII letters are
  allowed). Where a class is allowed only in part (a property name, an enum, ``[b-d]``), each allowed member is
  tried. Punctuation and white space are always tried one by one.

States of equal length are merged when they have the same allowed set *and* the same JSON bracket stack of the text
that led there (inside strings, with escapes): the stack tells ``[{...`` from ``{...``, which the allowed set alone
does not (the token beam's known miss). A state reached right after forced bytes is also merged with one of the same
fingerprint reached shorter after the same forced bytes, at any length, unless that one is its own ancestor: in a
record of choices ``"Victim": "a", "Injurer": `` and ``"Victim": "Balcombe", "Injurer": `` are one state, so one
field's alternatives are not carried into every later field (docs/ALGORITHMS.md); an ancestor is exempt because a
state the fingerprint cannot tell from one earlier on its own path is a counter's next step (an array's fourth item
against its third under ``minItems``). The merge is not a proof of equivalence (two regex states may allow the same
bytes and differ later), so the search is exact only up to that fingerprint and the per-length width
(``max_width``, :data:`MAX_WIDTH`); whatever it returns is real, since the engine accepted every byte. It stops at
``max_bytes`` (no completion that short: None) or at a deadline (``timed_out``); ``narrowed`` says whether the width
turned a state away (if not, a wider search would meet exactly the same states: closing's narrow-then-wide search
rests on it).

With ``accept`` (an oracle over the whole text, for schemas the grammar only approximates) an accepting state is a
completion only if the oracle accepts its text; the search goes on past the others, for at most
:data:`MAX_ORACLE_CALLS` oracle calls.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import llguidance

from formtax.cache import LRU
from formtax.constraints.clock import past, search_clock
from formtax.constraints.compile import EngineTokenizer, _byte_engine_tokenizer, compile_grammar

MAX_WIDTH = 48  # states kept per byte length
MAX_RUN = 16  # the longest run of one byte class a fingerprint tells apart
MAX_ORACLE_CALLS = 512
_ASCII_ORDER = b'"}])>' + b",:; \n." + b"0123456789" + b"abcdefghijklmnopqrstuvwxyz" + b"ABCDEFGHIJKLMNOPQRSTUVWXYZ"
ORDER = list(_ASCII_ORDER) + [b for b in range(256) if b not in _ASCII_ORDER]
FREE_ORDER = list(b'"\\' + b"abcdefghijklmnopqrstuvwxyz0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ")
FREE_ORDER += [b for b in ORDER if b not in FREE_ORDER]
"""Bytes in the order the search tries them (what closes a structure first): among completions of equal length the
first found is kept, so this picks which of them the witness is."""


def _span(lo: int, hi: int) -> int:
    return ((1 << (hi - lo + 1)) - 1) << lo


_LOWER, _UPPER, _DIGIT = _span(97, 122), _span(65, 90), _span(48, 57)
_CONTROL = _span(0, 31) & ~(1 << 9 | 1 << 10 | 1 << 13)
_HIGH = _span(128, 255)
_PRINTABLE = _span(32, 126)
_BYTES = _span(0, 255)
_PUNCT = sum(1 << b for b in range(33, 127) if not chr(b).isalnum() and chr(b) not in '"\\{}[]')
_CLASSES = [(_LOWER, 1 << 97), (_UPPER, 1 << 65), (_DIGIT, 1 << 48 | 1 << 49)]
_CANDIDATES: LRU[tuple[int, int], tuple[int, ...]] = LRU(4096)


def schema_strings(source: str) -> list[bytes]:
    """Every string of a JSON schema's text (keys and values), as its bytes: what an oracle may ask an answer to
    spell (a ``const`` the grammar left out)."""
    out: list[bytes] = []

    def walk(v: object) -> None:
        if isinstance(v, str):
            out.append(v.encode())
        elif isinstance(v, dict):
            for k, x in v.items():
                out.append(str(k).encode())
                walk(x)
        elif isinstance(v, list):
            for x in v:
                walk(x)

    with contextlib.suppress(ValueError):
        walk(json.loads(source))
    return [s for s in dict.fromkeys(out) if 0 < len(s) <= 64]


def literal_bytes(literals: Sequence[bytes]) -> int:
    """The bytes the grammar's literals use, as a bit set: representatives too wherever a class is allowed whole
    (a free property name next to the required ``foo``: ``f`` is tried beside ``a``)."""
    out = 0
    for lit in literals:
        for b in lit:
            out |= 1 << b
    return out


def candidates(bits: int, extra: int = 0) -> tuple[int, ...]:
    """The bytes to try from a state whose allowed bytes are the set bits of ``bits`` (module docstring); ``extra``:
    bytes tried as representatives too (:func:`literal_bytes`)."""
    hit = _CANDIDATES.get((bits, extra))
    if hit is not None:
        return hit
    keep = bits & _span(0, 255)
    for members, reps in _CLASSES:
        if keep & members == members:
            keep &= ~members | reps | extra
    if keep & _PRINTABLE == _PRINTABLE:  # free text: punctuation the literals do not use is interchangeable
        keep &= ~_PUNCT | extra
    for members in (_CONTROL, _HIGH):
        part = keep & members
        full = members == _CONTROL and part == members
        if part and (full or (members == _HIGH and bits & _LOWER == _LOWER)):
            keep = keep & ~members | (part & -part) | (part & extra)  # the lowest allowed member (and literals')
    free = bits & _LOWER == _LOWER and bits & _PUNCT == _PUNCT
    order = FREE_ORDER if free else ORDER  # free text: letter and digit runs first (a pattern's counter needs them)
    return _CANDIDATES.put((bits, extra), tuple(b for b in order if keep >> b & 1))


def _kind(b: int) -> int:
    """A byte's class, part of a state's fingerprint: states after ``"aa`` and ``"a}`` allow the same bytes under
    ``.*[a-z]{3}.*`` and differ in how far the letter run has gone."""
    return 0 if 97 <= b <= 122 or 65 <= b <= 90 or 48 <= b <= 57 else 1 if b < 128 else 2


def _run(data: bytes, kind: int, length: int) -> tuple[int, int]:
    """The class of the last byte and how many bytes of that class end the text (at most :data:`MAX_RUN`): part
    of a state's fingerprint, since a counter (``[0-9a-f]{8}``, ``[a-z]{3,40}``) leaves the allowed set unchanged
    while it counts."""
    for b in data:
        k = _kind(b)
        kind, length = k, (min(length + 1, MAX_RUN) if k == kind else 1)
    return kind, length


def _since_quote(data: bytes, before: int) -> int:
    """Bytes since the last ``"`` (at most 64): where two states allow the same bytes at the same length, how far
    into its string each one is (a uuid's second group against its first)."""
    at = data.rfind(b'"')
    return min(64, before + len(data) if at < 0 else len(data) - at - 1)


def push(stack: str, b: int) -> str:
    """The JSON bracket stack after byte ``b``: ``{`` and ``[`` open, ``"`` opens a string (``\\`` an escape in
    it), their closers pop. Outside JSON it is only a finer fingerprint."""
    top = stack[-1:] if stack else ""
    if top == "\\":
        return stack[:-1]
    if top == '"':
        return stack + "\\" if b == 92 else stack[:-1] if b == 34 else stack
    if b in (123, 91):
        return stack + chr(b)
    if (b == 125 and top == "{") or (b == 93 and top == "["):
        return stack[:-1]
    return stack + '"' if b == 34 else stack


def stack_of(data: bytes, stack: str = "") -> str:
    for b in data:
        stack = push(stack, b)
    return stack


@dataclass
class Found:
    """A search's outcome: ``data`` the shortest completion's bytes (None: none within the bound), ``timed_out``
    when the deadline stopped it first (then None proves nothing)."""

    data: bytes | None
    timed_out: bool = False  # stopped by its deadline or its work bound
    unusable: bool = False  # the byte engine refused the text that leads to the state (nothing is proved)
    narrowed: bool = False  # the width bound turned a state away: a wider search may find another (shorter) one
    work: int = 0  # the states it generated (each one engine copy and consume): its cost, whatever the machine
    seconds: float = 0.0  # the search's own time (search_clock), kept with it in the cache


def byte_matcher(grammar: str) -> llguidance.LLMatcher:
    """A fresh matcher of ``grammar`` over the byte tokenizer (token ``b`` is byte ``b``)."""
    return compile_grammar(grammar, _byte_engine_tokenizer()).matcher(260).ll


def replay(grammar: str, data: bytes) -> llguidance.LLMatcher:
    """A byte matcher of ``grammar`` after ``data`` (in error where the engine refuses it)."""
    ll = byte_matcher(grammar)
    if data:
        ll.consume_tokens(list(data))
    return ll


def _bits(ll: llguidance.LLMatcher) -> int:
    return int.from_bytes(ll.compute_bitmask(), "little")


def is_json_document(grammar: str) -> bool:
    """Whether ``grammar`` is formtax's envelope of one JSON schema: its every sentence is one JSON document, so
    every bracket and quote left open needs a byte to close it (the search's lower bound)."""
    return grammar.startswith('{"grammars":[{"name":"json_schema","json_schema":')


def shortest_bytes(start: llguidance.LLMatcher, before: bytes, max_bytes: int, deadline: float,
                   accept: Callable[[bytes], bool] | None = None, extra: int = 0, json_doc: bool = False,
                   literals: Sequence[bytes] = (), max_nodes: int = 1 << 30, max_width: int = MAX_WIDTH,
                   until_narrowed: bool = False) -> Found:
    """The shortest byte string that takes ``start`` (a byte matcher, untouched) to an accepting state (module
    docstring). ``before``: the text that led to ``start`` (its bracket stack; the oracle reads it whole).
    ``json_doc`` (:func:`is_json_document`): the search is an A* whose lower bound is the number of brackets and
    quotes left open (admissible and consistent: a byte opens or closes at most one), so nested detours wait.
    ``max_nodes``: the states it may expand, a bound on its work that, unlike the deadline, does not depend on the
    machine's load (so an output never does); past either it stops with ``timed_out``.
    ``literals`` (the grammar's, and with an oracle the schema's strings): a state's progress along them is part of
    its fingerprint, so ``"t`` on the way to ``"then"`` is not merged with ``"a``. ``max_width``: the states kept per
    byte length (the module docstring); ``until_narrowed``: stop (None, ``narrowed``) at the first state the width
    turns away."""
    prefixes = {lit[:k] for lit in literals for k in range(1, len(lit) + 1)}
    longest = max((len(p) for p in prefixes), default=0)

    def progress(p: bytes, b: int) -> bytes:
        q = (p + bytes([b]))[-longest:] if longest else b""
        while q and q not in prefixes:
            q = q[1:]
        return q

    if start.is_error():
        return Found(None, unusable=True)
    # a node: (matcher, allowed bits, bracket stack, its length, its parent's index in ``nodes``, the bytes it added,
    # its progress along the literals)
    root, at = stack_of(before), b""
    for c in before[-longest:] if longest else b"":
        at = progress(at, c)
    run0 = (*_run(before, -1, 0), _since_quote(before, 0))
    nodes: list[tuple[llguidance.LLMatcher, int, str, int, int, bytes, bytes, tuple[int, int, int]]] = [
        (start, _bits(start), root, 0, -1, b"", at, run0)]
    buckets: dict[int, deque[int]] = {len(root) if json_doc else 0: deque([0])}
    seen: set[tuple[int, int, str, bytes, tuple[int, int, int]]] = {(0, nodes[0][1], root, at, run0)}
    width: dict[int, int] = {}
    oracle_calls = popped = work = 0
    narrowed = False

    best: dict[tuple[bytes, int, str, bytes, tuple[int, int, int]], tuple[int, int]] = {}

    def descends(i: int, a: int) -> bool:
        """Whether node ``a`` is node ``i`` or one of its ancestors."""
        stop = nodes[a][3]
        while i >= 0 and nodes[i][3] >= stop:
            if i == a:
                return True
            i = nodes[i][4]
        return False

    def path(i: int) -> bytes:
        parts = []
        while i >= 0:
            parts.append(nodes[i][5])
            i = nodes[i][4]
        return b"".join(reversed(parts))

    while buckets:
        f = min(buckets)
        if f > max_bytes:
            break
        queue = buckets[f]
        i = queue.popleft()
        if not queue:
            del buckets[f]
        popped += 1
        if popped > max_nodes or (popped % 32 == 0 and past(deadline)):
            return Found(None, timed_out=True, narrowed=narrowed, work=work)
        ll, bits, stack, length, _, _, at, run = nodes[i]
        if ll.is_accepting():
            if accept is None:
                return Found(path(i), narrowed=narrowed, work=work)
            if oracle_calls < MAX_ORACLE_CALLS:
                oracle_calls += 1
                if accept(before + path(i)):
                    return Found(path(i), narrowed=narrowed, work=work)
        for b in candidates(bits, extra):
            child = ll.deep_copy()  # not consume-then-rollback: the engine refuses rollback past a capped lexeme
            work += 1
            if not child.consume_token(b):
                continue
            child_bits = _bits(child)
            forced = b""
            # the engine's forced bytes (costly on a large grammar) only where a single byte is allowed: else none
            if not child.is_accepting() and (child_bits & _BYTES).bit_count() == 1:
                forced = bytes(child.compute_ff_bytes())
                if forced:
                    if not child.consume_tokens(list(forced)):
                        continue
                    child_bits = _bits(child)
            added = bytes([b]) + forced
            n = length + len(added)
            child_stack, child_at = stack_of(added, stack), at
            for c in added if longest else b"":
                child_at = progress(child_at, c)
            child_run = (*_run(added, run[0], run[1]), _since_quote(added, run[2]))
            fp = (child_bits, child_stack, child_at, child_run)
            key = (n, *fp)
            g = n + (len(child_stack) if json_doc else 0)
            if g > max_bytes or key in seen:
                continue
            if width.get(n, 0) >= max_width:
                if until_narrowed:
                    return Found(None, narrowed=True, work=work)
                narrowed = True
                continue
            if forced:
                shorter = best.get((forced, *fp))
                if shorter is not None and shorter[0] < n and not descends(i, shorter[1]):
                    continue  # the same state, reached shorter another way (docstring)
                if shorter is None or n < shorter[0]:
                    best[(forced, *fp)] = (n, len(nodes))
            seen.add(key)
            width[n] = width.get(n, 0) + 1
            nodes.append((child, child_bits, child_stack, n, i, added, child_at, child_run))
            buckets.setdefault(g, deque()).append(len(nodes) - 1)
    return Found(None, narrowed=narrowed, work=work)


@dataclass
class _Entry:
    found: Found
    bound: int  # the max_bytes it was searched with


_FOUND: LRU[tuple[str, str, bytes, bool, int, bool], _Entry] = LRU(8192)
"""Byte searches by (grammar, oracle's name, the state's fingerprint: a digest of the bytes from the grammar's
start, which determine the engine's state). A hit is what a fresh search would return (it is deterministic); one that
timed out is never kept."""


def cached_shortest(grammar: str, oracle: str, start: Callable[[], llguidance.LLMatcher], before: bytes,
                    max_bytes: int, deadline: float, accept: Callable[[bytes], bool] | None = None,
                    extra: int = 0, literals: Sequence[bytes] = (), max_nodes: int = 1 << 30,
                    max_width: int = MAX_WIDTH, until_narrowed: bool = False) -> Found:
    """:func:`shortest_bytes` from the state ``before`` leads to, through the cache: a completion found within a
    bound serves every bound it fits; a proof that none exists within a bound serves every smaller bound."""
    began = search_clock()
    key = (grammar, oracle, hashlib.blake2b(before, digest_size=16).digest(), accept is not None, max_width,
           until_narrowed)
    hit = _FOUND.get(key)
    if hit is not None:
        d = hit.found.data
        if d is not None:  # the shortest: it serves a bound it fits, and proves none fits a smaller one
            return hit.found if len(d) <= max_bytes else Found(None, narrowed=hit.found.narrowed)
        if hit.bound >= max_bytes:  # none within a larger bound: none within this one
            return hit.found
    state = start()  # compiling the byte grammar (once per grammar) is not the search's time
    searching = search_clock()
    deadline += searching - began
    found = shortest_bytes(state, before, max_bytes, deadline, accept, extra, is_json_document(grammar), literals,
                           max_nodes, max_width, until_narrowed)
    found.seconds = search_clock() - searching
    if not (found.timed_out or found.unusable):
        _FOUND.put(key, _Entry(found, max_bytes))
    return found


_LONGEST: LRU[str, int] = LRU(8)


def longest_token(tok: EngineTokenizer) -> int:
    """The most bytes one (non-special) token of ``tok`` carries: a completion of ``n`` bytes takes at least
    ``n / longest_token`` tokens."""
    hit = _LONGEST.get(tok.key)
    if hit is not None:
        return hit
    ll = tok.ll
    n = max((len(ll.decode_bytes([i])) for i in range(tok.vocab_size) if not ll.is_special_token(i)), default=1)
    return _LONGEST.put(tok.key, max(1, n))


def spell(ll: llguidance.LLMatcher, tok: EngineTokenizer, before: Sequence[int], data: bytes) -> list[int] | None:
    """``data`` in ``tok``'s tokens, such that ``before`` then they take ``ll`` (untouched) to an accepting state:
    the canonical tokenisation (the fewest tokens, as the tokenizer writes text), else one token per byte; None
    where the engine takes neither (checked with EOS, which it allows only where the grammar accepts)."""
    eos = int(tok.ll.eos_token)
    canonical = list(tok.ll.tokenize_bytes(data)) if data else []
    tries = [canonical]
    singles = [tok.ll.tokenize_bytes(bytes([b])) for b in data]
    if all(len(s) == 1 for s in singles):
        tries.append([s[0] for s in singles])
    for w in tries:
        seq = [*before, *w, eos]
        if int(ll.validate_tokens(seq)) == len(seq):
            return w
    return None
