"""The hidden Markov model of the format estimation module, and its training (docs/ALGORITHMS.md section 7).

An HMM with ``h`` hidden states over the model's vocabulary: initial distribution ``pi`` [h], transitions ``A``
[h, h] and emissions ``B`` [h, V], all row-stochastic, in torch (CPU or GPU). It approximates how the language
model writes *after the prompt*: the FEM never sees the prompt; its forward vector starts at ``pi`` on the first
generated token (our choice, as in Ctrl-G, whose HMM models the generated text only).

Training (vectorised in torch): an initial hard labelling of every position with a hidden state (k-means of the
LM's hidden states, or of bigram statistics), counted into (pi, A, B), then a few Baum-Welch (EM) iterations with
scaled forward-backward over a padded batch of sequences. Each training sequence starts with an *empty token*
(a sentinel id one past the vocabulary) and, when the sample ended, the EOS token. After training, the mass of that
initial empty transition is spread over the transitions that follow it, as Deco-G prescribes: the initial
distribution becomes the hidden-state distribution *after* the empty token, ``pi' ~ (pi * B[:, empty]) @ A``, and
each state's emission mass on the empty token is spread over its other tokens in proportion to their mass (our
reading of the paper's one-sentence description).

Smoothing (our choice): every M-step mixes each row with a uniform distribution, weight ``smooth`` (1e-3) for pi
and A and ``smooth_emission`` (1e-3) for B, so no token or transition has zero probability: the FEM's estimates
then never divide by zero, and the hard mask, not the HMM, decides what is impossible.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

Progress = Callable[[str, int, int], None]


@dataclass(eq=False)
class HMM:
    pi: torch.Tensor  # [h]
    A: torch.Tensor  # [h, h]
    B: torch.Tensor  # [h, V]

    @property
    def h(self) -> int:
        return int(self.A.shape[0])

    @property
    def vocab_size(self) -> int:
        return int(self.B.shape[1])

    def check(self, atol: float = 1e-3) -> None:
        h = self.h
        if self.pi.shape != (h,) or self.A.shape != (h, h) or self.B.ndim != 2 or self.B.shape[0] != h:
            raise ValueError(f"HMM shapes disagree: pi {tuple(self.pi.shape)}, A {tuple(self.A.shape)}, "
                             f"B {tuple(self.B.shape)}")
        for name, t in (("pi", self.pi[None, :]), ("A", self.A), ("B", self.B)):
            if bool((t < 0).any()) or not bool(torch.isfinite(t).all()):
                raise ValueError(f"HMM {name} has negative or non-finite entries")
            dev = float((t.double().sum(dim=1) - 1.0).abs().max())
            if dev > atol:
                raise ValueError(f"HMM {name} rows do not sum to 1 (max deviation {dev:.2e})")

    def to(self, device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> HMM:
        return HMM(self.pi.to(device=device, dtype=dtype), self.A.to(device=device, dtype=dtype),
                   self.B.to(device=device, dtype=dtype))

    def log_init(self) -> torch.Tensor:
        return torch.log(self.pi)

    def forward_step(self, logf: torch.Tensor, token: int) -> torch.Tensor:
        """``f <- log( exp(f + log B[:, v]) @ A )``, normalised: the hidden state that emits the next token."""
        m = logf.amax()
        p = torch.exp(logf - m) * self.B[:, token]
        q = p @ self.A
        s = q.sum()
        return torch.log(q / s)

    def loglik(self, tokens: Sequence[int]) -> float:
        """log P(tokens) under the HMM (scaled forward algorithm)."""
        a = self.pi.double()
        total = 0.0
        A, B = self.A.double(), self.B.double()
        for t, v in enumerate(tokens):
            if t:
                a = a @ A
            a = a * B[:, v]
            c = float(a.sum())
            total += math.log(c)
            a = a / c
        return total

    @classmethod
    def random(cls, h: int, vocab_size: int, seed: int = 0, concentration: float = 0.3,
               dtype: torch.dtype = torch.float32) -> HMM:
        """A random HMM with peaked rows (exponentiated Gaussian noise), smoothed like a trained one: for tests
        and benchmarks."""
        g = torch.Generator().manual_seed(seed)

        def rows(n: int, m: int) -> torch.Tensor:
            x = torch.exp(torch.randn(n, m, generator=g, dtype=torch.float64) / concentration)
            return _mix(x, 1e-3).to(dtype)

        return cls(rows(1, h)[0], rows(h, h), rows(h, vocab_size))


# -- initialisation ----------------------------------------------------------------------------------------------


def kmeans(x: torch.Tensor, k: int, iters: int = 15, seed: int = 0, chunk: int = 8192) -> torch.Tensor:
    """Lloyd's k-means, seeded: k-means++ centres when ``k * n`` is small enough (<= 2e7), else distinct random
    points (our choice, to bound the cost at thousands of states); empty clusters take the farthest points.

    Returns the label of every row of ``x``; at most ``min(k, n)`` distinct labels.
    """
    n = x.shape[0]
    k = max(1, min(k, n))
    g = torch.Generator().manual_seed(seed)
    x = x.float()
    sq = (x * x).sum(dim=1)

    def nearest(centres: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        best = torch.empty(n)
        arg = torch.empty(n, dtype=torch.long)
        csq = (centres * centres).sum(dim=1)
        for i in range(0, n, chunk):
            d = sq[i : i + chunk, None] - 2 * x[i : i + chunk] @ centres.T + csq[None, :]
            best[i : i + chunk], arg[i : i + chunk] = d.min(dim=1)
        return best.clamp(min=0), arg

    if k * n <= 20_000_000:
        picks = [int(torch.randint(n, (1,), generator=g))]
        d2 = ((x - x[picks[0]]) ** 2).sum(dim=1)
        for _ in range(1, k):
            total = float(d2.sum())
            nxt = int(torch.multinomial(d2 / total, 1, generator=g)) if total > 0 else int(torch.randint(n, (1,)))
            picks.append(nxt)
            d2 = torch.minimum(d2, ((x - x[nxt]) ** 2).sum(dim=1))
        centres = x[torch.tensor(picks)].clone()
    else:
        centres = x[torch.randperm(n, generator=g)[:k]].clone()
    labels = torch.zeros(n, dtype=torch.long)
    for _ in range(iters):
        best, labels = nearest(centres)
        sums = torch.zeros_like(centres).index_add_(0, labels, x)
        cnt = torch.bincount(labels, minlength=k).float()
        empty = torch.nonzero(cnt == 0).flatten()
        centres = sums / cnt.clamp(min=1)[:, None]
        if len(empty):
            far = torch.argsort(best, descending=True)[: len(empty)]
            centres[empty] = x[far]
    return nearest(centres)[1]


def bigram_labels(seqs: Sequence[Sequence[int]], h: int, seed: int = 0, top: int = 512) -> list[list[int]]:
    """Hard labels from n-gram counts: a position's hidden state is the k-means cluster of its *previous* token,
    described by that token's next-token distribution over the ``top`` most frequent tokens (Hellinger
    features). The first position's previous token is a start symbol."""
    start = -1
    prev = [[start, *list(s[:-1])] for s in seqs]
    flat_prev = torch.tensor([p for ps in prev for p in ps], dtype=torch.long)
    flat_next = torch.tensor([t for s in seqs for t in s], dtype=torch.long)
    types, type_idx = torch.unique(flat_prev, return_inverse=True)
    freq = torch.bincount(flat_next)
    keep = torch.argsort(freq, descending=True)[:top]
    col = torch.full((int(flat_next.max()) + 1,), len(keep), dtype=torch.long)
    col[keep] = torch.arange(len(keep))
    feats = torch.zeros(len(types), len(keep) + 1)
    feats.index_put_((type_idx, col[flat_next]), torch.ones(len(flat_next)), accumulate=True)
    feats = torch.sqrt(feats / feats.sum(dim=1, keepdim=True))
    cluster = kmeans(feats, h, seed=seed)
    lab = cluster[type_idx].tolist()
    out: list[list[int]] = []
    i = 0
    for s in seqs:
        out.append(lab[i : i + len(s)])
        i += len(s)
    return out


def _mix(rows: torch.Tensor, weight: float) -> torch.Tensor:
    """Normalise count rows and mix with uniform (weight ``weight``); all-zero rows become uniform."""
    tot = rows.sum(dim=1, keepdim=True)
    p = torch.where(tot > 0, rows / tot.clamp(min=1e-300), torch.full_like(rows, 1.0 / rows.shape[1]))
    return (1 - weight) * p + weight / rows.shape[1]


def counts_hmm(seqs: Sequence[Sequence[int]], labels: Sequence[Sequence[int]], h: int, vocab_size: int,
               smooth: float = 1e-3, smooth_emission: float = 1e-3, seed: int = 0) -> HMM:
    """(pi, A, B) counted from hard labels. States no position uses become noisy copies of used states (our
    choice: EM can then specialise them, where uniform rows would stay symmetric)."""
    pi = torch.zeros(h, dtype=torch.float64)
    A = torch.zeros(h, h, dtype=torch.float64)
    B = torch.zeros(h, vocab_size, dtype=torch.float64)
    for s, z in zip(seqs, labels, strict=True):
        if not s:
            continue
        zt = torch.tensor(list(z), dtype=torch.long)
        pi[zt[0]] += 1
        A.index_put_((zt[:-1], zt[1:]), torch.ones(len(zt) - 1, dtype=torch.float64), accumulate=True)
        B.index_put_((zt, torch.tensor(list(s), dtype=torch.long)), torch.ones(len(zt), dtype=torch.float64),
                     accumulate=True)
    used = B.sum(dim=1) > 0
    unused = torch.nonzero(~used).flatten()
    if len(unused) and bool(used.any()):
        g = torch.Generator().manual_seed(seed)
        src = torch.nonzero(used).flatten()
        pick = src[torch.randint(len(src), (len(unused),), generator=g)]
        noise = lambda *shape: torch.exp(0.5 * torch.randn(*shape, generator=g, dtype=torch.float64))  # noqa: E731
        B[unused] = B[pick] * noise(len(unused), vocab_size)
        A[unused] = A[pick] * noise(len(unused), h)
        A[:, unused] = A[:, pick] * noise(h, len(unused)) * 0.5
        pi[unused] = pi[pick] * 0.5
    return HMM(_mix(pi[None, :], smooth)[0], _mix(A, smooth), _mix(B, smooth_emission))


# -- Baum-Welch ----------------------------------------------------------------------------------------------


def _pad(seqs: Sequence[Sequence[int]], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    n, t_max = len(seqs), max(len(s) for s in seqs)
    x = torch.zeros(n, t_max, dtype=torch.long)
    for i, s in enumerate(seqs):
        x[i, : len(s)] = torch.tensor(list(s), dtype=torch.long)
    lengths = torch.tensor([len(s) for s in seqs], dtype=torch.long)
    return x.to(device), lengths.to(device)


def em_stats(hmm: HMM, seqs: Sequence[Sequence[int]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, float]:
    """Expected counts of one E-step over ``seqs`` at once (scaled forward-backward on a padded batch):
    (initial-state counts [h], transition counts [h, h], emission counts [h, V], log-likelihood)."""
    dev, dt = hmm.A.device, hmm.A.dtype
    x, lengths = _pad(seqs, dev)
    n, t_max = x.shape
    h = hmm.h
    A, Bt = hmm.A, hmm.B.T.contiguous()
    alpha = torch.empty(n, t_max, h, dtype=dt, device=dev)
    scale = torch.ones(n, t_max, dtype=dt, device=dev)
    a = hmm.pi[None, :] * Bt[x[:, 0]]
    c = a.sum(dim=1)
    a = a / c[:, None]
    alpha[:, 0], scale[:, 0] = a, c
    for t in range(1, t_max):
        valid = (t < lengths)[:, None]
        a_new = (a @ A) * Bt[x[:, t]]
        c = a_new.sum(dim=1)
        a = torch.where(valid, a_new / c.clamp(min=1e-300)[:, None], a)
        alpha[:, t] = a
        scale[:, t] = torch.where(valid[:, 0], c, torch.ones_like(c))
    beta = torch.ones(n, t_max, h, dtype=dt, device=dev)
    b = torch.ones(n, h, dtype=dt, device=dev)
    for t in range(t_max - 2, -1, -1):
        valid = ((t + 1) < lengths)[:, None]
        b_new = ((Bt[x[:, t + 1]] * b) @ A.T) / scale[:, t + 1, None]
        b = torch.where(valid, b_new, b)
        beta[:, t] = b
    mask = torch.arange(t_max, device=dev)[None, :] < lengths[:, None]
    gamma = alpha * beta
    gamma = gamma / gamma.sum(dim=2, keepdim=True).clamp(min=1e-300)
    pair = mask[:, 1:]
    left = alpha[:, :-1][pair]
    right = (Bt[x[:, 1:]] * beta[:, 1:] / scale[:, 1:, None])[pair]
    xi = A * (left.T @ right)
    b_counts = torch.zeros(h, hmm.vocab_size, dtype=dt, device=dev)
    b_counts.index_add_(1, x[mask], gamma[mask].T.contiguous())
    return gamma[:, 0].sum(dim=0), xi, b_counts, float(torch.log(scale[mask]).sum())


def em_step(hmm: HMM, seqs: Sequence[Sequence[int]], smooth: float = 1e-3,
            smooth_emission: float = 1e-3) -> tuple[HMM, float]:
    """One Baum-Welch iteration; returns the new HMM and the log-likelihood under the *old* one."""
    pi, xi, b, ll = em_stats(hmm, seqs)
    return HMM(_mix(pi[None, :], smooth)[0], _mix(xi, smooth), _mix(b, smooth_emission)), ll


def baum_welch(hmm: HMM, seqs: Sequence[Sequence[int]], iters: int, smooth: float = 1e-3,
               smooth_emission: float = 1e-3, progress: Progress | None = None,
               batch: int = 64) -> tuple[HMM, list[float]]:
    """``iters`` EM iterations (expected counts summed over batches of ``batch`` sequences); returns the HMM and
    the log-likelihood of the data before each iteration and after the last (it never decreases, up to the
    smoothing)."""
    seqs = [s for s in seqs if s]
    history: list[float] = []
    cur = hmm
    for it in range(iters + 1):
        pi = torch.zeros_like(cur.pi)
        A = torch.zeros_like(cur.A)
        B = torch.zeros_like(cur.B)
        total = 0.0
        for i in range(0, len(seqs), batch):
            p, a, b, ll = em_stats(cur, seqs[i : i + batch])
            pi += p
            A += a
            B += b
            total += ll
        history.append(total)
        if it == iters:
            break
        cur = HMM(_mix(pi[None, :], smooth)[0], _mix(A, smooth), _mix(B, smooth_emission))
        if progress is not None:
            progress("em", it + 1, iters)
    return cur, history


def spread_empty(hmm: HMM, empty: int) -> HMM:
    """Remove the training-only empty token (column ``empty``): spread its mass over what follows it."""
    w = hmm.pi * hmm.B[:, empty]
    pi = (w / w.sum()) @ hmm.A if float(w.sum()) > 0 else hmm.pi @ hmm.A
    keep = [i for i in range(hmm.vocab_size) if i != empty]
    B = hmm.B[:, keep]
    B = B / B.sum(dim=1, keepdim=True)
    return HMM(pi / pi.sum(), hmm.A, B)
