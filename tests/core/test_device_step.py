"""The decode loop's device step (issue 35): the same tokens as the host path, and a number of host-device
transfers per step that does not grow with the batch.

The device path is forced on CPU (``loop.DEVICE_STEP``). Every strategy of the golden batch runs through it and
must give exactly the host path's outputs (tokens, per-step flags, finish reasons, events; masked masses to float64
rounding). The transfer count uses a fake backend whose logits are a tensor subclass that records every host read
of them (``.item``, ``.tolist``, ``.cpu``, ``.numpy``, ``.to``, truth-testing, ``int()``): the loop may move data
only through the step's two helpers (``devicestep.to_device`` / ``to_host``), and the tokens it hands the next
forward pass count as one more copy when they come as a host list.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest
import torch

import formtax
from formtax.backends.fake import FakeBackend, FakeBatch, random_logits
from formtax.decoding import devicestep, loop

GOLDEN = json.loads((Path(__file__).parents[1] / "fixtures" / "golden_greedy_batch.json").read_text())
PROMPTS = [f"question {k}" for k in range(6)]


def _run(key: str, closing: bool, device: bool, monkeypatch: pytest.MonkeyPatch) -> list[formtax.Result]:
    seed, strategy, spec = key.split("|", 2)
    monkeypatch.setattr(loop, "DEVICE_STEP", device)
    return formtax.generate_batch(FakeBackend(random_logits(seed=int(seed))), PROMPTS, strategy,
                                  None if spec == "None" else spec, max_tokens=60, closing=closing)


def _same(a: formtax.Result, b: formtax.Result) -> None:
    assert a.token_ids == b.token_ids
    assert a.finish_reason == b.finish_reason
    assert a.text == b.text
    assert (a.masked_mass is None) == (b.masked_mass is None)
    if a.masked_mass is not None:
        assert a.masked_mass == pytest.approx(b.masked_mass, abs=1e-12)
    assert a.stats.get("events") == b.stats.get("events")


@pytest.mark.parametrize("closing", [False, True])
@pytest.mark.parametrize("key", sorted(GOLDEN))
def test_device_path_gives_the_host_paths_outputs(key, closing, monkeypatch):
    host = _run(key, closing, False, monkeypatch)
    device = _run(key, closing, True, monkeypatch)
    for a, b in zip(host, device, strict=True):
        _same(a, b)


def test_device_round_equals_the_host_choice():
    """One round over random rows, masks, bans and forced tokens against a plain host computation."""
    g = torch.Generator().manual_seed(3)
    n, vocab = 300, 290  # logits wider than the vocabulary: columns past it are never allowed by a mask
    base = torch.randn(12, n, generator=g)
    base[3, 5] = base[3, 7] = base[3].max() + 1  # a tie: the first maximal index wins
    entries, expect, masses = [], [], []
    n_words = (n + 31) // 32
    for k in range(12):
        allowed = torch.rand(n, generator=g) < 0.3
        allowed[vocab:] = False
        allowed[5] = allowed[7] = True
        kind = k % 4
        if kind == 0:  # unmasked
            entries.append(devicestep.Entry(k))
            expect.append(int(base[k].argmax()))
        elif kind == 1:  # masked, measured
            words = devicestep.pack_bool(allowed, n_words)
            entries.append(devicestep.Entry(k, words, mass_words=words))
            expect.append(int(base[k].masked_fill(~allowed, float("-inf")).argmax()))
            p = torch.softmax(base[k].double(), -1)
            masses.append((k, float(1 - p[allowed].sum())))
        elif kind == 2:  # masked less two bans, measured against the mask before the bans
            words = devicestep.pack_bool(allowed, n_words)
            banned = [int(base[k].masked_fill(~allowed, float("-inf")).argmax()), 7]
            cut = allowed.clone()
            cut[banned] = False
            entries.append(devicestep.Entry(k, devicestep.clear_bits(words, banned), mass_words=words))
            expect.append(int(base[k].masked_fill(~cut, float("-inf")).argmax()))
            p = torch.softmax(base[k].double(), -1)
            masses.append((k, float(1 - p[allowed].sum())))
        else:  # forced
            entries.append(devicestep.Entry(k, None, forced=11 + k))
            expect.append(11 + k)
    for e in entries[1::3]:
        e.ranked = 4
    r = devicestep.device_round(list(base.unbind(0)), entries, vocab)
    ids, got = r.ids, r.masses
    assert ids == expect
    for k, m in masses:
        assert got[k] == pytest.approx(m, abs=1e-12)
    assert [k for k, m in enumerate(got) if m is not None] == [k for k, _ in masses]
    for k, e in enumerate(entries):  # ranked: the host's argmax again and again, each time less the ones before
        if not e.ranked:
            assert r.ranked[k] is None
            continue
        row = base[k].clone()
        if e.words is not None:
            bits = torch.tensor([(int(e.words[t >> 5]) >> (t & 31)) & 1 for t in range(n)], dtype=torch.bool)
            bits[vocab:] = False
            row[~bits] = float("-inf")
        want = []
        for _ in range(e.ranked):
            t = int(row.argmax())
            want.append(t)
            row[t] = float("-inf")
        if e.forced < 0:
            assert r.ranked[k] == want


# -- transfers --------------------------------------------------------------------------------------------------

_READS = {"item", "tolist", "cpu", "numpy", "to", "__bool__", "__int__", "__index__", "__float__"}


class _Log:
    counting = True
    stray: list[str] = []
    steps: list[int] = [0]


class Tracked(torch.Tensor):
    """Logits as they would live on a device: every host read outside the step's helpers is recorded."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if _Log.counting and name in _READS:
            _Log.stray.append(name)
        return super().__torch_function__(func, types, args, kwargs or {})


class _Quiet:
    def __enter__(self):
        self.was, _Log.counting = _Log.counting, False

    def __exit__(self, *exc):
        _Log.counting = self.was


class TrackedBatch(FakeBatch):
    def _logits(self) -> torch.Tensor:
        with _Quiet():
            plain = super()._logits()
        _Log.steps.append(0)  # a forward pass: the transfers that follow belong to its step
        return plain.as_subclass(Tracked)

    def step(self, tokens: Sequence[int]) -> torch.Tensor:
        _Log.steps[-1] += 1  # host ids for a device model: one copy to the device
        return super().step(tokens)

    def step_device(self, tokens: torch.Tensor) -> torch.Tensor:
        with _Quiet():  # the model reads its input on the device; the fake one reads it here
            ids = [int(t) for t in tokens.tolist()]
        return super().step(ids)


class TrackedBackend(FakeBackend):
    def new_batch(self, prompts):
        return TrackedBatch(self.fn, prompts)


@pytest.fixture()
def counted(monkeypatch):
    real_dev, real_host = devicestep.to_device, devicestep.to_host

    def to_device(x, device, blocking=False):
        _Log.steps[-1] += 1
        with _Quiet():
            return real_dev(x, device, blocking)

    def to_host(x):
        _Log.steps[-1] += 1
        with _Quiet():
            return real_host(x).as_subclass(torch.Tensor)

    monkeypatch.setattr(devicestep, "to_device", to_device)
    monkeypatch.setattr(devicestep, "to_host", to_host)
    monkeypatch.setattr(loop, "to_host", to_host)
    monkeypatch.setattr(loop, "device_round", devicestep.device_round)
    _Log.stray, _Log.steps, _Log.counting = [], [0], True
    yield _Log
    _Log.counting = True


CASES = {
    "free": (None, "free"),
    "json": ('json:{"type":"object","properties":{"name":{"type":"string","maxLength":12},'
             '"age":{"type":"integer","minimum":0,"maximum":120}},"required":["name","age"]}', "constrained"),
    "inwriting": ("The answer is: {int}", "inwriting"),
}


@pytest.mark.parametrize("batch", [1, 8, 64])
@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("closing", [False, True])
def test_transfers_per_step_do_not_grow_with_the_batch(case, batch, closing, counted, monkeypatch):
    spec, strategy = CASES[case]
    monkeypatch.setattr(loop, "DEVICE_STEP", True)
    prompts = [f"question {k}" for k in range(batch)]
    rs = formtax.generate_batch(TrackedBackend(random_logits(seed=5)), prompts, strategy, spec, max_tokens=40,
                                closing=closing)
    assert counted.stray == [], f"host reads of the logits outside the step's helpers: {counted.stray[:8]}"
    steps = counted.steps[1:]  # per forward pass: the transfers of the step it feeds
    assert steps, "no step ran"
    assert max(steps) <= 3, f"transfers per step: {steps}"
    assert all(r.finish_reason for r in rs)
    if spec is not None and strategy == "constrained":
        assert all(r.parse_ok for r in rs if r.finish_reason != "length-incomplete")


# -- the host's ranked re-choices ---------------------------------------------------------------------------------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from formtax.tensorops import ranked_masked  # noqa: E402


def _repeated_argmax(x: torch.Tensor, allowed: torch.Tensor | None, banned: list[int], k: int) -> list[int]:
    """The oracle: the loop's own masked choice, made again and again with each choice banned."""
    out, gone = [], list(banned)
    for _ in range(k):
        row = x.clone()
        if allowed is not None:
            row[~allowed] = float("-inf")
        row[gone] = float("-inf")
        t = int(torch.argmax(row))  # the first maximal index; 0 over a row of -inf
        out.append(t)
        gone.append(t)
    return out


@given(seed=st.integers(0, 10_000), n=st.integers(1, 40), k=st.integers(1, 10), levels=st.integers(1, 6),
       density=st.floats(0.0, 1.0), n_banned=st.integers(0, 5), with_mask=st.booleans(), neg_inf=st.booleans(),
       nan=st.booleans())
@settings(max_examples=300, deadline=None)
def test_ranked_masked_is_the_repeated_masked_argmax(seed, n, k, levels, density, n_banned, with_mask, neg_inf,
                                                     nan):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, levels, (n,), generator=g).float()  # few levels: many ties
    if neg_inf:
        x[torch.rand(n, generator=g) < 0.3] = float("-inf")
    if nan:  # argmax takes a NaN first (the lowest index first)
        x[torch.rand(n, generator=g) < 0.2] = float("nan")
    allowed = (torch.rand(n, generator=g) < density) if with_mask else None
    banned = torch.randint(0, n, (n_banned,), generator=g).tolist()
    assert ranked_masked(x, allowed, banned, k) == _repeated_argmax(x, allowed, banned, k)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("host", [True, False])
def test_apply_entries_edits_the_batch_as_the_per_row_edits_did(dtype, host, monkeypatch):
    """Forced: -inf but the token, which gets 0; masked: -inf outside the allowed set less its bans; other rows
    untouched. On the host's numpy path and on the batched tensor path (a device's), in each dtype an engine
    hands over."""
    if not host:
        monkeypatch.setattr(devicestep, "_host_rows", lambda logits: None)
    g = torch.Generator().manual_seed(9)
    n, vocab = 70, 66
    logits = torch.randn(4, n, generator=g).to(dtype)
    want = logits.clone()
    allowed = torch.rand(n, generator=g) < 0.5
    allowed[vocab:] = False
    words = devicestep.clear_bits(devicestep.pack_bool(allowed, (n + 31) // 32), [3])
    devicestep.apply_entries(logits, [devicestep.Entry(0, forced=7), devicestep.Entry(2, words)], vocab)
    want[0] = float("-inf")
    want[0, 7] = 0.0
    cut = allowed.clone()
    cut[3] = False
    want[2, ~cut] = float("-inf")
    assert torch.equal(logits, want)


@given(seed=st.integers(0, 10_000), n=st.integers(1, 80), k=st.integers(1, 10), levels=st.integers(1, 6),
       density=st.floats(0.0, 1.0), n_banned=st.integers(0, 5), neg_inf=st.booleans(), narrow=st.integers(0, 40))
@settings(max_examples=300, deadline=None)
def test_ranked_in_words_is_the_repeated_masked_argmax(seed, n, k, levels, density, n_banned, neg_inf, narrow):
    """The packed set's ranking (repeated argmax over the row) is the oracle's where it answers; where it gives up
    (a sparse set) it says so with None. ``narrow``: the set is packed for fewer tokens than the row holds."""
    from formtax.decoding.devicestep import pack_bool
    from formtax.tensorops import ranked_in_words

    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, levels, (n,), generator=g).float()
    if neg_inf:
        x[torch.rand(n, generator=g) < 0.3] = float("-inf")
    allowed = torch.rand(n, generator=g) < density
    width = max(1, n - narrow)
    allowed[width:] = False  # the row's tail lies past the packed set: never chosen
    banned = torch.randint(0, n, (n_banned,), generator=g).tolist()
    got = ranked_in_words(x, pack_bool(allowed[:width], (width + 31) // 32), width, banned, k)
    if got is not None:
        assert got == _repeated_argmax(x, allowed, banned, k)
    if width == n and bool(allowed.all()):
        assert got is not None  # a full set never misses: it answers


@given(seed=st.integers(0, 10_000), n=st.integers(300, 6000), k=st.integers(1, 10), levels=st.sampled_from([3, 50, 0]),
       density=st.floats(0.5, 1.0), n_banned=st.integers(0, 5), special=st.sampled_from(["", "-inf", "nan"]))
@settings(max_examples=150, deadline=None)
def test_ranked_in_words_over_a_long_row_is_the_repeated_masked_argmax(seed, n, k, levels, density, n_banned,
                                                                         special):
    """Rows long enough for the threshold's sample (tensorops._leading): distinct values, many ties (few
    levels), -inf and NaN entries; the same picks as repeated argmax wherever it answers."""
    from formtax.decoding.devicestep import pack_bool
    from formtax.tensorops import ranked_in_words

    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g) if levels == 0 else torch.randint(0, levels, (n,), generator=g).float()
    if special:
        x[torch.rand(n, generator=g) < 0.2] = float(special)
    allowed = torch.rand(n, generator=g) < density
    banned = torch.topk(x.nan_to_num(nan=1e9), n_banned).indices.tolist()  # bans among the leaders
    got = ranked_in_words(x, pack_bool(allowed, (n + 31) // 32), n, banned, k)
    if got is not None:
        assert got == _repeated_argmax(x, allowed, banned, k)
    if bool(allowed.all()) and not special:
        assert got is not None
