"""No duplicate keys, ever, in a JSON answer formtax constrains.

JSON grammars (llguidance's, vLLM's and Outlines' alike) let an open object repeat a key: under
``{"type": "object"}`` a model wrote ``{"Ava": 18, "Lena": 19, "Lena": 20}``, which ``json.loads`` silently merges
and formtax's oracle refuses (issue 55). The grammar cannot say "a key not yet used" (a context-sensitive rule), so
the policy does: :class:`KeyGuard`, fed every token the answer's matcher consumes, tracks the open objects and the
keys each holds so far, and at each step bans the allowed tokens that would *complete* a key already in its
object. A token that merely continues a key (``"Le`` then ``na``) stays allowed until it would close it; so the
model can always write another key, and only a duplicate is ever refused.

Which answers need it (:func:`may_repeat_keys`): a schema with an object the grammar leaves open (no
``additionalProperties: false``, or ``patternProperties``), any-value subschemas (``{}``), ``json_object``, and
Lark grammars that embed ``%json``. llguidance already keeps an object's declared properties to one occurrence,
and a closed object can repeat nothing, so those rows pay nothing.

Cost: only tokens holding a ``"`` byte can complete a key (a table per tokenizer, :func:`quote_tokens`); each such
allowed token is simulated from the current state over its bytes, and only while some open object holds a key.
Hand-written because no library tracks a JSON prefix byte by byte with rollback-free copies this cheaply.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from formtax.cache import LRU
from formtax.constraints.jsonstrings import CLEAN, CLOSED, INVALID, step_byte
from formtax.constraints.openobjects import schema_may_repeat_keys

__all__ = ["KeyGuard", "QuoteTokens", "quote_tokens", "repeated_keys", "schema_may_repeat_keys"]

QUOTE = 0x22

# frame kinds
OBJ, ARR = 0, 1

@dataclass
class _Frame:
    kind: int
    keys: set[str] = field(default_factory=set)
    expect_key: bool = True  # an object frame: the next string is a key


@dataclass
class QuoteTokens:
    """The tokens whose bytes hold a ``"`` (only those can complete a key), with their bytes."""

    ids: np.ndarray
    data: list[bytes]
    multi: np.ndarray  # positions (into ids) of tokens with four quotes or more: a whole key pair fits in them


_TABLES: LRU[str, QuoteTokens] = LRU(8)


def quote_tokens(tok: Any) -> QuoteTokens:
    """:class:`QuoteTokens` of an engine tokenizer (``constraints.compile.EngineTokenizer``), built once."""
    found = _TABLES.get(tok.key)
    if found is not None:
        return found
    ids, data = [], []
    for t in range(tok.vocab_size):
        b = tok.ll.decode_bytes([t])
        if QUOTE in b:
            ids.append(t)
            data.append(bytes(b))
    multi = np.asarray([j for j, b in enumerate(data) if b.count(QUOTE) >= 4], dtype=np.int64)
    table = QuoteTokens(np.asarray(ids, dtype=np.int64), data, multi)
    _TABLES.put(tok.key, table)
    return table


@functools.lru_cache(maxsize=4096)
def _key_text(raw: bytes) -> str | None:
    try:
        value = json.loads(b'"' + raw + b'"')
    except (ValueError, UnicodeDecodeError):
        return None
    return value if isinstance(value, str) else None


def repeated_keys(text: str) -> int:
    """How many keys of a JSON text (whole or cut short) repeat one of their object: what the guard prevents."""
    guard = KeyGuard(QuoteTokens(np.zeros(0, dtype=np.int64), [], np.zeros(0, dtype=np.int64)))
    guard.advance(text.encode("utf-8"))
    return guard.repeats


class KeyGuard:
    """The open objects of a JSON answer and their keys so far, fed byte by byte (module docstring)."""

    def __init__(self, table: QuoteTokens) -> None:
        self.table = table
        self.stack: list[_Frame] = []
        self.in_string = False
        self.is_key = False
        self.string_state = CLEAN
        self.key_buf = bytearray()
        self.n_keys = 0  # keys held by the open objects (0: no duplicate is possible yet)
        self.repeats = 0  # keys fed that repeated one of their object (a check of a finished text)

    # -- feeding ---------------------------------------------------------------------------------------
    def advance(self, data: bytes) -> None:
        for b in data:
            self._byte(b)

    def _byte(self, b: int) -> None:
        if self.in_string:
            st = step_byte(self.string_state, b)
            if st == CLOSED:
                self.in_string = False
                if self.is_key and self.stack:
                    key = _key_text(bytes(self.key_buf))
                    if key is not None and key in self.stack[-1].keys:
                        self.repeats += 1
                    elif key is not None:
                        self.stack[-1].keys.add(key)
                        self.n_keys += 1
                    self.stack[-1].expect_key = False
            elif st != INVALID:
                self.string_state = st
                if self.is_key:
                    self.key_buf.append(b)
            return
        if b == 0x7B:  # {
            self.stack.append(_Frame(OBJ))
        elif b == 0x5B:  # [
            self.stack.append(_Frame(ARR))
        elif b in (0x7D, 0x5D):  # } ]
            if self.stack:
                self.n_keys -= len(self.stack.pop().keys)
        elif b == QUOTE:
            self.in_string, self.string_state = True, CLEAN
            self.is_key = bool(self.stack) and self.stack[-1].kind == OBJ and self.stack[-1].expect_key
            self.key_buf = bytearray()
        elif b == 0x2C and self.stack and self.stack[-1].kind == OBJ:  # ,
            self.stack[-1].expect_key = True

    # -- asking ----------------------------------------------------------------------------------------
    def banned(self, allowed: Any) -> list[int]:
        """The allowed tokens (a bool tensor or array over the logits) that would complete a key already in its
        object. While no open object holds a key only a token that writes two keys itself could."""
        ids = self.table.ids
        mask = np.asarray(allowed)
        if self.n_keys == 0:
            cand = self.table.multi
            cand = cand[ids[cand] < mask.shape[0]]
            hits = cand[mask[ids[cand]]]
        else:
            inside = np.nonzero(ids < mask.shape[0])[0]
            hits = inside[mask[ids[inside]]]
        if hits.size == 0:
            return []
        data = self.table.data
        out = []
        for j in hits.tolist():
            if self._repeats(data[j]):
                out.append(int(ids[j]))
        return out

    def repeats_in(self, data: bytes) -> bool:
        """Whether ``data``, written from the current state, completes a key its object already holds."""
        return self._repeats(data)

    def _repeats(self, data: bytes) -> bool:
        """Whether ``data`` from the current state completes a key its object already holds (simulated on an
        overlay: the guard itself is unchanged)."""
        depth = len(self.stack)  # frames [0, depth) of the real stack still open
        new: list[_Frame] = []  # frames the token opened
        added: dict[int, set[str]] = {}  # keys the token wrote into real frames
        expect: dict[int, bool] = {}  # real frames' expect_key as the token changed it
        in_string, is_key, st = self.in_string, self.is_key, self.string_state
        buf = bytearray(self.key_buf) if self.is_key else bytearray()

        def top_kind() -> int | None:
            if new:
                return new[-1].kind
            return self.stack[depth - 1].kind if depth else None

        def top_expect() -> bool:
            if new:
                return new[-1].expect_key
            return expect.get(depth - 1, self.stack[depth - 1].expect_key) if depth else False

        def set_expect(value: bool) -> None:
            if new:
                new[-1].expect_key = value
            elif depth:
                expect[depth - 1] = value

        for b in data:
            if in_string:
                nxt = step_byte(st, b)
                if nxt == CLOSED:
                    in_string = False
                    if is_key and (new or depth):
                        key = _key_text(bytes(buf))
                        if key is not None:
                            if new:
                                if key in new[-1].keys:
                                    return True
                                new[-1].keys.add(key)
                            else:
                                mine = added.setdefault(depth - 1, set())
                                if key in self.stack[depth - 1].keys or key in mine:
                                    return True
                                mine.add(key)
                        set_expect(False)
                elif nxt == INVALID:
                    return False  # not a string the grammar would allow: the grammar's mask decides
                else:
                    st = nxt
                    if is_key:
                        buf.append(b)
                continue
            if b == 0x7B:
                new.append(_Frame(OBJ))
            elif b == 0x5B:
                new.append(_Frame(ARR))
            elif b in (0x7D, 0x5D):
                if new:
                    new.pop()
                elif depth:
                    depth -= 1
            elif b == QUOTE:
                in_string, st = True, CLEAN
                is_key = top_kind() == OBJ and top_expect()
                buf = bytearray()
            elif b == 0x2C and top_kind() == OBJ:
                set_expect(True)
        return False
