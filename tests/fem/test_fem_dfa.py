"""The flexible-trie token DFA against an independent oracle and the grammar engine.

The equivalence, stated precisely (the module docstring of ``formtax.fem.dfa``): a token string is accepted iff its
bytes can be cut into [piece 0][slot 1][piece 1]...[slot k][piece k] where each piece's bytes fullmatch the piece
regex (piece 0 with the free prefix and optional space, the last with the free suffix), each slot's bytes are a
valid slot value (``Slot.accepts``), and each slot's tokens (a whole number of tokens, the first of which may also
carry the whitespace that ends the phrase before it) number between the slot's lower and upper token bound. The oracle below enumerates those cuts with Python's ``re``; the engine check runs llguidance
on the text (with the byte tokenizer, where token bounds are byte bounds, the two languages coincide exactly).
"""

from __future__ import annotations

import itertools
import random
import re
import zlib

import numpy as np
import pytest

from formtax.constraints.compile import validate_with_engine
from formtax.constraints.template import Slot, parse_template
from formtax.fem.automata import compile_bytes, int_range, minimize
from formtax.fem.dfa import FormatSpec, TokenVocab, build_token_dfa, vocab_for

BYTE_VOCAB = TokenVocab.from_bytes([bytes([i]) for i in range(256)] + [b""] * 4, {256, 257, 258, 259}, (256,))


def piece_regexes(spec: FormatSpec) -> list[bytes]:
    phrases = spec.phrases()
    out = [re.escape(p.encode()) for p in phrases]
    pre = {"none": b"", "line": rb"(?:.*\n)?", "any": rb".*"}[spec.prefix]
    sp = b" ?" if spec.leading_space and not phrases[0][:1].isspace() else b""
    out[0] = pre + sp + out[0]
    if spec.suffix == "any":
        out[-1] = out[-1] + rb".*"
    return out


def oracle(spec: FormatSpec, vocab: TokenVocab, tokens: list[int]) -> bool:
    """Exists a cut of ``tokens`` satisfying the module docstring's definition (brute force over slot spans)."""
    if any(vocab.special[t] for t in tokens):
        return False
    slots = spec.template.slots
    bounds = spec.bounds()
    pieces = piece_regexes(spec)
    n = len(tokens)

    phrases = spec.phrases()

    def search(j: int, pos: int) -> bool:
        """Slots j.. remain; piece j starts at token ``pos``."""
        if j == len(slots):
            return re.fullmatch(pieces[j], vocab.text(tokens[pos:]), re.DOTALL) is not None
        ws = phrases[j][-1:].encode() if phrases[j][-1:] in (" ", "\n") else b""
        for a in range(pos, n):
            head = vocab.text(tokens[pos:a])
            # the slot's tokens start at a; the phrase's final whitespace may be the first byte of token a
            cuts = [(head, b"")] + ([(head + ws, ws)] if ws else [])
            for piece_text, lead in cuts:
                if re.fullmatch(pieces[j], piece_text, re.DOTALL) is None:
                    continue
                lo, hi = bounds[j]
                for b in range(a + lo, min(n, a + hi) + 1):
                    text = vocab.text(tokens[a:b])
                    if not text.startswith(lead):
                        continue
                    try:
                        value = text[len(lead) :].decode()
                    except UnicodeDecodeError:
                        continue
                    if slots[j].accepts(value) and search(j + 1, b):
                        return True
        return False

    return search(0, 0)


def engine_regex(spec: FormatSpec) -> str:
    """The same language as a regex for llguidance when every token is one byte (token bounds = byte bounds)."""

    def esc(s: str) -> str:
        return "".join("\\" + c if c in "\\.+*?()|[]{}^$#&-~" else c for c in s)

    def slot_rx(slot: Slot, lo: int, hi: int, ws: bool) -> str:
        if slot.kind == "int":
            assert slot.lo is None and slot.hi is None
            return "(-?(0|[1-9][0-9]{0,%d}))" % min(17, hi - 2)  # "-0" is 0, as Slot.accepts reads it
        if slot.kind == "letters":
            return "([A-Za-z]{%d,%d})" % (max(lo, slot.n or 1), min(hi, slot.n or 64))
        if slot.kind == "choice":  # token bounds = byte bounds; a boundary space may count as the slot's first token
            fits = [o for o in slot.options if lo <= len(o.encode()) <= hi or (ws and lo <= len(o.encode()) + 1 <= hi)]
            return "(" + "|".join(esc(o) for o in fits) + ")"
        return "([^\\n\\r]{%d,%d})" % (lo, hi)

    phrases = spec.phrases()
    pre = {"none": "", "line": "(?s:.*\\n)?", "any": "(?s:.*)"}[spec.prefix]
    out = [pre, " ?" if spec.leading_space and not phrases[0][:1].isspace() else ""]
    for k, (slot, (lo, hi)) in enumerate(zip(spec.template.slots, spec.bounds(), strict=True)):
        out += [esc(phrases[k]), slot_rx(slot, lo, hi, phrases[k][-1:] in (" ", "\n"))]
    out += [esc(phrases[-1]), "(?s:.*)" if spec.suffix == "any" else ""]
    return "".join(out)


SPECS = [
    FormatSpec(parse_template("The answer is: {int}"), prefix="line"),
    FormatSpec(parse_template("The final answer is {int}"), prefix="any", suffix="any"),
    FormatSpec(parse_template("Rating: {str}"), prefix="line", slot_tokens=((1, 5),)),
    FormatSpec(parse_template("The {letters} is {choice:ab|b|abc}!"), prefix="none", leading_space=False),
    FormatSpec(parse_template("{choice:yes|no}"), prefix="none"),
    # a repeated choice slot (compiled once) with token bounds that bind, and with the default bounds, where the
    # builder stores counts that can no longer bind as the lower bound
    FormatSpec(parse_template("The x is {choice:ab|b|abc}\nThe y is {choice:ab|b|abc}"), prefix="line",
               slot_tokens=((1, 2), (2, 3))),
    FormatSpec(parse_template("A {choice:ab|b|abc}\nB {choice:ab|b|abc}."), prefix="line"),
]


VALUES = {
    "int": ["0", "7", "42", "-3", "1234", "007", "-0", "4 2", "x"],
    "letters": ["ab", "abc", "b", "zzzzzz", "aB", "a1"],
    "choice": ["ab", "b", "abc", "yes", "no", "c", "yesno"],
    "str": ["good", "very good indeed", "x", "two\nlines", ""],
}


def _random_text(rng: random.Random, spec: FormatSpec) -> str:
    """Hits and near-misses: the template with valid and invalid slot values, text around it, one-char edits."""
    parts: list[str] = []
    if rng.random() < 0.5:
        parts.append(rng.choice(["So 3 + 4 = 7.", "x", "The answer is: 5", "é", ""]) + rng.choice(["\n", " ", ""]))
    if rng.random() < 0.2:
        parts.append(" ")
    phrases = spec.phrases()
    for k, slot in enumerate(spec.template.slots):
        parts += [phrases[k], rng.choice(VALUES[slot.kind])]
    parts.append(phrases[-1])
    if rng.random() < 0.3:
        parts.append(rng.choice([" more", "\nmore", ".", "!"]))
    text = "".join(parts)
    if text and rng.random() < 0.3:
        i = rng.randrange(len(text))
        text = text[:i] + rng.choice(["", "q", " ", "\n", text[i] * 2]) + text[i + 1 :]
    return text


@pytest.mark.parametrize("spec", SPECS, ids=[s.template.source for s in SPECS])
def test_byte_vocab_dfa_equals_oracle_and_engine(spec: FormatSpec) -> None:
    dfa = build_token_dfa(spec, BYTE_VOCAB)
    rx = engine_regex(spec)
    import llguidance

    grammar = llguidance.grammar_from("regex", rx)
    rng = random.Random(zlib.crc32(spec.template.source.encode()))
    n_acc = 0
    for _ in range(400):
        text = _random_text(rng, spec)
        toks = list(text.encode())
        got = dfa.accepts(toks)
        assert got == oracle(spec, BYTE_VOCAB, toks), text
        assert got == validate_with_engine(grammar, text)[0], text
        n_acc += got
    assert 10 < n_acc < 390  # the sample exercises both sides


def test_special_tokens_lead_to_the_dead_sink_and_the_function_is_total() -> None:
    dfa = build_token_dfa(SPECS[0], BYTE_VOCAB)
    assert dfa.delta.min() >= 0 and dfa.delta.max() < dfa.n_states
    assert (dfa.delta[dfa.dead] == dfa.dead).all() and not dfa.accepting[dfa.dead]
    for s in range(dfa.n_states):
        for t in (256, 257, 258, 259):
            assert dfa.step(s, t) == dfa.dead


def test_dfa_is_minimal_and_distances_are_shortest_paths() -> None:
    for spec in SPECS:
        dfa = build_token_dfa(spec, BYTE_VOCAB)
        table, _, _ = minimize(dfa.delta, dfa.accepting, dfa.start)
        assert table.shape[0] == dfa.n_states  # minimising again merges nothing
        # BFS over tokens from the start: the first accepted length equals dist[start]
        frontier, depth = {dfa.start}, 0
        while not any(dfa.accepting[s] for s in frontier):
            frontier = {int(dfa.delta[s, c]) for s in frontier for c in range(dfa.n_classes)} - {dfa.dead}
            depth += 1
        assert depth == dfa.dist[dfa.start]


@pytest.mark.parametrize("lo,hi", [(0, 999), (1, 5), (-15, 27), (3, 3), (-1000, -7), (95, 1203), (0, 10**15 - 1)])
def test_integer_ranges_are_exact(lo: int, hi: int) -> None:
    d = compile_bytes(int_range(lo, hi))
    slot = Slot("int", lo=lo, hi=hi)
    rng = np.random.default_rng(0)
    values = list(range(-1300, 1300)) + [int(x) for x in rng.integers(-(10**18), 10**18, 200)]
    for x in values:
        for text in (str(x), "0" + str(x), "-0", "+1", "", "-", str(x) + " "):
            expected = re.fullmatch(slot.py_regex(), text) is not None and slot.accepts(text)
            assert d.matches(text.encode()) == expected, text


def test_token_bounds_of_slots_are_counted_in_tokens() -> None:
    # two-byte tokens: "ab" may count as one token of a {letters} slot
    vocab = TokenVocab.from_bytes([b"a", b"b", b"ab", b"x", b""], {4}, (4,))
    spec = FormatSpec(parse_template("x{letters}"), prefix="none", leading_space=False, slot_tokens=((1, 2),))
    dfa = build_token_dfa(spec, vocab)
    for toks in itertools.product(range(4), repeat=4):
        seq = [3, *toks]
        assert dfa.accepts(seq) == oracle(spec, vocab, seq), seq
    assert dfa.accepts([3, 2, 2]) and not dfa.accepts([3, 0, 1, 0])  # "abab" in 2 tokens yes, "aba" in 3 no


def _utf8(data: bytes) -> bool:
    try:
        data.decode()
    except UnicodeDecodeError:
        return False
    return True


@pytest.mark.model
def test_real_tokenizer_dfa_equals_oracle(default_model) -> None:
    """SmolLM2's 49k vocabulary: canonical and random tokenisations of hits and near-misses, plus random tokens.
    The DFA is byte-level and accepts any bytes in free text; llguidance only valid UTF-8, so the engine is
    consulted on valid UTF-8 outputs."""
    _real_tokenizer_dfa_equals_oracle(default_model.tokenizer, first_ordinary=17)


@pytest.mark.model
@pytest.mark.gemma
def test_gemma_tokenizer_dfa_equals_oracle(gemma_model) -> None:
    """The same on Gemma 3's 262k SentencePiece vocabulary (``▁`` spaces, byte-fallback tokens)."""
    _real_tokenizer_dfa_equals_oracle(gemma_model.tokenizer, first_ordinary=300, specs=1)


def _real_tokenizer_dfa_equals_oracle(tok, first_ordinary: int, specs: int = 3) -> None:
    vocab = vocab_for(tok)
    rng = random.Random(0)
    import llguidance

    from formtax.constraints.compile import compile_grammar

    for spec in SPECS[:specs]:
        dfa = build_token_dfa(spec, vocab)
        grammar = compile_grammar(llguidance.grammar_from("regex", engine_regex(
            FormatSpec(spec.template, spec.prefix, spec.suffix, spec.leading_space, ((1, 64),) * len(
                spec.template.slots)))), tok.engine)
        n_acc = 0
        for _ in range(150):
            text = "So 3 + 4 = 7.\n" * rng.randint(0, 1) + _random_text(rng, spec)
            if rng.random() < 0.5:  # a random cut into pieces tokenised apart: a non-canonical tokenisation
                cut = rng.randint(0, len(text))
                ids = tok.encode(text[:cut]) + tok.encode(text[cut:])
            else:
                ids = tok.encode(text)
            if ids and rng.random() < 0.2:
                ids[rng.randrange(len(ids))] = rng.randrange(first_ordinary, tok.n_logits)
            got = dfa.accepts(ids)
            assert got == oracle(spec, vocab, ids), (text, ids)
            n_acc += got
            if got and _utf8(vocab.text(ids)):  # the engine (valid UTF-8 only) agrees on the same token string
                m = grammar.matcher(tok.n_logits)
                assert m.consume_many(ids) and m.accepting, (text, ids)
        assert n_acc > 5
