"""The paired test of two strategies on the same items: a sign-flip permutation test on per-item differences.

Why not McNemar on every (item, seed) pair: the seeds of one item are not independent pairs. With greedy decoding
and 5 identical seeds, 2 discordant items out of 10 become 10 of 50 and p falls from 0.039 to 1.6e-7. The unit
of the test must be the unit that was sampled, the item. So each item's scores are first averaged over its seeds,
``d_i = mean_j(a_ij) - mean_j(b_ij)``, and under the null hypothesis (the two strategies are exchangeable on every
item) each ``d_i`` is as likely to have either sign. The test statistic is ``sum_i d_i``; the p-value is the share
of sign assignments whose statistic is at least as extreme, two-sided (:func:`scipy.stats.permutation_test` with
``permutation_type="samples"``, which swaps ``a`` and ``b`` within an item). Items with ``d_i = 0`` cannot change
the statistic and are left out. With 0/1 scores (``n_seeds * d_i`` an integer) the permutation distribution is
computed exactly for any number of items (:func:`_sign_flip_p`); other scores use scipy, exact for up to
:data:`EXACT_MAX_ITEMS` discordant items and a seeded Monte Carlo test otherwise.

With one seed per item and 0/1 scores this is exactly McNemar's exact test (the two-sided binomial test of the
discordant pairs, checked against statsmodels in the tests). The only hand-written part is the collapse to
per-item means; the permutation distribution is scipy's.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from scipy import stats

from formtax.stats._checks import as_matrix, check_same_shape

EXACT_MAX_ITEMS = 16
"""Discordant items up to which every sign assignment is enumerated (2**16 = 65,536)."""

MONTE_CARLO_RESAMPLES = 20_000
"""Random sign assignments beyond :data:`EXACT_MAX_ITEMS` (p-value resolution about 5e-5)."""

TEST_NAME = "sign-flip permutation test on per-item mean differences (McNemar's exact test at one seed)"


@dataclass(frozen=True)
class PairedTest:
    """Result of :func:`paired_item_test`."""

    p_value: float
    n_items: int  # items compared
    n_discordant: int  # items whose mean scores differ (only these inform the test)
    a_better: int  # discordant items where ``a`` scores higher
    b_better: int
    exact: bool  # every sign assignment enumerated


def paired_item_test(a: npt.ArrayLike, b: npt.ArrayLike, seed: int = 0) -> PairedTest:
    """Two-sided test that strategies ``a`` and ``b`` score the same items alike (module docstring).

    Args:
        a: Scores shaped ``(n_items, n_seeds)``, without NaN.
        b: Scores of the same shape, the same items and seeds.
        seed: Seed of the Monte Carlo sign flips (used only beyond :data:`EXACT_MAX_ITEMS` discordant items).
    """
    matrix_a = as_matrix(a, "a", allow_nan=False)
    matrix_b = as_matrix(b, "b", allow_nan=False)
    check_same_shape(matrix_a, matrix_b, "a", "b")
    d = matrix_a.mean(axis=1) - matrix_b.mean(axis=1)
    nonzero = d[np.abs(d) > 1e-12]
    n = int(nonzero.size)
    a_better, b_better = int((nonzero > 0).sum()), int((nonzero < 0).sum())
    if n == 0:
        return PairedTest(1.0, int(d.size), 0, 0, 0, True)
    counts = _as_counts(nonzero, matrix_a.shape[1])
    if counts is not None:
        return PairedTest(_sign_flip_p(counts), int(d.size), n, a_better, b_better, True)
    exact = n <= EXACT_MAX_ITEMS
    if n == 1:  # one discordant item: the two sign assignments are equally extreme
        return PairedTest(1.0, int(d.size), n, a_better, b_better, True)
    result = stats.permutation_test(
        (nonzero, np.zeros_like(nonzero)),
        lambda x, y, axis: np.sum(x - y, axis=axis),
        permutation_type="samples",
        vectorized=True,
        n_resamples=np.inf if exact else MONTE_CARLO_RESAMPLES,
        alternative="two-sided",
        rng=np.random.default_rng(seed),
    )
    return PairedTest(min(1.0, float(result.pvalue)), int(d.size), n, a_better, b_better, exact)


def format_p(p: float) -> str:
    """A p-value for a table: 3 significant digits, ``<1e-6`` below that (never ``0.0``)."""
    if p != p:  # NaN
        return ""
    if p < 1e-6:
        return "<1e-6"
    return f"{p:.3g}"


def _as_counts(d: npt.NDArray[np.float64], n_seeds: int) -> npt.NDArray[np.int64] | None:
    """``n_seeds * d`` as integers when it is one (0/1 scores: a per-item difference of run counts), else None."""
    k = d * n_seeds
    rounded = np.rint(k)
    if not np.allclose(k, rounded, rtol=0.0, atol=1e-9):
        return None
    return rounded.astype(np.int64)


def _sign_flip_p(k: npt.NDArray[np.int64]) -> float:
    """Exact two-sided p of ``sum_i k_i`` over all ``2**n`` sign assignments (:func:`sign_flip_tail`)."""
    greater, equal = sign_flip_tail(k)
    return min(1.0, greater + equal)


def sign_flip_tail(k: npt.NDArray[np.int64]) -> tuple[float, float]:
    """``(P(|T| > |t|), P(|T| = |t|))`` for ``T = sum_i s_i |k_i|`` with independent fair signs ``s_i`` and
    ``t = sum_i k_i``: the permutation distribution computed by convolving each item's two equally likely
    values, in O(n * sum|k|) instead of enumerated (ours: scipy enumerates, which stops at a few dozen items).
    With one run (``|k_i| = 1``) it is the binomial distribution of McNemar's exact test. The two parts also
    give the randomised p-value ``greater + U * equal``, exactly uniform under the null (the calibration
    study's check of the null distribution)."""
    mags = np.abs(np.asarray(k, dtype=np.int64))
    total = int(mags.sum())
    dist = np.zeros(2 * total + 1, dtype=np.float64)  # dist[s + total] = P(sum = s)
    dist[total] = 1.0
    for m in (int(x) for x in mags):
        new = np.zeros_like(dist)
        new[m:] += 0.5 * dist[: dist.size - m]  # this item's sign is +: the sum moves up by m
        new[: dist.size - m] += 0.5 * dist[m:]  # sign -: down by m
        dist = new
    values = np.abs(np.arange(dist.size) - total)
    observed = abs(int(np.asarray(k).sum()))
    return float(dist[values > observed].sum()), float(dist[values == observed].sum())
