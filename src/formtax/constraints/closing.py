"""Closing mode: a constrained answer that always finishes inside its token budget.

Without it an unbounded constraint (an open JSON object, ``regex:[a-z]+ ok``, a Lark grammar) can run out of tokens
half-way (``length-incomplete``, an unparseable answer). With it, the decode loop only emits a token after which a
completion of the grammar still fits in the tokens that are left; so every answer parses whenever a completion fits
at the start, and a request where none fits is refused before any model call.

How "a completion still fits" is decided (ours; llguidance exposes no shortest-completion query):

* a *witness* is a token sequence that takes the matcher from its current state to an accepting one. One is kept
  per request. After the model's token ``t``: if ``t`` is the witness's first token, the rest is a witness; else
  the old witness is replayed after ``t`` on a copy (inside a JSON string any character keeps ``"}`` valid, so
  this is the common case and costs microseconds); only when that fails is a new one searched.
* the search (issue 58) finds the shortest completion in bytes, A* over the grammar compiled for the byte
  tokenizer (:mod:`formtax.constraints.shortest`), and writes it in the model's tokens (canonical tokenisation,
  checked by the engine); the token beam of :mod:`formtax.constraints.beam` runs only where that cannot be done.
  It runs narrow first (:data:`NARROW_WIDTH` states per byte length): where that search turned no state away it was
  the whole search; else the wide one decides and, on a large grammar, the narrow one's completion backs it
  (:func:`find_witness`).
  Searches are bounded in work (states expanded) and, as a backstop, in time; a JSON schema whose every instance
  needs more bytes than the budget can carry is refused before anything compiles
  (:mod:`formtax.constraints.closing_bound`). Any witness is real (the engine accepted every token), so the
  guarantee rests on the witness, not on the search being optimal.
* on a schema the grammar only approximates, every witness must also be an answer the oracle accepts
  (:func:`closing_oracle`), so the answer closing steers to parses (``Result.stats["closing_parse"]``).
* witnesses are pooled (:class:`WitnessPool`): a state whose own witness does not replay first tries, shortest
  first, every suffix of the grammar's start witness (shared by every row and request of one compiled grammar; its
  token suffixes and some of its byte suffixes, :func:`byte_suffixes`) and of the witnesses the row itself found.
  A check is one ``validate_tokens([token, *witness, EOS])`` on the row's own matcher: the engine accepts the EOS
  only where the grammar accepts, so it tells whether the witness completes after the token, without copying the
  matcher. The states a row meets (inside a string, after a
  value, before the next key) are completed by such suffixes, so the search runs rarely, and a pooled witness
  is as real as a searched one: the engine checked it from this very state. The pool holds nothing learnt from
  other requests, so a row's output never depends on what else ran (batch, order, server traffic).
* the rule (issue 46): a token is refused only if no completion from the state after it fits in the tokens left
  after it. The checks stop at the first proof, cheapest first: the state after the token accepts (an accepting
  state needs nothing more; the engine's EOS is checked there, so EOS counts where the engine needs it); the
  current witness goes on after it; a pooled witness completes it; only then a search bounded by the tokens
  left. So closing is invisible wherever the model's own answer fits: where the closing-off decode completes
  inside the budget, the closing-on decode is token-identical (tests/core/test_closing_invisible.py). What closing
  changed is counted per row (``Result.stats["closing_changed_tokens"]``: the steps at which the model's own
  choice was refused; 0 where closing stayed invisible).
* a token whose witness does not fit is refused (:class:`~formtax.decoding.loop.Veto`): the loop masks it and
  chooses again from the same logits, so greedy takes the best token that keeps a completion within budget and
  sampling draws from the model's distribution conditioned on that; after a few refusals the witness's next token
  is emitted (forced).
"""

from __future__ import annotations

import contextvars
import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

import llguidance

from formtax.cache import LRU
from formtax.constraints.beam import MAX_DEPTH, search_witness
from formtax.constraints.clock import caller_bound, past, search_clock
from formtax.constraints.compile import CompiledGrammar, EngineTokenizer, Matcher
from formtax.constraints.shortest import (
    MAX_WIDTH,
    Found,
    byte_matcher,
    cached_shortest,
    literal_bytes,
    longest_token,
    replay,
    schema_strings,
    spell,
)

START_MS = 2000  # the time bound of a start witness's search (a request is refused past it)
STEP_MS = 1000  # the time bound of one search inside the decode loop (the token is refused past it)
START_NODES = 20_000  # the states a start witness's byte search may expand
STEP_NODES = 2_000  # the states one byte search inside the decode loop may expand
"""The work bounds come first: they do not depend on the machine's load, so neither does an output; the time
bounds are a backstop for states that are slow to expand (huge grammars)."""
MAX_START_BYTES = 1 << 16  # the longest start witness searched for without a budget (bytes)
NARROW_WIDTH = 8
"""The states per byte length of a witness search's first, narrow pass (:func:`find_witness`; ours: on the EAE
study's 93 kB record grammar it finds a 130-byte completion in 0.2 s where 48 states per length take 1.3 s)."""
LARGE_GRAMMAR = 32_768
"""Grammar text (characters) from which the narrow pass runs on past the first state it turns away, to back the wide one
(ours): on a large grammar each state costs tens of microseconds and the wide search may not finish; below it the
narrow pass stops there and the wide one runs, as cheap as before (the narrow pass run through had cost the closing
fuzz 20% more time, bench/closing.py)."""


class ClosingParse(StrEnum):
    """What closing guarantees of an answer whose schema the grammar only approximates (``Result.stats
    ["closing_parse"]``, absent for every other constraint, where the grammar is the whole check)."""

    ORACLE = "oracle"  # closing keeps to answers the oracle accepts: the answer parses
    GRAMMAR_ONLY = "grammar-only"  # no answer the oracle accepts was found within the budget: only the grammar


Oracle = Callable[[bytes], bool]
"""Whether a whole answer's bytes are an answer the oracle accepts (schemas the grammar only approximates)."""


START_WITNESSES: contextvars.ContextVar[dict[str, list[int] | None] | None] = contextvars.ContextVar(
    "formtax_start_witnesses", default=None)
"""Start witnesses by :func:`grammar_key`: :func:`start_search` records every one it finds into this dict when one
is set, and takes one from it instead of searching (a process that checked a request hands its witnesses to the
process that decodes it; each is checked by the engine before use)."""


def grammar_key(grammar: str) -> str:
    """A short stable name of a grammar's text (for :data:`START_WITNESSES`)."""
    return hashlib.sha256(grammar.encode()).hexdigest()[:24]


@dataclass
class Witness:
    """A search's outcome: ``tokens`` (None: no completion within the bound), ``timed_out`` where the time bound
    stopped the search first (then None proves nothing: the refusal says so)."""

    tokens: list[int] | None
    timed_out: bool = False


def find_witness(ll: llguidance.LLMatcher, tok: EngineTokenizer, grammar: str, before: bytes, max_tokens: int,
                 ms: float, *, start: Callable[[], llguidance.LLMatcher] | None = None, hints: tuple[bytes, ...] = (),
                 oracle: Oracle | None = None, oracle_key: str = "", max_nodes: int = STEP_NODES) -> Witness:
    """The witness from ``ll``'s state (``before``: the bytes from the grammar's start that led there): the shortest
    completion in bytes (:mod:`formtax.constraints.shortest`, at most what ``max_tokens`` tokens can carry), written in
    ``tok``'s tokens and checked by ``ll``; the token beam only where those bytes cannot be written so. ``start``:
    a byte matcher already in that state (else ``before`` is replayed); ``oracle``: only completions it accepts.

    The byte search runs narrow first (:data:`NARROW_WIDTH`); where that one turned no state away it met every
    state the wide one (:data:`~formtax.constraints.shortest.MAX_WIDTH`) would, so its answer is the wide one's.
    Else the wide search decides; on a grammar of :data:`LARGE_GRAMMAR` characters or more the narrow pass runs on
    to the end and its completion (real, if not the shortest) backs the wide one where that stops at its bounds or
    is not run: where it cannot finish in the time left, predicted at ``MAX_WIDTH / NARROW_WIDTH`` times the narrow
    search's own time (it keeps that many times the states; a narrow search that found nothing always goes on to
    the wide one). So where the wide search finishes, the witness is what it always was; a grammar too large for it
    still gets a real witness instead of a refusal."""
    ms = caller_bound(ms)
    deadline = search_clock() + ms / 1000
    max_bytes = min(max(0, max_tokens) * longest_token(tok), MAX_START_BYTES)
    literals = [*hints, *schema_strings(oracle_key)] if oracle_key else list(hints)
    bytes_by = deadline - 0.5 * ms / 1000
    args = (grammar, oracle_key, start or (lambda: replay(grammar, before)), before, max_bytes, bytes_by, oracle,
            literal_bytes(literals), literals, max_nodes)
    found = cached_shortest(*args, max_width=NARROW_WIDTH, until_narrowed=len(grammar) < LARGE_GRAMMAR)
    wide_fits = search_clock() + MAX_WIDTH / NARROW_WIDTH * found.seconds < bytes_by
    if found.narrowed and (found.data is None or wide_fits):  # the wide search decides, the narrow one backs it
        wide = cached_shortest(*args, max_width=MAX_WIDTH)
        found = wide if wide.data is not None or found.data is None else Found(found.data)
    if found.timed_out and oracle is not None:
        return Witness(None, timed_out=True)
    if found.data is not None:
        w = spell(ll, tok, [], found.data)
        if w is not None or oracle is not None:
            return Witness(w)
    elif not (found.unusable or found.timed_out):
        return Witness(None)
    # bytes the model's tokens cannot write, a state the byte engine refused, or the byte search's time spent:
    # the token beam, in the time that is left
    deadline = max(deadline, search_clock() + 0.5 * ms / 1000)  # the beam's own share, whatever came before
    w = search_witness(ll, tok, max(0, min(4 * max_tokens + 4, MAX_DEPTH)), hints, before[-64:], deadline)
    if w is None and past(deadline):
        caller_bound(0.0)  # the caller's bound ran out: say so (SearchTimeout), not "no completion"
    return Witness(w, timed_out=w is None and past(deadline))


class WitnessPool:
    """Every suffix of some witnesses (module docstring), distinct and shortest first."""

    def __init__(self, witnesses: Sequence[Sequence[int]] = ()) -> None:
        self.items: list[tuple[int, ...]] = []
        self.members: set[tuple[int, ...]] = set()
        for w in witnesses:
            self.add(w)

    def add(self, witness: Sequence[int] | None) -> None:
        if not witness:
            return
        new = [s for k in range(len(witness)) if (s := tuple(witness[k:])) not in self.members]
        if new:
            self.members.update(new)
            self.items = sorted(self.members, key=lambda w: (len(w), w))

    def first_fit(self, ll: llguidance.LLMatcher, before: Sequence[int], eos: int, left: int,
                  skip: Sequence[int] | None = None, tried: WitnessPool | None = None, found: Sequence[int] = ()
                  ) -> list[int] | None:
        """The shortest pooled witness of at most ``left`` tokens that completes ``ll``'s state after ``before``
        (checked by the engine, nothing copied), or None. ``tried``: a pool searched first, whose first fit was
        ``found`` (empty: none); only a witness that comes before ``found`` (shorter, or as long and lower) and
        that ``tried`` does not have can come before it, so only those are checked."""
        key = (len(found), tuple(found))
        for w in self.items:
            if len(w) > left or (found and (len(w), w) >= key):
                break
            if (tried is not None and w in tried.members) or (skip is not None and list(w) == list(skip)):
                continue
            if fits(ll, before, w, eos):
                return list(w)
        return None


def fits(ll: llguidance.LLMatcher, before: Sequence[int], witness: Sequence[int], eos: int) -> bool:
    """Whether ``before`` then ``witness`` take ``ll`` (untouched) to an accepting state: the engine validates
    them followed by EOS, which it allows only where the grammar accepts."""
    seq = [*before, *witness, eos]
    return int(ll.validate_tokens(seq)) == len(seq)


_POOLS: LRU[tuple[str, str], WitnessPool] = LRU(256)


def witness_pool(grammar: str, tok: EngineTokenizer) -> WitnessPool:
    """The shared pool of one (grammar, tokenizer): the suffixes of its start witness (:func:`start_witness`
    fills it, once); empty where none was searched."""
    hit = _POOLS.get((grammar, tok.key))
    return hit if hit is not None else WitnessPool()


_START: LRU[tuple[str, str, str], Witness] = LRU(256)


def start_search(grammar: CompiledGrammar, n_logits: int, limit: int | None = None, oracle: Oracle | None = None,
                 oracle_key: str = "") -> Witness:
    """The witness from a compiled grammar's start state. With ``limit`` the search looks no further than what
    ``limit`` tokens can carry (so a hopeless budget is refused at once), then, where none fits, for the shortest
    anyway under a short time bound (for the refusal's message). Found witnesses are kept per (grammar, tokenizer,
    oracle) and fill the grammar's shared pool."""
    tok = grammar.tokenizer
    key = (grammar.grammar, tok.key, oracle_key)
    handed = START_WITNESSES.get()
    name = grammar_key(grammar.grammar + "\0" + oracle_key) if handed is not None else ""
    if handed is not None and handed.get(name) is not None:
        given = handed[name]
        assert given is not None
        if fits(grammar.matcher(n_logits).ll, [], given, int(tok.ll.eos_token)):  # verified here, then trusted
            return _keep(key, Witness(list(given)), tok)
    found = _start_search(grammar, n_logits, key, limit, oracle, oracle_key)
    if handed is not None and found.tokens is not None:
        handed[name] = list(found.tokens)
    return found


def _start_search(grammar: CompiledGrammar, n_logits: int, key: tuple[str, str, str], limit: int | None,
                  oracle: Oracle | None, oracle_key: str) -> Witness:
    tok = grammar.tokenizer
    hit = _START.get(key)
    if hit is not None and hit.tokens is not None:
        return hit
    m = grammar.matcher(n_logits)
    ms: float = START_MS
    if limit is not None:
        t0 = search_clock()
        bounded = find_witness(m.ll, tok, grammar.grammar, b"", limit, START_MS, hints=m.hints, oracle=oracle,
                               oracle_key=oracle_key, max_nodes=START_NODES)
        if bounded.tokens is not None and len(bounded.tokens) <= limit or bounded.timed_out:
            return _keep(key, bounded, tok)
        ms = max(0.0, min(START_MS / 10, START_MS - 1000 * (search_clock() - t0)))
    found = find_witness(m.ll, tok, grammar.grammar, b"", MAX_DEPTH if limit is None else 4 * limit + 64, ms,
                         hints=m.hints, oracle=oracle, oracle_key=oracle_key, max_nodes=START_NODES // 10)
    return _keep(key, found, tok) if limit is None or found.tokens is not None else Witness(None)


def _keep(key: tuple[str, str, str], found: Witness, tok: EngineTokenizer) -> Witness:
    if found.tokens is not None:
        _START.put(key, found)
        _POOLS.put(key[:2], WitnessPool([found.tokens, *byte_suffixes(tok, found.tokens)]))
    return found


BYTE_SUFFIXES = 32
"""How many byte suffixes of a start witness join its grammar's shared pool, written in the model's tokens (ours).
The witness's token suffixes complete the states a row reaches at the witness's own token boundaries; a model that
writes the same structure in other tokens (a string opened with its first characters in one token, `` "+``) stops
between them, where the witness's bytes from the next quote on complete it. Without them each such row searches
(tens of microseconds on a small schema, milliseconds on a large one) for what the witness already holds."""


def byte_suffixes(tok: EngineTokenizer, witness: Sequence[int]) -> list[list[int]]:
    """The witness's byte suffixes that start at a quote or in its last 8 bytes (at a character's first byte),
    shortest first, at most :data:`BYTE_SUFFIXES`, in the tokenizer's canonical tokens (unchecked here: each use is
    checked from the row's own state by the engine). Deterministic in the grammar and tokenizer: a row's output never
    depends on what else ran."""
    data = bytes(tok.ll.decode_bytes(list(witness)))
    tail = {p for p in range(max(1, len(data) - 8), len(data)) if data[p] & 0xC0 != 0x80}  # not inside a character
    starts = sorted({p for p, b in enumerate(data) if b == 0x22 and p} | tail, reverse=True)[:BYTE_SUFFIXES]
    return [list(tok.ll.tokenize_bytes(data[p:])) for p in starts]


def closing_oracle(constraint: object) -> tuple[Oracle | None, str]:
    """The oracle closing keeps to for ``constraint`` and its cache key: a JSON schema the grammar only approximates
    (schema_approx.approximate_schema) is checked by its own validator, so closing steers to an answer that parses; every
    other constraint is its grammar (no oracle)."""
    from formtax.constraints.spec import JsonConstraint

    if not isinstance(constraint, JsonConstraint) or not constraint.approximations:
        return None, ""

    def accept(data: bytes) -> bool:
        try:
            return constraint.validate(data.decode("utf-8")).ok
        except UnicodeDecodeError:
            return False

    return accept, constraint.source


def start_witness(grammar: CompiledGrammar, n_logits: int) -> list[int] | None:
    """The witness from a compiled grammar's start state, searched once per (grammar, tokenizer)."""
    w = start_search(grammar, n_logits).tokens
    return None if w is None else list(w)


@dataclass
class Closer:
    """One request's closing state, owned by its :class:`~formtax.decoding.policies.ConstrainedPolicy`.

    ``limit`` is the number of tokens the policy may emit in all (its row's budget after any forced prefix);
    ``step`` counts from the same origin, so ``limit - step`` tokens are left at a step, the current one included.
    ``oracle`` (a schema the grammar only approximates): every witness must also be an answer the oracle accepts,
    so the answer closing steers to parses.
    """

    matcher: Matcher
    limit: int
    eos_ids: frozenset[int]
    oracle: Oracle | None = None
    oracle_key: str = ""
    witness: list[int] | None = None
    _known: bool = False
    _after: dict[int, list[int] | None] = field(default_factory=dict)
    refused: int = 0
    timed_out: int = 0  # searches the time bound stopped (their tokens were refused)
    pooled: int = 0  # witnesses taken from the pools instead of a search
    changed: int = 0  # steps at which the model's own choice was refused (0: closing stayed invisible)
    _first: bool = False
    left: int = 0  # tokens left after the step's own (:meth:`begin_step`)
    _prefix: bytearray = field(default_factory=bytearray)  # the bytes of the tokens this policy emitted ...
    _pending: list[int] = field(default_factory=list)  # ... but these last ones, decoded when a search reads them
    parse: ClosingParse | None = None  # set for an approximated schema: what closing guarantees of its answer

    def __post_init__(self) -> None:
        self._eos = int(self.matcher.tokenizer.ll.eos_token)
        self._ll = self.matcher.ll  # the matcher's engine state (the same object for the matcher's life)
        self._shared = witness_pool(self.matcher.grammar, self.matcher.tokenizer)
        self._own = WitnessPool()  # the suffixes of the witnesses this row found
        self._bytes: llguidance.LLMatcher | None = None  # a byte matcher, brought up to ``prefix`` when searched
        self._synced = 0

    def _decode(self, tokens: Sequence[int]) -> bytes:
        return bytes(self.matcher.tokenizer.ll.decode_bytes(list(tokens)))

    @property
    def prefix(self) -> bytearray:
        """Every byte this policy emitted (a search's state, an oracle's text): decoded token by token when read,
        not at every step (most steps never search)."""
        if self._pending:
            ll = self.matcher.tokenizer.ll
            for t in self._pending:
                self._prefix += ll.decode_bytes([t])
            self._pending.clear()
        return self._prefix

    def _valid(self, after: bytes, witness: Sequence[int]) -> bool:
        """The oracle's word on the answer ``after`` then ``witness`` would make (True without an oracle)."""
        return self.oracle is None or self.oracle(bytes(self.prefix) + after + self._decode(witness))

    def _pooled(self, before: Sequence[int], left: int, skip: Sequence[int] | None = None) -> list[int] | None:
        """The shortest witness of the two pools that completes the state after ``before`` in ``left`` tokens."""
        ll = self.matcher.ll
        first = self._shared.first_fit(ll, before, self._eos, left, skip)
        if self.oracle is None:  # the row's own pool adds only a witness before the shared one's (none it has)
            own = self._own.first_fit(ll, before, self._eos, left, skip, tried=self._shared, found=first or ())
            found = [w for w in (first, own) if w]
        else:  # each pool's first fit, then the oracle's word on each
            own = self._own.first_fit(ll, before, self._eos, left, skip)
            after = self._decode(before)
            found = [w for w in (first, own) if w and self._valid(after, w)]
        if not found:
            return None
        self.pooled += 1
        return min(found, key=lambda w: (len(w), w))

    def start_from(self, witness: list[int] | None) -> Closer:
        """Begin with a witness already known for the matcher's current state (e.g. :func:`start_witness`)."""
        if witness is not None and not self._valid(b"", witness):
            witness = None
        self.witness, self._known = witness, witness is not None
        self._shared = witness_pool(self.matcher.grammar, self.matcher.tokenizer)
        self._own.add(witness)
        return self

    def current(self) -> list[int] | None:
        if not self._known:
            self.witness = self._pooled([], self.limit)
            if self.witness is None:
                self.witness = self._search(self.matcher.ll, self.limit, b"", START_MS, START_NODES)
            self._known = True
        return self.witness

    def _state(self, after: bytes) -> llguidance.LLMatcher:
        """A byte matcher in the state of ``prefix`` then ``after`` (the row's own one, brought up to date)."""
        if self._bytes is None:
            self._bytes = byte_matcher(self.matcher.grammar)
        if self._synced < len(self.prefix):
            self._bytes.consume_tokens(list(self.prefix[self._synced:]))
            self._synced = len(self.prefix)
        c = self._bytes.deep_copy()
        if after:
            c.consume_tokens(list(after))
        return c

    def _search(self, ll: llguidance.LLMatcher, left: int, after: bytes, ms: float = STEP_MS,
                nodes: int = STEP_NODES) -> list[int] | None:
        """The witness from ``ll`` (the row's state, then ``after``), within ``left`` tokens, or None."""
        found = find_witness(ll, self.matcher.tokenizer, self.matcher.grammar, bytes(self.prefix) + after, left,
                             ms, start=lambda: self._state(after), hints=self.matcher.hints, oracle=self.oracle,
                             oracle_key=self.oracle_key, max_nodes=nodes)
        self.timed_out += int(found.timed_out)
        self._own.add(found.tokens)
        return found.tokens

    def fallback(self) -> int:
        """The token to emit when the model's choices are all refused: the witness's next one (EOS once the
        grammar accepts)."""
        w = self.current()
        if w:
            self._after.setdefault(w[0], w[1:])  # the witness goes on after its own first token
            return w[0]
        return min(self.eos_ids)

    def begin_step(self, step: int) -> bool:
        """A new step (``step`` tokens emitted of :attr:`limit`), so ``limit - step - 1`` are left after its own:
        the next :meth:`vet` is asked of the model's own choice (for :attr:`changed`). Whether a witness is
        known (:meth:`current`): without one closing keeps nothing at this step."""
        self._first = True
        self.left = self.limit - step - 1
        return (self.witness if self._known else self.current()) is not None

    def vet(self, token: int) -> bool | None:
        """Whether a completion still fits in this step's tokens left (:attr:`left`) after emitting ``token``: the
        rule of closing mode, and a step's :class:`~formtax.decoding.plan.Veto`. The witness it proved after the
        token is kept for :meth:`advance`; the step's first answer is the model's own choice, and refusing it
        counts in :attr:`changed`.

        ``token`` is refused only if no completion from the state after it fits. The checks run cheapest first
        and stop at the first proof: the current witness goes on after the token (its own first token, or
        replayed: the common case, one engine call); the state after the token accepts (nothing more is needed);
        a pooled witness completes it; and only then a search from the state after the token, bounded by
        :attr:`left` (and by :data:`STEP_MS`). The search runs wherever the cheaper proofs fail, also where the
        budget binds: refusing a token without it would veto answers that fit (issue 46). With an oracle every
        proof must also be an answer it accepts.

        Every proof checks the token itself, so True only for a token the grammar allows; a token it does not
        allow gets None, with no effect (not counted, not searched: the step's first choice is still to come),
        so the veto may be asked before the grammar and answers its check too (``Veto.proves``). One method, not
        a check and a counter around it: it is asked at every step of a closing row."""
        left, eos, oracle = self.left, self._eos, self.oracle
        if token in self.eos_ids:
            if not self.matcher.accepting:
                return None  # not the grammar's
            return self._judged(self._valid(b"", []))
        w = self.witness if self._known else self.current()
        if w is not None and len(w) <= left + 1:
            if w and token == w[0]:
                self._after[token] = w[1:]
                self._first = False
                return True
            if (len(w) <= left and self._ll.validate_tokens([token, *w, eos]) == len(w) + 2
                    and (oracle is None or self._valid(self._decode([token]), w))):
                self._after[token] = w  # the witness replayed after the token
                self._first = False
                return True
        ll = self._ll
        held = int(ll.validate_tokens([token, eos]))  # fits([token], []), and whether the grammar allows token
        if not held:  # not a token the grammar allows: no proof to look for, no effect
            return None
        if held == 2 and self._valid(self._decode([token]) if oracle is not None else b"", []):
            self._after[token] = []  # an accepting state needs nothing more
            return self._judged(True)
        if left <= 0:  # the state after the token does not accept and no token is left (no witness is that short)
            self.refused += 1
            return self._judged(False)
        pooled = self._pooled([token], left, skip=w)
        if pooled is not None:
            self._after[token] = pooled
            return self._judged(True)
        child = ll.deep_copy()
        if not child.consume_token(token):
            return self._judged(False)
        found = self._search(child, left, self._decode([token]))
        ok = found is not None and len(found) <= left
        self._after[token] = found if ok else None
        self.refused += int(not ok)
        return self._judged(ok)

    def _judged(self, ok: bool) -> bool:
        """:meth:`vet`'s answer ``ok`` for a token the grammar allows (a refused first choice counts in
        :attr:`changed`)."""
        first, self._first = self._first, False
        self.changed += int(first and not ok)
        return ok

    def witness_after(self, token: int) -> list[int] | None:
        """The completion :meth:`vet` proved after ``token`` (None when it refused it or was not asked): the key
        guard (constraints/jsonkeys.py) refuses a token whose completion would repeat a key."""
        return self._after.get(token)

    def advance(self, token: int) -> None:
        """The policy consumed ``token``: its witness (if :meth:`vet` computed one) becomes the current one."""
        self._pending.append(token)
        w = self.witness
        if self._known and w and token == w[0]:
            self._after.setdefault(token, w[1:])  # the witness goes on after its own first token (as fallback() says)
        if token in self._after:
            self.witness, self._known = self._after[token], True
            if self.witness is None:
                self._known = False
        else:
            self._known = False
        self._after.clear()
