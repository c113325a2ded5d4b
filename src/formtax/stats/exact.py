"""Exact (Clopper-Pearson) intervals for small studies, and the rule that picks them over the bootstrap.

Why: a percentile bootstrap over 3-16 items resamples too few distinct values. At 5 items it covered paired
differences 0.80 of the time, and with 3 items it called a difference real beside an exact paired p of 1 (issue
49). The corrected default also leans on variance components estimated by the method of moments from those few
items. Below :data:`SMALL_ITEMS` (20) items the report therefore uses intervals whose coverage is known without
resampling. docs/calibration.md shows their coverage at 3-40 items (``bench/calibration.py --small-n``).

**A mean** (an accuracy, a parse rate): the item is the unit. ``k`` is the sum of the per-item means over
runs, and the interval is Clopper-Pearson's for ``k`` of ``n`` items: ``Beta(k, n-k+1)`` and ``Beta(k+1, n-k)``
quantiles (Clopper and Pearson 1934, Biometrika 26(4)). With one run ``k`` is a count, and coverage is at least
the nominal level for every true accuracy. With several runs a per-item mean lies in [0, 1], and its variance
across items is at most ``p(1-p)``, the Bernoulli's, so the count rule stays conservative. The calibration study
measures this case rather than assume it.

**A paired difference** ``p10 - p01`` (the share of items only the strategy gets right, less the share only the
baseline gets right). Write it as ``q (2 theta - 1)``, where ``q = p10 + p01`` is the discordant share and
``theta = p10 / q`` is the strategy's share of the discordant items. Clopper-Pearson gives an interval for ``q``
from the discordant items among ``n``, at ``1 - 0.2 alpha``. It gives another for ``theta`` from the
strategy-better items among the discordant ones, at ``1 - 0.8 alpha``; conditional on the discordant count, that
is the interval McNemar's exact test inverts. By Bonferroni the box holds both at ``1 - alpha`` or more. The
interval is the range of ``q (2 theta - 1)`` over the box, which is bilinear, so its range comes from the corners
(ours: the construction is standard, and we chose the uneven split, :data:`THETA_SHARE`). It excludes 0 only
where theta's interval excludes 1/2, that is where the exact paired test rejects at ``0.8 alpha``. So a small
study never shows an interval that excludes 0 beside an exact test that does not reject. With several runs, the per-item mean differences ``d_i`` give ``n10 = sum of
max(d_i, 0)`` and ``n01 = sum of max(-d_i, 0)`` as fractional counts. That case is measured too.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
from scipy.stats import beta

from formtax.stats._checks import as_matrix, check_confidence, check_same_shape
from formtax.stats.interval import Interval

SMALL_ITEMS = 20
"""Below this many items, means and paired differences of scores in [0, 1] take the exact intervals of this module.
Measured (docs/calibration.md): with one run the bootstrap covered paired differences 0.89-0.92 at 8 and 12 items,
0.924-0.96 at 16 (the abstention world's 0.924 under the 0.93 floor) and 0.934-0.95 at 40; with three runs it held
from 8 items. The exact rule is conservative, and it is what the report uses below 20 items whatever the runs."""

THETA_SHARE = 0.8
"""The share of ``alpha`` given to theta's interval in the paired box (the rest goes to ``q``): whether the interval
excludes 0 rests on theta alone, so this keeps it close to the exact paired test at ``alpha`` (ours)."""

EXACT_METHOD = "clopper-pearson (items)"
EXACT_PAIRED_METHOD = "clopper-pearson box on discordant items"


def applies(*matrices: npt.ArrayLike, below: int = SMALL_ITEMS) -> bool:
    """Whether the small-study rule takes these score matrices: some items but fewer than ``below``
    (:data:`SMALL_ITEMS`; 0 turns the rule off, as the calibration study does to show the bootstrap alone),
    and every score in [0, 1] (the exact intervals bound a share)."""
    mats = [np.asarray(m, dtype=float) for m in matrices]
    if not mats or mats[0].ndim != 2 or not 0 < mats[0].shape[0] < below:
        return False
    return all(m.size and np.isfinite(m).all() and m.min() >= 0.0 and m.max() <= 1.0 for m in mats)


def clopper_pearson(k: float, n: float, confidence: float = 0.95) -> tuple[float, float]:
    """Clopper-Pearson bounds for ``k`` successes in ``n`` trials; ``k`` may be fractional (module docstring)."""
    if n <= 0:
        return 0.0, 1.0
    a = 1.0 - check_confidence(confidence)
    k = min(max(float(k), 0.0), float(n))
    low = 0.0 if k <= 1e-12 else float(beta.ppf(a / 2, k, n - k + 1))
    high = 1.0 if k >= n - 1e-12 else float(beta.ppf(1 - a / 2, k + 1, n - k))
    return low, high


def exact_mean_interval(scores: npt.ArrayLike, confidence: float = 0.95) -> Interval:
    """Clopper-Pearson interval for the mean of an ``(n_items, n_runs)`` matrix of scores in [0, 1], items
    as the trials (module docstring)."""
    m = as_matrix(scores, "scores", allow_nan=False)
    n = m.shape[0]
    low, high = clopper_pearson(float(m.mean(axis=1).sum()), n, confidence)
    estimate = float(m.mean())
    return Interval(estimate, min(low, estimate), max(high, estimate), n, m.shape[1], 0, EXACT_METHOD, confidence)


def box_interval(n10: float, n01: float, n: float, confidence: float = 0.95) -> tuple[float, float]:
    """The Clopper-Pearson box bounds of ``p10 - p01`` from ``n10`` strategy-only and ``n01`` baseline-only
    items among ``n`` (module docstring)."""
    alpha = 1.0 - check_confidence(confidence)  # Bonferroni: theta at 1 - 0.8 alpha, q at 1 - 0.2 alpha
    q_low, q_high = clopper_pearson(n10 + n01, n, 1.0 - (1.0 - THETA_SHARE) * alpha)
    t_low, t_high = (clopper_pearson(n10, n10 + n01, 1.0 - THETA_SHARE * alpha) if n10 + n01 > 1e-12
                     else (0.0, 1.0))
    corners = [q * (2 * t - 1) for q in (q_low, q_high) for t in (t_low, t_high)]
    return min(corners), max(corners)


def exact_paired_interval(a: npt.ArrayLike, b: npt.ArrayLike, confidence: float = 0.95) -> Interval:
    """The Clopper-Pearson box interval for ``mean(a) - mean(b)`` on paired ``(n_items, n_runs)`` matrices of
    scores in [0, 1] (module docstring)."""
    ma, mb = as_matrix(a, "a", allow_nan=False), as_matrix(b, "b", allow_nan=False)
    check_same_shape(ma, mb, "a", "b")
    confidence = check_confidence(confidence)
    n = ma.shape[0]
    d = ma.mean(axis=1) - mb.mean(axis=1)
    n10, n01 = float(np.clip(d, 0, None).sum()), float(np.clip(-d, 0, None).sum())
    low, high = box_interval(n10, n01, n, confidence)
    estimate = float(ma.mean() - mb.mean())
    return Interval(estimate, min(low, estimate), max(high, estimate), n, ma.shape[1], 0, EXACT_PAIRED_METHOD,
                    confidence)
