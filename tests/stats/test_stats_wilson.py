"""Tests for formtax.stats.wilson_interval against statsmodels."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from statsmodels.stats.proportion import proportion_confint

from formtax.stats import Interval, wilson_interval


@pytest.mark.parametrize(
    ("k", "n", "confidence"),
    [(0, 1, 0.95), (1, 1, 0.95), (3, 10, 0.95), (0, 50, 0.9), (50, 50, 0.99), (137, 400, 0.95), (1, 7, 0.8)],
)
def test_matches_statsmodels(k: int, n: int, confidence: float) -> None:
    low, high = proportion_confint(k, n, alpha=1 - confidence, method="wilson")
    interval = wilson_interval(k, n, confidence)
    assert interval.low == pytest.approx(low, abs=1e-12)
    assert interval.high == pytest.approx(high, abs=1e-12)
    assert interval.estimate == k / n


@settings(max_examples=200, deadline=None)
@given(
    kn=st.integers(1, 5000).flatmap(lambda n: st.tuples(st.integers(0, n), st.just(n))),
    confidence=st.floats(0.5, 0.999),
)
def test_matches_statsmodels_property(kn: tuple[int, int], confidence: float) -> None:
    k, n = kn
    low, high = proportion_confint(k, n, alpha=1 - confidence, method="wilson")
    interval = wilson_interval(k, n, confidence)
    assert interval.low == pytest.approx(low, abs=1e-10)
    assert interval.high == pytest.approx(high, abs=1e-10)
    assert 0.0 <= interval.low <= interval.estimate <= interval.high <= 1.0


def test_fields_and_edges() -> None:
    interval = wilson_interval(0, 20)
    assert interval == Interval(
        estimate=0.0,
        low=0.0,
        high=interval.high,
        n_items=20,
        n_seeds=1,
        n_resamples=0,
        method="wilson",
        confidence=0.95,
    )
    assert 0.1 < interval.high < 0.2  # does not collapse to a point like the Wald interval
    assert wilson_interval(20, 20).high == 1.0
    assert wilson_interval(5, 10).width < wilson_interval(5, 10, 0.99).width


def test_validation() -> None:
    with pytest.raises(ValueError, match="n must be at least 1, got 0"):
        wilson_interval(0, 0)
    with pytest.raises(ValueError, match="k must lie between 0 and n=5, got 6"):
        wilson_interval(6, 5)
    with pytest.raises(ValueError, match="k must lie between 0 and n=5, got -1"):
        wilson_interval(-1, 5)
    with pytest.raises(TypeError, match="k must be an integer"):
        wilson_interval(2.5, 5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="confidence must lie strictly between 0 and 1"):
        wilson_interval(2, 5, 95)
