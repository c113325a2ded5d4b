"""Token caps on JSON string values that may hold escapes, kept by the policy instead of the grammar engine.

Why this is ours: llguidance's ``max_tokens`` on a lexeme ends it after N tokens wherever it stands, even inside
an escape (checked: after ``"ab\\`` at the cap only ``"`` may follow, which the engine takes for the closing quote
and a JSON parser for an escaped one, so the object never closes). Paper 003's format constraint must accept
every JSON string (Assumption 1: "set all fields to str ... allowing all possible generations"), escapes included,
and the JSON strategy must still reserve the answer's budget by capping the reason. So the grammar accepts any
JSON string body there, uncapped, and :class:`StringCaps` (fed every emitted token) counts each capped string's
tokens and gives, per step, the tokens that keep the string finishable inside its cap.

The rule (ours, docs/ALGORITHMS.md section 3): a capped string of cap N may be left open by at most
N tokens that start inside it (the token that opens it and the token that closes it are not counted; they carry
the scaffolding bytes the reserve counts). After the j-th such token the string's pending bytes, those its open
escape or UTF-8 character still needs (``\\`` 1, ``\\u`` 4, ``\\u12`` 2, a 3-byte character's lead 2), must not
exceed N - j, so that single-byte tokens can always finish it; at j = N only a token that closes the string is
allowed. The check is a lookup in a table of (token, state) -> pending bytes after the token, built once per
tokenizer (:func:`token_tables`), so a step costs one comparison over the vocabulary.

The flexible layout's whitespace is budgeted the same way (ours): at most ``ws_budget`` tokens made of whitespace
only, outside strings and outside the answer's own structure, in the whole object; once they are spent, such tokens are masked (a token that mixes
whitespace with a structural byte is still allowed: the scaffold's byte count bounds those).

A cap below :data:`MIN_ESCAPE_CAP` cannot always finish a ``\\u`` escape opened by the first token: such strings
keep the escape-free, engine-capped body (constraints/jsonreason.py).

"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from formtax.cache import LRU
from formtax.constraints.compile import EngineTokenizer
from formtax.constraints.jsonreason import MIN_ESCAPE_CAP, WS_BUDGET, JsonLayout, JsonReasonAnswer

__all__ = ["MIN_ESCAPE_CAP", "StringCaps", "TokenTables", "caps_for", "token_tables"]

# Scanner states inside a string. U0..U3: after "\u" and that many hex digits; UTF1..UTF3: inside a UTF-8
# character that needs that many more continuation bytes.
CLEAN, ESC, U0, U1, U2, U3, UTF1, UTF2, UTF3 = range(9)
N_STATES = 9
PENDING = (0, 1, 4, 3, 2, 1, 1, 2, 3)  # bytes each state still needs before the string could close
CLOSED = -1  # table value: the token closes the string
INVALID = 32767  # table value: the token's bytes are not a JSON string body from that state (above any cap)

_ESCAPES = frozenset(b'"\\/bfnrt')
_HEX = frozenset(b"0123456789abcdefABCDEF")


def step_byte(state: int, b: int) -> int:
    """The state after byte ``b`` inside a string: a state, CLOSED, or INVALID."""
    if state == CLEAN:
        if b == 0x22:
            return CLOSED
        if b == 0x5C:
            return ESC
        if b < 0x20 or 0x80 <= b < 0xC0 or b >= 0xF8:
            return INVALID
        if b >= 0xF0:
            return UTF3
        if b >= 0xE0:
            return UTF2
        if b >= 0xC0:
            return UTF1
        return CLEAN
    if state == ESC:
        if b == 0x75:  # u
            return U0
        return CLEAN if b in _ESCAPES else INVALID
    if U0 <= state <= U3:
        if b not in _HEX:
            return INVALID
        return CLEAN if state == U3 else state + 1
    # UTF1..UTF3
    if not 0x80 <= b < 0xC0:
        return INVALID
    return CLEAN if state == UTF1 else state - 1


def run_bytes(state: int, data: bytes) -> tuple[int, int]:
    """Feed ``data`` from ``state``: (end state or CLOSED / INVALID, index just past the closing quote or -1)."""
    for k, b in enumerate(data):
        state = step_byte(state, b)
        if state == CLOSED:
            return CLOSED, k + 1
        if state == INVALID:
            return INVALID, -1
    return state, -1


_PLAIN = bytes(range(0x20, 0x80)).replace(b'"', b"").replace(b"\\", b"")


def _pending_after(data: bytes) -> list[int]:
    out = []
    plain = not data.translate(None, _PLAIN)  # only ASCII bytes that need no escape
    for s in range(N_STATES):
        if s == CLEAN and plain:
            out.append(0)
            continue
        end, _ = run_bytes(s, data)
        out.append(end if end in (CLOSED, INVALID) else PENDING[end])
    return out


@dataclass(frozen=True)
class TokenTables:
    """Per-tokenizer lookups, built in one pass over the vocabulary (:func:`token_tables`)."""

    pending: torch.Tensor  # int16 [N_STATES, n_logits]: pending bytes after each token from each state
    not_whitespace: torch.Tensor  # bool [n_logits]: the tokens that are not JSON whitespace only


_TABLES: LRU[tuple[str, int], TokenTables] = LRU(8)


def token_tables(tok: EngineTokenizer, n_logits: int) -> TokenTables:
    """The string table (CLOSED: the token closes the string; INVALID: not a string body; special and padding
    tokens are INVALID) and the whitespace-only tokens (space, tab, newline, carriage return). Built once per
    tokenizer."""
    key = (tok.key, n_logits)
    hit = _TABLES.get(key)
    if hit is not None:
        return hit
    table = np.full((N_STATES, n_logits), INVALID, dtype=np.int16)
    not_ws = torch.ones(n_logits, dtype=torch.bool)
    for i in range(min(tok.vocab_size, n_logits)):
        if tok.ll.is_special_token(i):
            continue
        data = tok.ll.decode_bytes([i])
        if data:
            table[:, i] = _pending_after(data)
            not_ws[i] = bool(data.strip(b" \t\n\r"))
    return _TABLES.put(key, TokenTables(torch.from_numpy(table), not_ws))


@dataclass
class _Open:
    cap: int | None  # None: an uncapped string (a key, or a value without a cap)
    state: int = CLEAN
    inside: int = 0  # tokens that started inside the string and left it open


@dataclass
class StringCaps:
    """Per-row JSON lexical state: which string (if any) the output is inside, and the caps of the top-level
    object's string values by position (``caps[0]``: the first value, e.g. the reason)."""

    caps: dict[int, int]
    tables: TokenTables
    ws_budget: int | None = None  # whitespace-only tokens allowed outside strings, in all (None: no budget)
    _stack: list[int] = field(default_factory=list)  # b"{" or b"[" per open container
    _expect_key: bool = False
    _values: int = 0  # string values opened directly in the top-level object
    _open: _Open | None = None
    _ws_used: int = 0

    def allowed(self) -> torch.Tensor | None:
        """Bool [n_logits] of the tokens the caps allow next, or None when nothing is capped now."""
        o = self._open
        if o is None:
            if (self.ws_budget is not None and self._ws_used >= self.ws_budget
                    and len(self._stack) <= 1):  # the answer's own structure (a record) spells its own spaces
                return self.tables.not_whitespace
            return None
        if o.cap is None:
            return None
        return self.tables.pending[o.state] <= o.cap - o.inside - 1

    def advance(self, data: bytes) -> None:
        """Take the bytes of one emitted token."""
        first = self._open
        if first is None and len(self._stack) <= 1 and data and not data.strip(b" \t\n\r"):
            self._ws_used += 1
        k = 0
        while k < len(data):
            o = self._open
            if o is not None:
                end, past = run_bytes(o.state, data[k:])
                if end == CLOSED:
                    self._open = None
                    k += past
                    continue
                if end == INVALID:  # the grammar rules this out; stop tracking rather than guess
                    self._open = None
                    return
                o.state = end
                break
            b = data[k]
            k += 1
            if b in b"{[":
                self._stack.append(b)
                self._expect_key = b == 0x7B
            elif b in b"}]":
                if self._stack:
                    self._stack.pop()
                self._expect_key = False
            elif b == 0x2C:  # ,
                self._expect_key = bool(self._stack) and self._stack[-1] == 0x7B
            elif b == 0x3A:  # :
                self._expect_key = False
            elif b == 0x22:  # "
                key = bool(self._stack) and self._stack[-1] == 0x7B and self._expect_key
                cap = None
                if not key and self._stack == [0x7B]:
                    cap = self.caps.get(self._values)
                    self._values += 1
                self._open = _Open(cap)
        if self._open is not None and self._open is first:  # the token started inside and left it open
            self._open.inside += 1

    def copy(self) -> StringCaps:
        o = self._open
        return StringCaps(self.caps, self.tables, self.ws_budget, list(self._stack),
                          self._expect_key, self._values, None if o is None else _Open(o.cap, o.state, o.inside),
                          self._ws_used)

    @property
    def inside(self) -> int | None:
        """Counted tokens of the open capped string (None when none is open)."""
        return None if self._open is None or self._open.cap is None else self._open.inside


def caps_for(c: JsonReasonAnswer, tok: EngineTokenizer, n_logits: int) -> StringCaps | None:
    """The policy-kept caps of one JSON object (a fresh row state), or None when the grammar alone bounds it."""
    if not c.policy_kept:
        return None
    flexible = c.layout is JsonLayout.FLEXIBLE
    return StringCaps(c.string_caps, token_tables(tok, n_logits), WS_BUDGET if flexible else None)
