"""Row reductions the decode step runs on every row of every step, on the host's fastest path (a leaf module: it
imports nothing of formtax, so the constraints and the loop both use it).

Ours, and why: on CPU, torch's reductions over one vocabulary row (``argmax``, ``any``, ``sum`` of a bool mask)
cost 4-5x numpy's vectorised ones at these sizes (measured here: argmax of 64 x 49k float32 rows, 66 us per row
in torch, 13 us in numpy; ``any`` of a 49k bool row 68 us vs 4 us), and the results are the same values (argmax
returns the first maximal index in both). So a CPU tensor is read through a zero-copy numpy view, and any other
device stays with torch (one transfer per call). Nothing here changes what is chosen.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence

import numpy as np
import torch

_NUMPY_DTYPES = (torch.float32, torch.float64, torch.float16)
_HOST_DTYPES = frozenset((*_NUMPY_DTYPES, torch.bool))


def _numpy(x: torch.Tensor) -> np.ndarray | None:
    """A zero-copy numpy view of a CPU tensor numpy can read, else None."""
    if not x.is_cpu or x.requires_grad or x.dtype not in _HOST_DTYPES:  # (is_cpu: a fifth of device.type's cost)
        return None
    return x.numpy()


def argmax_rows(x: torch.Tensor) -> list[int]:
    """The argmax of each row of ``x`` [B, V] (the first maximal index, as ``torch.argmax``), on the host."""
    a = _numpy(x)
    if a is None:
        return [int(t) for t in x.argmax(dim=-1).tolist()]
    return [int(t) for t in a.argmax(axis=-1).tolist()]


def holds(mask: torch.Tensor, token: int) -> bool:
    """Whether the bool mask [V] holds ``token`` (read through numpy on the host: indexing a tensor is not free)."""
    a = _numpy(mask)
    return bool(mask[token]) if a is None else bool(a[token])


def argmax(x: torch.Tensor) -> int:
    """The argmax of one row [V] (the first maximal index, as ``torch.argmax``)."""
    a = _numpy(x)
    return int(x.argmax().item()) if a is None else int(a.argmax())


SPARSE_PAIRS = 2
"""A packed set with at most this many nonzero pairs of words is unpacked bit by bit in Python
(:func:`ids_from_words`)."""


def ids_from_words(words: np.ndarray, width: int) -> np.ndarray:
    """The ids a packed set holds (llguidance's int32 words: bit ``j`` of word ``w`` = id ``32 w + j``), ascending,
    below ``width``. Only the nonzero words are unpacked: a grammar state that allows a few tokens costs a scan of
    its words, not an unpacking of the whole vocabulary. The scan reads the words in pairs (as 64-bit words: half
    numpy's work), and a forced state's few nonzero pairs are unpacked bit by bit, in less time than numpy's
    calls take (little-endian words, as the engine writes them, like the bytes :func:`unpack_bitmask` reads)."""
    w = np.ascontiguousarray(words)
    if w.size % 2:
        w = np.concatenate([w, np.zeros(1, dtype=w.dtype)])
    pairs = w.view(np.uint64)
    nz = pairs.nonzero()[0]
    if nz.size == 0:
        return nz
    if nz.size <= SPARSE_PAIRS:
        out: list[int] = []
        for k in nz.tolist():
            bits, base = pairs.item(k), 64 * k
            while bits:
                low = bits & -bits
                token = base + low.bit_length() - 1
                if token >= width:
                    break
                out.append(token)
                bits ^= low
        return np.array(out, dtype=nz.dtype)
    if 8 * nz.size > pairs.size:  # a dense set: unpacking every word costs less than picking them out
        ids = np.flatnonzero(np.unpackbits(pairs.view(np.uint8), bitorder="little"))
    else:
        bits_ = np.unpackbits(pairs[nz].view(np.uint8), bitorder="little").reshape(nz.size, 64)
        row, col = np.nonzero(bits_)
        ids = nz[row] * 64 + col
    return ids[ids < width] if ids[-1] >= width else ids


def word_of(words: np.ndarray, width: int, token: int) -> int:
    """The packed word (as an unsigned int) that holds ``token``'s bit when the set ``words`` (``width`` tokens
    wide) holds ``token``, else 0: one read of the words, nothing unpacked (``Plan.holds``, the host's step of a
    grammar row, :func:`ranked_in_words`)."""
    if not 0 <= token < min(width, 32 * words.size):
        return 0
    word = int(words.item(token >> 5)) & 0xFFFFFFFF
    return word if (word >> (token & 31)) & 1 else 0


def masked_argmax(x: torch.Tensor, allowed: torch.Tensor | None, banned: Sequence[int],
                  ids: np.ndarray | None = None) -> int | None:
    """The first maximal index of ``x`` [V] among the tokens ``allowed`` holds (or the ascending ``ids``, when the
    caller has them: ``allowed`` is then not read) and ``banned`` does not, read on the host without copying the
    row (the allowed ids are gathered, then their values); None when the tensors are not on the host's fast path
    (the caller masks with torch) or nothing is left to choose."""
    xa = _numpy(x)
    aa = None if allowed is None or ids is not None else _numpy(allowed)
    if xa is None or (ids is None and allowed is not None and aa is None):
        return None
    if ids is None and aa is None:  # banned only: the row less its banned ids
        c = xa.copy()
        c[np.asarray(banned, dtype=np.int64)] = -np.inf
        return int(c.argmax()) if len(banned) < c.shape[0] else None
    if ids is None:
        assert aa is not None
        ids = np.flatnonzero(aa)
    if ids.size == 0:
        return None
    vals = xa[ids]  # a copy (fancy indexing)
    if banned:  # a few ids: found in the sorted allowed ids, not by a set operation over all of them
        b = np.asarray(banned, dtype=ids.dtype)
        at = np.searchsorted(ids, b)
        hit = at < ids.size
        hit[hit] = ids[at[hit]] == b[hit]
        out = at[hit]
        vals[out] = -np.inf
        k = int(vals.argmax())
        if k in set(out.tolist()):  # everything left is -inf too: the first of them, as without the banned ids
            keep = np.ones(ids.size, dtype=bool)
            keep[out] = False
            if not keep.any():
                return None
            return int(ids[keep][int(xa[ids[keep]].argmax())])
        return int(ids[k])
    return int(ids[int(vals.argmax())])


def ranked_masked(x: torch.Tensor, allowed: torch.Tensor | None, banned: Sequence[int], k: int,
                  ids: np.ndarray | None = None) -> list[int] | None:
    """The ``k`` tokens the host's masked argmax would choose one after another, each time with the ones before it
    banned too: the allowed, unbanned ids by value, highest first, ties by the lower index; 0 once none with a
    finite value is left (the re-choice is then an argmax over a row of ``-inf``); NaN entries first, the lowest
    index first (argmax takes a NaN first). One gather and one partial sort instead of ``k`` argmaxes; None off the
    host's fast path. ``ids``: the allowed ids, ascending, when the caller has them (``allowed`` is then not read)."""
    xa = _numpy(x)
    aa = None if allowed is None or ids is not None else _numpy(allowed)
    if xa is None or (ids is None and allowed is not None and aa is None) or k <= 0:
        return None
    if ids is None:
        ids = np.flatnonzero(aa) if aa is not None else np.arange(xa.shape[0])
    if banned and ids.size:
        b = np.asarray(banned, dtype=ids.dtype)
        at = np.searchsorted(ids, b)
        hit = at < ids.size
        hit[hit] = ids[at[hit]] == b[hit]
        keep = np.ones(ids.size, dtype=bool)
        keep[at[hit]] = False
        ids = ids[keep]
    vals = xa[ids]
    nan = np.isnan(vals)
    lead: list[int] = []
    if nan.any():  # argmax picks a NaN first, the lowest index first: those lead, the rest follow by value
        lead = ids[nan][:k].tolist()
        ids, vals, k = ids[~nan], vals[~nan], k - len(lead)
        if k == 0:
            return lead
    if ids.size > k:  # every id at least as high as the k-th highest value, ties included
        kth = np.partition(vals, ids.size - k)[ids.size - k]
        sel = vals >= kth
        ids, vals = ids[sel], vals[sel]
    order = np.lexsort((ids, -vals.astype(np.float64)))[:k]
    out = [0 if v == -np.inf else int(t) for t, v in zip(ids[order], vals[order], strict=True)]
    return lead + out + [0] * (k - len(out))


DENSE_SPARE = 16
"""How many refused picks :func:`ranked_held` makes before it hands the set to :func:`ranked_masked`."""


def ranked_in_words(x: torch.Tensor, words: np.ndarray, width: int, banned: Sequence[int], k: int
                    ) -> list[int] | None:
    """:func:`ranked_masked` for a set packed in llguidance's words (``width`` tokens wide): :func:`ranked_held`
    with the words' bits as its test."""
    return ranked_held(x, lambda j: word_of(words, width, j) != 0, banned, k)


def ranked_held(x: torch.Tensor, holds: Callable[[int], bool], banned: Sequence[int], k: int) -> list[int] | None:
    """:func:`ranked_masked` for a set known by its test ``holds(token)`` (the bit of its packed words, or a grammar
    engine's check of one token where that is the mask's bit: no mask computed), found the way the loop would
    choose again and again: the argmax of a copy of the row, taken out after each pick, kept when the set holds it.
    Ours, and why: a veto's re-choices come where a grammar allows most of the vocabulary (closing at a string's
    last tokens), where unpacking the set's ids and sorting their values costs ten times the few argmaxes. None
    off the host's fast path, or after :data:`DENSE_SPARE` picks the set did not hold (a sparse set:
    :func:`ranked_masked` over its ids is then cheaper)."""
    if k <= 0:
        return None
    out: list[int] = []
    for j, _ in answered_picks(x, lambda t: True if holds(t) else None, banned, k + len(banned) + 1) or ():
        if j < 0:  # nothing finite left: the re-choice is an argmax over -inf, the first index
            return out + [0] * (k - len(out))
        out.append(j)
        if len(out) == k:
            return out
    return None


def answered_picks(x: torch.Tensor, answer: Callable[[int], object], banned: Sequence[int], need: int
                   ) -> Iterator[tuple[int, object]] | None:
    """The picks repeated argmax makes over the row ``x`` (``banned`` ids left out, best first, ties by the lower
    index) that ``answer`` answers (not None), each with its answer: the walk of a veto's re-choices, whose test is
    a set's membership (:func:`ranked_held`) or a proving veto itself (decoding/step.rejudged). It ends after
    :data:`DENSE_SPARE` picks answered None (a sparse set: the caller ranks by the mask), and yields ``(-1, None)``
    once nothing finite is left. ``need`` picks answered are enough for the caller. None off the host's fast
    path."""
    xa = _numpy(x)
    return None if xa is None else _answered(xa, answer, banned, need)


def _answered(xa: np.ndarray, answer: Callable[[int], object], banned: Sequence[int], need: int
              ) -> Iterator[tuple[int, object]]:
    misses = 0
    for j in _picks(xa, banned, need + DENSE_SPARE):
        if j < 0:
            yield -1, None
            return
        got = answer(j)
        if got is None:
            misses += 1
            if misses > DENSE_SPARE:
                return
        else:
            yield j, got


def _picks(xa: np.ndarray, banned: Sequence[int], need: int) -> Iterator[int]:
    """Repeated argmax's picks over the row, banned ids left out, for :func:`answered_picks`: its first ``need``
    from :func:`_leading` where it answers (no copy of the row), else one argmax at a time; -1 once nothing finite
    is left."""
    order = _leading(xa, need)
    if order is not None:
        ban = set(banned)
        yield from (j for j in order[:need].tolist() if j not in ban)  # (need counts the banned ones too)
        return
    row = xa.copy()
    if banned:
        row[np.asarray(banned, dtype=np.int64)] = -np.inf
    while True:
        j = int(row.argmax())
        if row[j] == -np.inf:
            yield -1
            return
        row[j] = -np.inf
        yield j


RANK_STRIDE = 64
"""The stride of the sample :func:`_leading` takes its threshold from."""


def _leading(xa: np.ndarray, need: int) -> np.ndarray | None:
    """The first picks of repeated argmax over the row ``xa`` (value descending, the first index first among
    equal values), at least ``need`` of them: every index whose value lies above a threshold, sorted. The
    threshold is the ``3 + need // RANK_STRIDE``-th highest value of a strided sample of the row (about
    ``RANK_STRIDE`` times that many values lie above it); every value outside lies at or below it, so the order
    of those above it is the order repeated argmax starts with. None where fewer than ``need`` lie above it or a
    NaN is among them (argmax picks a NaN first): the caller picks one by one. Ours, and why: seven re-choices by
    argmax cost seven reads of the row (about 47 us at 49k), this costs one compare. (The sample is sorted, not
    partitioned: a few hundred values sort faster than numpy selects among them.)"""
    sample = xa[::RANK_STRIDE]
    m = 3 + need // RANK_STRIDE
    if sample.shape[0] < 4 * m:
        return None
    thr = np.sort(sample)[sample.shape[0] - m]
    above = np.less_equal(xa, thr)
    np.logical_not(above, out=above)  # (NaN compares false: it lands here, and is refused below)
    cand = np.flatnonzero(above)
    if cand.size < need:
        return None
    vals = xa[cand]
    if math.isnan(vals.sum()):  # a NaN among them (no -inf lies above a threshold: no inf - inf makes one)
        return None
    return cand[np.argsort(-vals, kind="stable")]


def count_true(mask: torch.Tensor) -> int:
    """How many entries of a bool mask are True."""
    a = _numpy(mask)
    return int(mask.sum().item()) if a is None else int(np.count_nonzero(a))


def any_true(mask: torch.Tensor) -> bool:
    """Whether any entry of a bool mask is True."""
    a = _numpy(mask)
    return bool(mask.any().item()) if a is None else bool(a.any())


def _words(words: torch.Tensor | np.ndarray) -> np.ndarray:
    return words if isinstance(words, np.ndarray) else words.numpy()


def bitmask_counts(words: torch.Tensor | np.ndarray, n: int, vocab_size: int) -> list[int]:
    """How many tokens each row [B, W] of a bitmask allows among the first ``min(n, vocab_size)`` (a popcount of
    the words, less any bits set past that point)."""
    w = _words(words).view(np.uint32)
    counts = np.bitwise_count(w).sum(axis=-1, dtype=np.int64)
    cut = min(n, vocab_size)
    if cut < 32 * w.shape[-1]:
        tail = np.unpackbits(w[..., cut // 32:].view(np.uint8), axis=-1, bitorder="little")[..., cut % 32:]
        counts = counts - np.count_nonzero(tail, axis=-1)
    return [int(c) for c in np.atleast_1d(counts).tolist()]


def unpack_bitmask(words: torch.Tensor | np.ndarray, n: int, vocab_size: int) -> torch.Tensor:
    """llguidance's allowed-token bitmask (int32 words, bit ``j`` of word ``w`` = token ``32 w + j``; one row
    [W] or a batch [B, W]) over ``vocab_size`` tokens as a fresh bool tensor [n] or [B, n]: False past the
    vocabulary (the last word's spare bits, and logits the tokenizer does not name). One vectorised call for
    the whole batch."""
    bits = np.unpackbits(_words(words).view(np.uint8), axis=-1, bitorder="little")  # little-endian words: bytes in bit order
    if bits.shape[-1] == n <= vocab_size:  # the common case (n a multiple of 32): nothing to cut or pad
        return torch.from_numpy(bits).view(torch.bool)
    bits = bits[..., : min(n, vocab_size)]
    if n > bits.shape[-1]:
        pad = np.zeros((*bits.shape[:-1], n - bits.shape[-1]), dtype=np.uint8)
        bits = np.concatenate([bits, pad], axis=-1)
    return torch.from_numpy(np.ascontiguousarray(bits)).view(torch.bool)
