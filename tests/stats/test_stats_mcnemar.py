"""Tests for formtax.stats.mcnemar_exact against statsmodels."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from statsmodels.stats.contingency_tables import mcnemar

from formtax.stats import McNemarResult, mcnemar_exact


def _statsmodels_pvalue(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.ravel().astype(bool), b.ravel().astype(bool)
    table = np.array(
        [
            [np.sum(a & b), np.sum(a & ~b)],
            [np.sum(~a & b), np.sum(~a & ~b)],
        ]
    )
    return float(mcnemar(table, exact=True).pvalue)


@pytest.mark.parametrize("seed", range(6))
def test_matches_statsmodels_on_item_by_seed_matrices(seed: int) -> None:
    rng = np.random.default_rng(seed)
    a = rng.random((60, 3)) < 0.55
    b = np.where(rng.random((60, 3)) < 0.85, a, rng.random((60, 3)) < 0.7)
    result = mcnemar_exact(a, b)
    assert result.n == 180
    assert result.b01 == int(np.sum(~a & b))
    assert result.b10 == int(np.sum(a & ~b))
    assert result.p_value == pytest.approx(_statsmodels_pvalue(a, b), rel=1e-12, abs=1e-300)


def test_all_concordant_gives_p_one() -> None:
    a = np.array([True, False, True, True])
    result = mcnemar_exact(a, a.copy())
    assert result == McNemarResult(b01=0, b10=0, p_value=1.0, n=4)
    assert result.n_discordant == 0
    assert _statsmodels_pvalue(a, a) == 1.0


def test_known_values() -> None:
    # 10 discordant pairs, all favouring a: p = 2 * 0.5**10.
    a = np.array([True] * 10 + [False] * 5)
    b = np.array([False] * 10 + [False] * 5)
    result = mcnemar_exact(a, b)
    assert (result.b01, result.b10, result.n) == (0, 10, 15)
    assert result.p_value == pytest.approx(2 * 0.5**10)
    # Balanced discordance: p = 1 (capped, not 2 * P(X <= 1) > 1).
    assert mcnemar_exact([1, 0], [0, 1]).p_value == 1.0


def test_integer_input_accepted() -> None:
    assert mcnemar_exact([1, 0, 1, 1], [0, 0, 1, 0]) == McNemarResult(b01=0, b10=2, p_value=0.5, n=4)
    assert mcnemar_exact(np.array([1.0, 0.0]), np.array([1.0, 1.0])).b01 == 1


@settings(max_examples=100, deadline=None)
@given(
    data=st.integers(1, 80).flatmap(
        lambda n: st.tuples(hnp.arrays(np.bool_, n), hnp.arrays(np.bool_, n)),
    )
)
def test_matches_statsmodels_and_is_symmetric(data: tuple[np.ndarray, np.ndarray]) -> None:
    a, b = data
    forward = mcnemar_exact(a, b)
    backward = mcnemar_exact(b, a)
    assert (forward.b01, forward.b10) == (backward.b10, backward.b01)
    assert forward.p_value == backward.p_value
    assert 0.0 < forward.p_value <= 1.0
    assert forward.p_value == pytest.approx(_statsmodels_pvalue(a, b), rel=1e-12)


def test_validation() -> None:
    with pytest.raises(ValueError, match=r"^a and b must have the same shape \(3,\) vs \(4,\)$"):
        mcnemar_exact(np.ones(3, bool), np.ones(4, bool))
    with pytest.raises(ValueError, match="at least one pair"):
        mcnemar_exact(np.array([], bool), np.array([], bool))
    with pytest.raises(ValueError, match="b must hold only booleans or 0/1, found 2"):
        mcnemar_exact([1, 0], [1, 2])
    with pytest.raises(ValueError, match="a contains 1 NaN entries"):
        mcnemar_exact([1.0, np.nan], [1.0, 0.0])
    with pytest.raises(TypeError, match="must hold booleans"):
        mcnemar_exact(["x"], ["y"])
