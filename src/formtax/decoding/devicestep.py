"""The batch's greedy choice on the logits' own device: one host-to-device copy, one device-to-host copy (issue 35).

When a backend's logits live on an accelerator, reading them row by row (an ``.item()`` here, a ``.tolist()``
there) costs a synchronisation each, and a batch of 64 rows then pays 64 of them per step. The decode loop
instead gathers what its rows' plans ask for into one packed int32 buffer on the host:

====================  ====================================================================================
column                meaning
====================  ====================================================================================
0                     the row's forced token, or -1
1                     flags: 1 = a mask applies, 2 = measure the masked mass
2                     which of the stacked base rows (logits rows or a plan's own scores) the entry reads
3 ..                  the allowed set, llguidance's packed layout (bit ``j`` of word ``w`` = token ``32w+j``),
                      already less the plan's banned tokens
====================  ====================================================================================

It is copied to the device once (from pinned memory where the device is CUDA), the masks are unpacked and applied
there, every row's argmax (the first maximal index, as on the host) and the measured rows' masked mass (paper 002:
the softmax mass outside the allowed set, in float64) are computed for the whole batch, and one copy brings the
chosen ids and the masses back. The host keeps only what is truly per row: advancing matchers and policies.

Ours, and why: vLLM and SGLang apply a bitmask the same way, but inside their own engines; formtax's loop owns its
step, so the packing, the unpacking and the choice are written here (a few tensor operations). Every transfer of
the step goes through :func:`to_device` and :func:`to_host`, which is what the transfer-count test counts.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

META = 3  # columns before the mask words
FORCED, FLAGS, BASE = 0, 1, 2
HAS_MASK, MEASURE = 1, 2


def to_device(host: torch.Tensor, device: torch.device, blocking: bool = False) -> torch.Tensor:
    """The step's host-to-device copy (non-blocking from pinned memory unless ``blocking``: the caller reuses the
    buffer before anything else would have waited for the copy)."""
    return host.to(device, non_blocking=host.is_pinned() and not blocking)


def to_host(x: torch.Tensor) -> torch.Tensor:
    """The step's device-to-host copy (a synchronisation)."""
    return x.cpu()


@dataclass
class Entry:
    """One row of a device round: which base row it reads, its packed allowed set (None = unmasked), its
    forced token (or -1) and whether its masked mass is measured (against ``mass_words``: the plan's allowed set
    before its bans)."""

    base: int
    words: np.ndarray | None = None
    forced: int = -1
    mass_words: np.ndarray | None = None
    ranked: int = 0  # also return this many best allowed ids, best first (a veto's next choices)


@dataclass
class Round:
    """What a round returns: the chosen ids on the device and on the host, each entry's masked mass (None where
    not measured) and its ranked ids (None where not asked): the ``k``-th is what the host would choose after
    refusing the ``k`` before it (0 once nothing allowed is left, as an argmax over ``-inf`` gives)."""

    device_ids: torch.Tensor
    ids: list[int]
    masses: list[float | None]
    ranked: list[list[int] | None]


def pack_bool(allowed: torch.Tensor, n_words: int) -> np.ndarray:
    """A host bool mask [V] as packed int32 words (llguidance's layout), ``n_words`` long (zero-padded)."""
    a = allowed.numpy() if allowed.device.type == "cpu" else allowed.cpu().numpy()
    packed = np.packbits(a.view(np.uint8), bitorder="little")
    out = np.zeros(n_words * 4, dtype=np.uint8)
    out[: min(packed.size, out.size)] = packed[: out.size]
    return out.view(np.int32)


def clear_bits(words: np.ndarray, tokens: Sequence[int]) -> np.ndarray:
    """A copy of packed ``words`` with ``tokens`` removed from the set."""
    out = words.copy()
    u = out.view(np.uint32)
    for t in tokens:
        if 0 <= t < 32 * out.size:
            u[t >> 5] &= ~np.uint32(1 << (t & 31))
    return out


_PINNED = threading.local()  # per thread (a server runs decode loops in several): one reused buffer per width


def _buffer(rows: int, cols: int, pin: bool) -> torch.Tensor:
    held: dict[tuple[int, bool], torch.Tensor] = getattr(_PINNED, "by_cols", None) or {}
    _PINNED.by_cols = held
    buf = held.get((cols, pin))
    if buf is None or buf.shape[0] < rows:
        buf = torch.empty((max(rows, 64), cols), dtype=torch.int32)
        if pin:
            buf = buf.pin_memory()
        held[(cols, pin)] = buf
    return buf[:rows]


_SHIFTS: dict[torch.device, torch.Tensor] = {}


def _unpack(words: torch.Tensor, n_logits: int, vocab: int) -> torch.Tensor:
    """Packed int32 words [N, W] on the device as a bool mask [N, n_logits] (False past the vocabulary)."""
    shifts = _SHIFTS.get(words.device)
    if shifts is None:
        shifts = _SHIFTS[words.device] = torch.arange(32, dtype=torch.int32, device=words.device)
    bits = ((words.unsqueeze(-1) >> shifts) & 1).view(words.shape[0], -1).bool()
    cut = min(n_logits, vocab, bits.shape[1])
    if cut == n_logits:
        return bits[:, :n_logits]
    out = torch.zeros((words.shape[0], n_logits), dtype=torch.bool, device=words.device)
    out[:, :cut] = bits[:, :cut]
    return out


def device_round(bases: Sequence[torch.Tensor], entries: Sequence[Entry], vocab: int) -> Round:
    """Choose for every entry at once on the bases' device (module docstring; :class:`Round`).

    Exactly the host's choice: the first maximal index of the base row among the entry's allowed tokens (all of
    them when it has no mask), or its forced token. Ranked ids come from a stable descending sort, so ties keep
    the lower index first, as the host's repeated argmax does."""
    base = torch.stack(list(bases))
    device, n_logits = base.device, base.shape[1]
    n_words = (max(n_logits, vocab) + 31) // 32
    rows = [(e, e.words, e.mass_words is not None and e.mass_words is e.words) for e in entries]
    # an entry whose mass is measured against another set than the one it chooses from gets a second row
    extra = [(e, e.mass_words) for e in entries if e.mass_words is not None and e.mass_words is not e.words]
    extra_words: list[tuple[Entry, np.ndarray]] = [(e, w) for e, w in extra if w is not None]
    n = len(rows) + len(extra)
    buf = _buffer(n, META + n_words, pin=device.type == "cuda")
    a = buf.numpy()
    a[:, META:] = -1
    for k, (e, words, measure) in enumerate(rows):
        a[k, FORCED], a[k, BASE] = e.forced, e.base
        a[k, FLAGS] = (HAS_MASK if words is not None else 0) | (MEASURE if measure else 0)
        if words is not None:
            a[k, META:META + words.size] = words
            a[k, META + words.size:] = 0
    for j, (e, words) in enumerate(extra_words):
        k = len(rows) + j
        a[k, FORCED], a[k, BASE], a[k, FLAGS] = -1, e.base, HAS_MASK | MEASURE
        a[k, META:META + words.size] = words
        a[k, META + words.size:] = 0
    dev = to_device(buf, device)
    meta = dev[:, :META].long()
    allowed = _unpack(dev[:, META:], n_logits, vocab)
    has_mask = (meta[:, FLAGS] & HAS_MASK).bool().unsqueeze(1)
    picked = base.index_select(0, meta[:, BASE])
    allowed = allowed | ~has_mask
    masked = picked.masked_fill(~allowed, float("-inf"))
    chosen = masked.argmax(dim=-1)
    chosen = torch.where(meta[:, FORCED] >= 0, meta[:, FORCED], chosen)
    want = [k for k, e in enumerate(entries) if e.ranked > 0]
    depth = max((entries[k].ranked for k in want), default=0)
    ranked_dev = None
    if want:
        sub = masked[want] if len(want) != len(rows) else masked[: len(rows)]
        values, order = torch.sort(sub, dim=-1, descending=True, stable=True)
        values, order = values[:, :depth], order[:, :depth]
        ranked_dev = torch.where(values == float("-inf"), torch.zeros_like(order), order).double().flatten()
    if any(m for _e, _w, m in rows) or extra:
        p = torch.softmax(picked.double(), dim=-1)
        mass = 1.0 - (p * allowed).sum(dim=-1)
    else:
        mass = torch.zeros(n, dtype=torch.float64, device=device)
    parts = [chosen.double(), mass] if ranked_dev is None else [chosen.double(), mass, ranked_dev]
    back = to_host(torch.cat(parts)).tolist()  # one copy back: ids, masses, ranked ids
    ids = [int(t) for t in back[: len(rows)]]
    flat = back[n: 2 * n]
    masses: list[float | None] = [None] * len(rows)
    for k, (_e, _w, measure_k) in enumerate(rows):
        if measure_k:
            masses[k] = float(flat[k])
    index = {id(e): k for k, e in enumerate(entries)}
    for j, (e, _words) in enumerate(extra):
        masses[index[id(e)]] = float(flat[len(rows) + j])
    ranked: list[list[int] | None] = [None] * len(rows)
    tail = back[2 * n:]
    for j, k in enumerate(want):
        ranked[k] = [int(t) for t in tail[j * depth: j * depth + entries[k].ranked]]
    return Round(chosen[: len(rows)], ids, masses, ranked)


def apply_entries(logits: torch.Tensor, entries: Sequence[Entry], vocab: int) -> None:
    """Edit the batch's logits [B, V] in place for engines that sample on their own (vLLM's processor,
    transformers' ``generate``): each entry's row (``base`` = its index in ``logits``) keeps only its allowed
    tokens (``-inf`` elsewhere), and a forced row becomes ``-inf`` but for its token, which gets 0. One packed
    copy to the device and a handful of batched operations, whatever the number of rows."""
    if not entries:
        return
    n_logits = logits.shape[1]
    host = _host_rows(logits)
    if host is not None:
        _apply_on_host(host, entries, min(n_logits, vocab))
        return
    n_words = (max(n_logits, vocab) + 31) // 32
    buf = _buffer(len(entries), META + n_words, pin=logits.device.type == "cuda")
    a = buf.numpy()
    for k, e in enumerate(entries):
        a[k, FORCED], a[k, BASE], a[k, FLAGS] = e.forced, e.base, HAS_MASK if e.words is not None else 0
        if e.words is None:
            a[k, META:] = -1
        else:
            a[k, META:META + e.words.size] = e.words
            a[k, META + e.words.size:] = 0
    dev = to_device(buf, logits.device, blocking=True)  # no copy back follows here: the buffer is reused next call
    meta = dev[:, :META].long()
    index = meta[:, BASE]
    allowed = _unpack(dev[:, META:], n_logits, vocab) | ~(meta[:, FLAGS] & HAS_MASK).bool().unsqueeze(1)
    forced = meta[:, FORCED]
    is_forced = (forced >= 0).unsqueeze(1)
    rows = logits.index_select(0, index).masked_fill(~allowed | is_forced, float("-inf"))
    at = forced.clamp(min=0).unsqueeze(1)
    rows.scatter_(1, at, torch.where(is_forced, torch.zeros_like(rows[:, :1]), rows.gather(1, at)))
    logits.index_copy_(0, index, rows)


_NEG_INF = {torch.float32: np.float32(-np.inf), torch.float64: np.float64(-np.inf), torch.float16: np.float16(-np.inf),
            torch.bfloat16: np.int16(-128)}  # bfloat16's -inf (0xFF80), written through an int16 view
"""What a refused token's logit becomes, in the dtype of a host view of the logits (:func:`_host_rows`)."""


def _host_rows(logits: torch.Tensor) -> np.ndarray | None:
    """A numpy view [B, V] of logits on the host (bfloat16's bits through int16, its 0.0 being 0 there too);
    None where the batched tensor path applies (a device, a dtype numpy cannot hold, logits that need grad)."""
    if logits.device.type != "cpu" or logits.dtype not in _NEG_INF or logits.requires_grad:
        return None
    return (logits.view(torch.int16) if logits.dtype == torch.bfloat16 else logits).numpy()


def _apply_on_host(rows: np.ndarray, entries: Sequence[Entry], cut: int) -> None:
    """:func:`apply_entries` on the host, row by row through numpy: the same edit (tokens past ``cut``, the
    vocabulary, refused). Ours, and why: torch's batched unpacking, ``masked_fill`` and ``index_copy`` over [B, V]
    on a CPU cost 5-10x this, and far more on a busy machine, where its intra-op threads wait on each other
    (measured: 64 rows of 49k logits, 342 ms against 62 ms at load 6; issue 57's profile put most of InWriting's
    plugin time at 64 rows here)."""
    neg_inf = _NEG_INF_BY_KIND[rows.dtype.char]
    n = rows.shape[1]
    for e in entries:
        row = rows[e.base]
        if e.forced >= 0:
            row.fill(neg_inf)
            row[e.forced] = 0
        elif e.words is not None:
            bits = np.unpackbits(e.words.view(np.uint8), bitorder="little")[: min(cut, n)]
            refused = np.ones(n, dtype=bool)
            refused[: bits.size] = bits == 0
            np.copyto(row, neg_inf, where=refused)


_NEG_INF_BY_KIND: dict[str, Any] = {np.dtype(type(v)).char: v for v in _NEG_INF.values()}
