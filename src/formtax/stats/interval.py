"""The :class:`Interval` result type and the Wilson score interval for a single proportion."""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from dataclasses import dataclass

from formtax.stats._checks import check_confidence


@dataclass(frozen=True)
class Interval:
    """A point estimate with a two-sided confidence interval.

    Attributes:
        estimate: The point estimate (for the bootstrap: the plain mean of the score matrix, or the
            difference of two such means).
        low: Lower end of the interval.
        high: Upper end of the interval.
        n_items: Number of items (rows of the score matrix; for :func:`wilson_interval`, trials).
        n_seeds: Number of seeds (columns of the score matrix; 1 for :func:`wilson_interval`).
        n_resamples: Bootstrap replicates behind the interval (0 for a closed-form interval).
        method: How the interval was computed, e.g. ``"percentile-bootstrap"`` or ``"wilson"``.
        confidence: Nominal coverage, e.g. 0.95.
    """

    estimate: float
    low: float
    high: float
    n_items: int
    n_seeds: int
    n_resamples: int
    method: str
    confidence: float

    @property
    def width(self) -> float:
        """``high - low``."""
        return self.high - self.low

    def contains(self, value: float) -> bool:
        """Whether ``low <= value <= high``."""
        return self.low <= value <= self.high

    def __str__(self) -> str:
        percent = f"{100 * self.confidence:g}%"
        return f"{self.estimate:.4f} [{self.low:.4f}, {self.high:.4f}] ({percent} {self.method})"


def wilson_interval(k: int, n: int, confidence: float = 0.95) -> Interval:
    """Wilson score interval for a binomial proportion ``k / n``.

    Unlike the normal-approximation (Wald) interval it stays inside [0, 1] and does not collapse to a
    point when ``k`` is 0 or ``n``. The estimate is ``k / n``.

    Args:
        k: Number of successes, ``0 <= k <= n``.
        n: Number of trials, at least 1.
        confidence: Nominal two-sided coverage, strictly between 0 and 1.

    Returns:
        An :class:`Interval` with ``method="wilson"``, ``n_items=n``, ``n_seeds=1`` and ``n_resamples=0``.

    Raises:
        TypeError: ``k`` or ``n`` is not an integer.
        ValueError: ``n < 1``, ``k`` outside ``[0, n]``, or ``confidence`` outside (0, 1).
    """
    for name, value in (("k", k), ("n", n)):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise TypeError(f"{name} must be an integer, got {type(value).__name__}")
    k, n = int(k), int(n)
    if n < 1:
        raise ValueError(f"n must be at least 1, got {n}")
    if not 0 <= k <= n:
        raise ValueError(f"k must lie between 0 and n={n}, got {k}")
    confidence = check_confidence(confidence)

    from statsmodels.stats.proportion import proportion_confint

    p = k / n
    lo, hi = proportion_confint(k, n, alpha=1.0 - confidence, method="wilson")
    # Clip rounding noise: the exact interval lies within [0, 1] and touches 0 (1) when k = 0 (k = n).
    low = 0.0 if k == 0 else max(0.0, float(lo))
    high = 1.0 if k == n else min(1.0, float(hi))
    return Interval(
        estimate=p,
        low=low,
        high=high,
        n_items=n,
        n_seeds=1,
        n_resamples=0,
        method="wilson",
        confidence=confidence,
    )


def paired_boundary_interval(item_differences: Sequence[float], confidence: float = 0.95) -> Interval | None:
    """The interval of a paired difference where the percentile bootstrap degenerates, or None elsewhere.

    When every item's difference is the same value ``e`` (no item differs: both strategies all 0, all 1 or
    identical; or every item differs alike), every bootstrap replicate is ``e`` and the bootstrap prints
    ``[e, e]``, which cannot cover a true difference that a few untested items would show. Then (ours, as for a
    single proportion at 0 or 1) the interval is ``e`` plus or minus ``u``, clipped to [-1, 1], where ``u`` is the
    Wilson upper bound on the share of items that differ from that pattern when 0 of the ``n`` observed do: the
    true difference can move from ``e`` by at most that share. 0 discordant of 16 gives [-0.194, 0.194].
    """
    diffs = [float(d) for d in item_differences]
    if not diffs or any(abs(d - diffs[0]) > 1e-12 for d in diffs):
        return None
    n, e = len(diffs), diffs[0]
    u = wilson_interval(0, n, confidence).high
    return Interval(estimate=e, low=max(-1.0, e - u), high=min(1.0, e + u), n_items=n, n_seeds=1, n_resamples=0,
                    method="wilson-boundary", confidence=confidence)
