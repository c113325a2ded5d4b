"""Tests for formtax.stats.summary: mean ± std over runs, the decomposition, and logistic_fit."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from scipy.optimize import minimize
from scipy.stats import norm

from formtax.stats import LEVELS, decomposition, logistic_fit, mean_std_over_runs

# --- mean_std_over_runs ---------------------------------------------------------------------------------


def test_mean_std_uses_sample_std() -> None:
    runs = {(0, "a"): 0.5, (0, "b"): 0.7, (1, "a"): 0.6, (1, "b"): 0.8}
    mean, std = mean_std_over_runs(runs)
    values = np.array(list(runs.values()))
    assert mean == pytest.approx(0.65)
    assert std == pytest.approx(values.std(ddof=1))
    assert std != pytest.approx(values.std(ddof=0))


def test_single_run_std_is_nan() -> None:
    mean, std = mean_std_over_runs({(0, "a"): 0.4})
    assert mean == 0.4
    assert math.isnan(std)


def test_mean_std_validation() -> None:
    with pytest.raises(ValueError, match="at least one run"):
        mean_std_over_runs({})
    with pytest.raises(ValueError, match=r"score of run \(1, 'b'\) must be finite, got nan"):
        mean_std_over_runs({(0, "a"): 0.5, (1, "b"): float("nan")})


# --- decomposition --------------------------------------------------------------------------------------


def test_decomposition_all_levels() -> None:
    gains = decomposition({"unconstrained": 0.40, "fc": 0.55, "fc+vc": 0.60, "fc+vc+rc": 0.52})
    assert list(gains) == ["format_gain", "validity_gain", "reasoning_gain", "total"]
    assert gains["format_gain"] == pytest.approx(0.15)
    assert gains["validity_gain"] == pytest.approx(0.05)
    assert gains["reasoning_gain"] == pytest.approx(-0.08)
    assert gains["total"] == pytest.approx(0.12)


def test_decomposition_without_rc() -> None:
    gains = decomposition({"unconstrained": 0.40, "fc": 0.55, "fc+vc": 0.60})
    assert gains == pytest.approx({"format_gain": 0.15, "validity_gain": 0.05, "total": 0.20})
    assert "reasoning_gain" not in gains


def test_decomposition_missing_levels_are_absent_not_zero() -> None:
    gains = decomposition({"unconstrained": 0.40, "fc+vc": 0.60})
    assert gains == pytest.approx({"total": 0.20})
    assert decomposition({"fc": 0.5, "fc+vc": 0.6}) == pytest.approx({"validity_gain": 0.1})
    assert decomposition({"unconstrained": 0.5}) == {}
    assert decomposition({}) == {}


def test_decomposition_validation() -> None:
    with pytest.raises(ValueError, match=r"unknown level\(s\) \['fc \+ vc'\]"):
        decomposition({"unconstrained": 0.4, "fc + vc": 0.6})
    with pytest.raises(ValueError, match=r"accuracy of level 'fc' must lie in \[0, 1\], got 55.0"):
        decomposition({"unconstrained": 0.4, "fc": 55.0})
    with pytest.raises(ValueError, match="accuracy of level 'fc' must be finite"):
        decomposition({"fc": float("nan")})


@settings(max_examples=100, deadline=None)
@given(
    acc=st.fixed_dictionaries(
        {"unconstrained": st.floats(0, 1)}, optional={k: st.floats(0, 1) for k in LEVELS[1:]}
    )
)
def test_decomposition_gains_add_up_when_chain_complete(acc: dict[str, float]) -> None:
    gains = decomposition(acc)
    present = [level for level in LEVELS if level in acc]
    assume(len(present) > 1 and present == list(LEVELS[: len(present)]))  # Hypothesis fails if it never holds
    parts = [gains[name] for name in ("format_gain", "validity_gain", "reasoning_gain") if name in gains]
    assert len(parts) == len(present) - 1
    assert sum(parts) == pytest.approx(gains["total"], abs=1e-12)
    assert gains["total"] == pytest.approx(acc[present[-1]] - acc["unconstrained"])


# --- logistic_fit ---------------------------------------------------------------------------------------


def _reference_fit(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Independent MLE: minimise the negative log-likelihood with scipy; SEs from the Fisher information."""
    design = np.column_stack([np.ones_like(x), x])

    def nll(beta: np.ndarray) -> float:
        eta = design @ beta
        return float(np.sum(np.logaddexp(0.0, eta) - y * eta))

    def grad(beta: np.ndarray) -> np.ndarray:
        p = 1.0 / (1.0 + np.exp(-(design @ beta)))
        return design.T @ (p - y)

    beta = minimize(nll, np.zeros(2), jac=grad, method="BFGS", options={"gtol": 1e-10}).x
    p = 1.0 / (1.0 + np.exp(-(design @ beta)))
    information = design.T @ (design * (p * (1 - p))[:, None])
    se = np.sqrt(np.diag(np.linalg.inv(information)))
    pvalues = 2 * norm.sf(np.abs(beta / se))
    return beta, se, pvalues


def test_logistic_fit_matches_independent_mle() -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=300)
    y = (rng.random(300) < 1 / (1 + np.exp(-(-0.5 + 1.2 * x)))).astype(float)
    fit = logistic_fit(x, y)
    beta, se, pvalues = _reference_fit(x, y)
    assert fit.ok and fit.status == "ok" and fit.n == 300
    assert (fit.intercept, fit.slope) == pytest.approx(tuple(beta), abs=1e-5)
    assert (fit.intercept_se, fit.slope_se) == pytest.approx(tuple(se), rel=1e-4)
    assert (fit.intercept_p, fit.slope_p) == pytest.approx(tuple(pvalues), rel=1e-3, abs=1e-12)
    assert 0.8 < fit.slope < 1.6  # recovers the generating slope roughly


def test_logistic_fit_accepts_booleans() -> None:
    x = np.array([0.1, 0.5, 0.2, 0.9, 0.7, 0.3, 0.8, 0.4])
    y = np.array([False, True, True, True, False, False, True, False])
    assert logistic_fit(x, y) == logistic_fit(x, y.astype(float))


@pytest.mark.parametrize(
    ("x", "y", "status"),
    [
        ([1.0, 2.0, 3.0, 4.0], [0, 0, 0, 0], "constant_y"),
        ([1.0, 2.0, 3.0, 4.0], [1, 1, 1, 1], "constant_y"),
        ([2.0, 2.0, 2.0, 2.0], [0, 1, 0, 1], "constant_x"),
        ([1.0, 2.0, 3.0, 4.0], [0, 0, 1, 1], "separation"),
        ([1.0, 2.0, 3.0, 4.0], [1, 1, 0, 0], "separation"),
        ([1.0, 2.0, 2.0, 3.0], [0, 0, 1, 1], "separation"),  # quasi-complete: tie at the boundary
    ],
)
def test_logistic_fit_degenerate_data_flagged_without_warnings(
    x: list[float], y: list[int], status: str
) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fit = logistic_fit(x, y)
    assert fit.status == status
    assert not fit.ok
    assert fit.n == 4
    assert all(
        math.isnan(v)
        for v in (fit.intercept, fit.slope, fit.intercept_se, fit.slope_se, fit.intercept_p, fit.slope_p)
    )


def test_logistic_fit_overlapping_small_data_is_ok() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fit = logistic_fit([1.0, 2.0, 3.0, 4.0, 5.0, 6.0], [0, 1, 0, 1, 1, 1])
    assert fit.ok
    assert fit.slope > 0


def test_logistic_fit_validation() -> None:
    with pytest.raises(ValueError, match=r"^x and y must have the same length 3 vs 2$"):
        logistic_fit([1.0, 2.0, 3.0], [0, 1])
    with pytest.raises(ValueError, match="y must hold only booleans or 0/1, found 2.0"):
        logistic_fit([1.0, 2.0], [0, 2])
    with pytest.raises(ValueError, match="x contains 1 NaN or infinite entries"):
        logistic_fit([1.0, float("nan")], [0, 1])
    with pytest.raises(ValueError, match="at least 2 observations, got 1"):
        logistic_fit([1.0], [1])
    with pytest.raises(ValueError, match=r"x must be 1-D, got shape \(2, 1\)"):
        logistic_fit([[1.0], [2.0]], [0, 1])
