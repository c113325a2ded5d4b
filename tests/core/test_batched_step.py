"""The batched step's pieces against brute force (issue 18): the greedy batch (shared argmax, the allowed-top
shortcut, the masked fallback) chooses what the per-row choice does, ties included; llguidance's bitmask unpacks
and counts as bit-by-bit reading says; masks computed for a batch at once equal each matcher's own mask."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import formtax.constraints.compile as compile_mod
from formtax.backends.fake import FakeBackend, random_logits
from formtax.constraints import compile_grammar, parse_spec
from formtax.constraints.compile import fill_masks
from formtax.decoding.devicestep import pack_bool
from formtax.decoding.plan import Plan
from formtax.decoding.sampling import as_sampling
from formtax.decoding.step import choose as _choose
from formtax.decoding.step import greedy_batch as _greedy_batch
from formtax.tensorops import argmax, argmax_rows, bitmask_counts, count_true, ids_from_words, unpack_bitmask

V = 37


@st.composite
def batches(draw: st.DrawFn) -> tuple[torch.Tensor, list[tuple[int, Plan]]]:
    b = draw(st.integers(1, 6))
    # few distinct values: ties everywhere, the case where "first maximal index" matters
    values = draw(st.lists(st.integers(-3, 3), min_size=b * V, max_size=b * V))
    # bfloat16 is off numpy's path: those batches take the stacked torch fallback a device takes
    dtype = draw(st.sampled_from([torch.float32, torch.bfloat16]))
    logits = torch.tensor(values, dtype=dtype).reshape(b, V)
    plans = []
    for pos in range(b):
        kind = draw(st.sampled_from(["free", "allowed", "banned", "both", "scores", "one"]))
        allowed = None
        if kind in ("allowed", "both", "scores"):
            allowed = torch.tensor(draw(st.lists(st.booleans(), min_size=V, max_size=V)))
            allowed[draw(st.integers(0, V - 1))] = True  # never empty
        if kind == "one":
            allowed = torch.zeros(V, dtype=torch.bool)
            allowed[draw(st.integers(0, V - 1))] = True
        banned = draw(st.lists(st.integers(0, V - 1), max_size=4, unique=True)) if kind in ("banned", "both") else []
        scores = logits[pos].flip(0).clone() if kind == "scores" else None
        if allowed is not None and draw(st.booleans()):  # the set as the engine hands it over: packed words
            plans.append((pos, Plan(words=pack_bool(allowed, (V + 31) // 32), width=V, banned=banned, scores=scores)))
            continue
        plans.append((pos, Plan(allowed=allowed, banned=banned, scores=scores)))
    return logits, plans


@settings(max_examples=300, deadline=None)
@given(batches())
def test_greedy_batch_chooses_as_each_row_alone(case: tuple[torch.Tensor, list[tuple[int, Plan]]]) -> None:
    logits, plans = case
    greedy = as_sampling(0.0)
    got = _greedy_batch(logits, plans, lambda: argmax_rows(logits))
    for (pos, plan), (token, masked, forced) in zip(plans, got, strict=True):
        if plan.allowed is not None and plan.banned and not bool(plan.allowed.clone().index_fill_(
                0, torch.tensor(plan.banned), False).any()):
            continue  # everything masked: no token is defined (the loop's policies never plan this)
        base = plan.scores if plan.scores is not None else logits[pos]
        want = _choose(base, plan, greedy, None)
        assert (token, masked, forced) == want
        assert forced == (plan.allowed is not None and int(plan.allowed.sum()) == 1)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 4), st.integers(0, 40), st.randoms(use_true_random=False))
def test_a_packed_plan_reads_as_its_unpacked_set(n_words: int, extra: int, rnd) -> None:  # type: ignore[no-untyped-def]
    """A plan handed llguidance's words (no bit past the vocabulary) holds, counts and unpacks its set bit by bit;
    ``only`` names a set of one from any token it holds; a new ``allowed`` drops the words."""
    bits = [rnd.random() < rnd.choice([0.02, 0.5]) for _ in range(32 * n_words)]
    words = np.packbits(np.array(bits, dtype=np.uint8), bitorder="little").view(np.int32)
    width = 32 * n_words + extra  # logits at least as wide as the words (the padding is never allowed)
    plan = Plan(words=words.copy(), width=width)
    want = [*bits, *([False] * extra)]
    assert plan.has_mask and all(plan.holds(t) == want[t] for t in range(width))
    assert plan.allowed_count() == sum(want)
    for t in (t for t in range(width) if want[t]):
        assert Plan(words=words.copy(), width=width).only(t) == (sum(want) == 1)
    assert Plan(words=words.copy(), width=width).only(-1) == (sum(want) == 1)
    assert plan.allowed is not None and plan.allowed.tolist() == want
    plan.allowed = torch.ones(width, dtype=torch.bool)
    assert plan.packed_words() is None and plan.allowed_count() == width


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 130), st.integers(1, 5), st.integers(-40, 40), st.randoms(use_true_random=False))
def test_bitmask_unpacks_and_counts_bit_by_bit(vocab: int, rows: int, dn: int, rnd) -> None:  # type: ignore[no-untyped-def]
    n = max(1, vocab + dn)
    words = torch.tensor([[rnd.randint(-2**31, 2**31 - 1) for _ in range((vocab + 31) // 32)] for _ in range(rows)],
                         dtype=torch.int32)
    want = [[t < vocab and bool((int(words[r, t // 32]) >> (t % 32)) & 1) for t in range(n)] for r in range(rows)]
    assert unpack_bitmask(words, n, vocab).tolist() == want
    assert bitmask_counts(words, n, vocab) == [sum(w) for w in want]
    assert unpack_bitmask(words[0], n, vocab).tolist() == want[0]
    for r in range(rows):  # the ids of a packed set, only its nonzero words unpacked
        bits = [bool((int(words[r, t // 32]) >> (t % 32)) & 1) for t in range(32 * words.shape[1])]
        assert ids_from_words(words[r].numpy(), n).tolist() == [t for t, on in enumerate(bits) if on and t < n]


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 100), st.integers(-64, 64), st.sampled_from([0.0, 0.02, 0.2, 1.0]),
       st.randoms(use_true_random=False))
def test_ids_of_sparse_and_dense_packed_sets(n_words: int, dn: int, density: float, rnd) -> None:  # type: ignore[no-untyped-def]
    """Every path of ids_from_words (a few nonzero pairs bit by bit, some unpacked, all unpacked; an odd count
    of words; a strided array) against the bits read one by one."""
    words = np.array([rnd.randint(-2**31, 2**31 - 1) if rnd.random() < density else 0 for _ in range(n_words)],
                     dtype=np.int32)
    if density == 0.0 and rnd.random() < 0.7:  # a forced state: one or two bits
        for _ in range(rnd.randint(1, 2)):
            t = rnd.randrange(32 * n_words)
            words[t // 32] |= np.int32(np.uint32(1 << (t % 32)).view(np.int32))
    width = max(1, 32 * n_words + dn)
    want = [t for t in range(min(width, 32 * n_words)) if (int(words[t // 32]) >> (t % 32)) & 1]
    assert ids_from_words(words, width).tolist() == want
    strided = np.zeros(2 * n_words, dtype=np.int32)[::2]
    strided[:] = words
    assert ids_from_words(strided, width).tolist() == want


def test_host_reductions_equal_torchs() -> None:
    x = torch.tensor([[1.0, 3.0, 3.0, -1.0], [float("-inf")] * 4, [0.0, 0.0, 2.0, 2.0]])
    assert argmax_rows(x) == x.argmax(dim=-1).tolist() == [1, 0, 2]
    assert argmax(x[2]) == 2
    assert argmax_rows(x.to(torch.bfloat16)) == [1, 0, 2]  # torch's own path where numpy cannot read the dtype
    assert count_true(torch.tensor([True, False, True])) == 2


@pytest.mark.parametrize("pool", [True, False])  # llguidance's thread pool, or row by row in this thread
def test_masks_filled_for_a_batch_equal_each_matchers_own(pool: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compile_mod, "_PARALLEL", pool)
    tok = FakeBackend(random_logits(seed=0)).tokenizer
    grammar = parse_spec('json:{"type":"object","properties":{"n":{"type":"integer"}},"required":["n"]}').grammar
    c = compile_grammar(grammar, tok.engine)
    ms = [c.matcher(tok.n_logits) for _ in range(4)]
    paths = [tok.hf.encode(t, add_special_tokens=False) for t in ('{"n": 1', '{"n":', '{', '')]
    for m, path in zip(ms, paths, strict=True):
        assert m.consume_many(path)
    alone = [c.matcher(tok.n_logits) for _ in range(4)]
    for m, path in zip(alone, paths, strict=True):
        assert m.consume_many(path)
    fill_masks(ms)
    for m, ref in zip(ms, alone, strict=True):
        got = m.allowed_words()
        assert np.array_equal(got, ref.allowed_words())
        assert torch.equal(m.allowed_mask(), ref.allowed_mask())
        assert m.allowed_empty() is ref.allowed_empty() is False
        assert int(np.bitwise_count(got.view(np.uint32)).sum()) == int(ref.allowed_mask().sum())
    two = tok.hf.encode("2", add_special_tokens=False)[0]
    before = ms[0].allowed_words()
    assert ms[0].consume(two) and alone[0].consume(two)
    after = ms[0].allowed_words()  # a new state: the prepared words no longer apply
    assert after is not before
    assert np.array_equal(after, alone[0].allowed_words())
    assert torch.equal(ms[0].allowed_mask(), alone[0].allowed_mask())
