"""Exact McNemar test for paired binary outcomes.

Use it to ask whether two decoding strategies solve different numbers of the same items. Each position
of ``a`` and ``b`` is one paired outcome (True = correct). What counts as one pair is the caller's choice:
pass flattened ``(n_items, n_seeds)`` matrices to treat every (item, seed) as a pair, or reduce over seeds
first (for instance a per-item majority vote) to treat items as the unit. Flattening counts the seeds of
one item as independent pairs, which they are not, so per-item outcomes give the more honest p-value when
there are several seeds.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from scipy.stats import binom


@dataclass(frozen=True)
class McNemarResult:
    """Result of :func:`mcnemar_exact`.

    Attributes:
        b01: Pairs where ``a`` is False and ``b`` is True (only ``b`` correct).
        b10: Pairs where ``a`` is True and ``b`` is False (only ``a`` correct).
        p_value: Exact two-sided p-value: twice the binomial(``b01 + b10``, 1/2) probability of a split at
            least as uneven as the observed one, capped at 1. It is 1.0 when there are no discordant pairs.
        n: Number of pairs, concordant ones included.
    """

    b01: int
    b10: int
    p_value: float
    n: int

    @property
    def n_discordant(self) -> int:
        """``b01 + b10``, the pairs on which ``a`` and ``b`` disagree; only these inform the test."""
        return self.b01 + self.b10


def _as_binary(values: npt.ArrayLike, name: str) -> npt.NDArray[np.bool_]:
    array = np.asarray(values)
    if array.dtype == np.bool_:
        return array.ravel()
    if not np.issubdtype(array.dtype, np.number) or np.issubdtype(array.dtype, np.complexfloating):
        raise TypeError(f"{name} must hold booleans (or 0/1), got dtype {array.dtype}")
    if np.issubdtype(array.dtype, np.floating) and np.isnan(array).any():
        raise ValueError(
            f"{name} contains {int(np.isnan(array).sum())} NaN entries; drop unscored pairs first"
        )
    binary = (array == 0) | (array == 1)
    if not binary.all():
        bad = array[~binary].ravel()[0].item()
        raise ValueError(f"{name} must hold only booleans or 0/1, found {bad!r}")
    return (array == 1).ravel()


def mcnemar_exact(a: npt.ArrayLike, b: npt.ArrayLike) -> McNemarResult:
    """Exact (binomial) two-sided McNemar test on paired binary outcomes.

    Under the null hypothesis that ``a`` and ``b`` succeed equally often, each discordant pair is equally
    likely to favour either side, so ``b10 ~ Binomial(b01 + b10, 1/2)``.

    Args:
        a: Outcomes of the first strategy, booleans or 0/1, any shape (flattened).
        b: Outcomes of the second strategy on the same pairs, same shape as ``a``.

    Returns:
        A :class:`McNemarResult` with the discordant counts, the p-value and the number of pairs.

    Raises:
        ValueError: shapes differ, no pairs, NaN, or values other than booleans and 0/1.
        TypeError: non-numeric input.
    """
    shape_a, shape_b = np.shape(a), np.shape(b)
    if shape_a != shape_b:
        raise ValueError(f"a and b must have the same shape {shape_a} vs {shape_b}")
    flat_a = _as_binary(a, "a")
    flat_b = _as_binary(b, "b")
    if flat_a.size == 0:
        raise ValueError("a and b must contain at least one pair")
    b01 = int(np.count_nonzero(~flat_a & flat_b))
    b10 = int(np.count_nonzero(flat_a & ~flat_b))
    discordant = b01 + b10
    # With no discordant pair there is no evidence either way: p = 1.
    tail = float(binom.cdf(min(b01, b10), discordant, 0.5)) if discordant else 0.5
    p_value = min(1.0, 2.0 * tail)
    return McNemarResult(b01=b01, b10=b10, p_value=p_value, n=int(flat_a.size))
