"""Tests for formtax.stats.bootstrap: definition, agreement with scipy, pairing, determinism, validation."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.stats
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from formtax.stats import (
    Interval,
    Resampling,
    bootstrap_replicates,
    complete_cases,
    corrected_replicates,
    crossed_variance,
    paired_bootstrap_contrasts,
    paired_bootstrap_diff,
    percentile_bootstrap_mean,
    ratio_parts,
)
from formtax.stats.bootstrap import _resample_indices


def _bernoulli(shape: tuple[int, int], p: float, seed: int) -> np.ndarray:
    return (np.random.default_rng(seed).random(shape) < p).astype(np.float64)


# --- the definition -------------------------------------------------------------------------------------


def test_replicates_match_naive_ix_definition() -> None:
    scores = np.random.default_rng(5).random((7, 3))
    n_resamples, seed = 300, 11
    naive = np.array(
        [
            scores[np.ix_(items[r], seeds[r])].mean()
            for items, seeds in _resample_indices(7, 3, n_resamples, seed)
            for r in range(items.shape[0])
        ]
    )
    fast = bootstrap_replicates({"x": scores}, n_resamples, seed)["x"]
    np.testing.assert_allclose(fast, naive, rtol=0, atol=1e-12)

    interval = percentile_bootstrap_mean(scores, n_resamples=n_resamples, confidence=0.9, seed=seed,
                                         resampling=Resampling.ITEMS_AND_SEEDS)
    low, high = np.quantile(naive, [0.05, 0.95])
    assert interval.low == pytest.approx(low, abs=1e-12)
    assert interval.high == pytest.approx(high, abs=1e-12)
    assert interval.estimate == pytest.approx(scores.mean(), abs=1e-15)
    # the default: the same draws, scaled about the estimate to the variance components' variance
    corrected = percentile_bootstrap_mean(scores, n_resamples=n_resamples, confidence=0.9, seed=seed)
    scaled = scores.mean() + (naive - scores.mean()) * np.sqrt(crossed_variance(scores) / naive.var())
    low, high = np.quantile(np.clip(scaled, scores.min(), scores.max()), [0.05, 0.95])
    assert (corrected.low, corrected.high) == (pytest.approx(low, abs=1e-12), pytest.approx(high, abs=1e-12))


def test_chunked_replicates_match_naive(monkeypatch: pytest.MonkeyPatch) -> None:
    """Force many small chunks, including a ragged last one, and check nothing is lost or repeated."""
    monkeypatch.setattr("formtax.stats.bootstrap._CHUNK_ENTRIES", 40)  # chunk = 40 // (9 + 4) = 3 replicates
    scores = np.random.default_rng(8).random((9, 4))
    draws = list(_resample_indices(9, 4, 20, 3))
    assert [items.shape[0] for items, _ in draws] == [3, 3, 3, 3, 3, 3, 2]
    naive = np.array(
        [scores[np.ix_(items[r], seeds[r])].mean() for items, seeds in draws for r in range(items.shape[0])]
    )
    fast = bootstrap_replicates({"x": scores}, 20, 3)["x"]
    np.testing.assert_allclose(fast, naive, rtol=0, atol=1e-12)


def test_interval_fields() -> None:
    scores = _bernoulli((30, 4), 0.4, 1)
    interval = percentile_bootstrap_mean(scores, n_resamples=500, confidence=0.9, seed=2)
    assert isinstance(interval, Interval)
    assert (interval.n_items, interval.n_seeds, interval.n_resamples) == (30, 4, 500)
    assert interval.method == "percentile-bootstrap"
    assert interval.confidence == 0.9
    assert interval.estimate == scores.mean()
    with pytest.raises(AttributeError):
        interval.low = 0.0  # type: ignore[misc]


def test_seeds_are_resampled_too() -> None:
    """Items identical, seeds disagree: only seed resampling can produce any spread."""
    scores = np.column_stack([np.ones(50), np.zeros(50)])
    interval = percentile_bootstrap_mean(scores, n_resamples=2000, seed=0)
    assert interval.estimate == 0.5
    assert (interval.low, interval.high) == (0.0, 1.0)


def test_items_are_resampled() -> None:
    """Seeds identical, items disagree: item resampling produces spread."""
    column = _bernoulli((100, 1), 0.5, 3)
    scores = np.repeat(column, 3, axis=1)
    interval = percentile_bootstrap_mean(scores, n_resamples=2000, seed=0)
    assert interval.width > 0.1


def test_constant_scores_give_point_interval() -> None:
    interval = percentile_bootstrap_mean(np.ones((10, 3)), n_resamples=200)
    assert (interval.estimate, interval.low, interval.high) == (1.0, 1.0, 1.0)


def test_boolean_scores_accepted() -> None:
    scores = _bernoulli((20, 2), 0.5, 4)
    assert percentile_bootstrap_mean(scores.astype(bool), n_resamples=300) == percentile_bootstrap_mean(
        scores, n_resamples=300
    )


# --- agreement with scipy (n_seeds = 1) ---------------------------------------------------------------


def test_mean_agrees_with_scipy_percentile_bootstrap() -> None:
    x = _bernoulli((200, 1), 0.3, 42)
    ours = percentile_bootstrap_mean(x, n_resamples=10_000, seed=0)
    ref = scipy.stats.bootstrap(
        (x[:, 0],),
        np.mean,
        n_resamples=10_000,
        method="percentile",
        vectorized=True,
        rng=np.random.default_rng(123),
    ).confidence_interval
    assert abs(ours.low - ref.low) < 0.01
    assert abs(ours.high - ref.high) < 0.01


def test_paired_diff_agrees_with_scipy_paired_bootstrap() -> None:
    rng = np.random.default_rng(7)
    a = (rng.random(200) < 0.6).astype(np.float64)
    # b agrees with a on most items, so pairing matters (unpaired intervals would be much wider).
    b = np.where(rng.random(200) < 0.8, a, 1.0 - a)

    def diff(x: np.ndarray, y: np.ndarray, axis: int) -> np.ndarray:
        return np.mean(x, axis=axis) - np.mean(y, axis=axis)

    ours = paired_bootstrap_diff(a[:, None], b[:, None], n_resamples=10_000, seed=0)
    ref = scipy.stats.bootstrap(
        (a, b),
        diff,
        n_resamples=10_000,
        method="percentile",
        paired=True,
        vectorized=True,
        rng=np.random.default_rng(321),
    ).confidence_interval
    assert ours.estimate == pytest.approx(a.mean() - b.mean())
    assert abs(ours.low - ref.low) < 0.01
    assert abs(ours.high - ref.high) < 0.01


# --- pairing and contrasts ------------------------------------------------------------------------------


def test_paired_diff_of_identical_matrices_is_exactly_zero() -> None:
    a = _bernoulli((40, 3), 0.5, 9)
    interval = paired_bootstrap_diff(a, a.copy(), n_resamples=1000)
    assert (interval.estimate, interval.low, interval.high) == (0.0, 0.0, 0.0)


def test_paired_diff_uses_same_draws_as_single_mean() -> None:
    """b = 1 - a makes every replicate of mean(a) - mean(b) equal 2 * mean(a)* - 1."""
    a = _bernoulli((60, 3), 0.7, 10)
    single = percentile_bootstrap_mean(a, n_resamples=2000, seed=4)
    diff = paired_bootstrap_diff(a, 1.0 - a, n_resamples=2000, seed=4)
    assert diff.low == pytest.approx(2 * single.low - 1, abs=1e-12)
    assert diff.high == pytest.approx(2 * single.high - 1, abs=1e-12)


PAPER_002_CONTRASTS = {
    "delta_mask": ("constrained", "short"),
    "delta_length": ("short", "free"),
    "delta_total": ("constrained", "free"),
}


def _paper_cells() -> dict[str, np.ndarray]:
    return {
        "free": _bernoulli((80, 3), 0.5, 20),
        "short": _bernoulli((80, 3), 0.6, 21),
        "constrained": _bernoulli((80, 3), 0.7, 22),
    }


def test_contrast_replicates_add_up() -> None:
    reps = bootstrap_replicates(_paper_cells(), n_resamples=3000, seed=1)
    delta_mask = reps["constrained"] - reps["short"]
    delta_length = reps["short"] - reps["free"]
    delta_total = reps["constrained"] - reps["free"]
    np.testing.assert_allclose(delta_total, delta_mask + delta_length, rtol=0, atol=1e-12)
    # Replicates genuinely vary, so the identity is not trivially 0 == 0 + 0.
    assert delta_mask.std() > 0 and delta_length.std() > 0


def test_contrasts_are_percentiles_of_shared_replicates() -> None:
    cells = _paper_cells()
    results = paired_bootstrap_contrasts(cells, PAPER_002_CONTRASTS, n_resamples=3000, confidence=0.9, seed=1,
                                         resampling=Resampling.ITEMS_AND_SEEDS)
    assert list(results) == list(PAPER_002_CONTRASTS)
    reps = bootstrap_replicates(cells, n_resamples=3000, seed=1)
    for name, (minuend, subtrahend) in PAPER_002_CONTRASTS.items():
        low, high = np.quantile(reps[minuend] - reps[subtrahend], [0.05, 0.95])
        assert results[name].low == pytest.approx(low, abs=1e-12)
        assert results[name].high == pytest.approx(high, abs=1e-12)
        assert results[name].estimate == pytest.approx(cells[minuend].mean() - cells[subtrahend].mean())
        assert (results[name].n_items, results[name].n_seeds) == (80, 3)
    estimates = {name: interval.estimate for name, interval in results.items()}
    assert estimates["delta_total"] == pytest.approx(estimates["delta_mask"] + estimates["delta_length"])


def test_single_contrast_equals_paired_diff() -> None:
    cells = _paper_cells()
    contrast = paired_bootstrap_contrasts(cells, {"d": ("constrained", "free")}, n_resamples=1000, seed=5)[
        "d"
    ]
    direct = paired_bootstrap_diff(cells["constrained"], cells["free"], n_resamples=1000, seed=5)
    assert contrast.low == pytest.approx(direct.low, abs=1e-12)
    assert contrast.high == pytest.approx(direct.high, abs=1e-12)


# --- determinism ----------------------------------------------------------------------------------------


def test_same_seed_same_interval_different_seed_different_interval() -> None:
    scores = np.random.default_rng(0).random((50, 3))
    first = percentile_bootstrap_mean(scores, n_resamples=1000, seed=3)
    assert percentile_bootstrap_mean(scores, n_resamples=1000, seed=3) == first
    other = percentile_bootstrap_mean(scores, n_resamples=1000, seed=4)
    assert (other.low, other.high) != (first.low, first.high)
    assert other.estimate == first.estimate


def test_contrasts_deterministic() -> None:
    cells = _paper_cells()
    first = paired_bootstrap_contrasts(cells, PAPER_002_CONTRASTS, n_resamples=500, seed=8)
    assert paired_bootstrap_contrasts(cells, PAPER_002_CONTRASTS, n_resamples=500, seed=8) == first


# --- complete_cases -------------------------------------------------------------------------------------


def test_complete_cases_drops_items_with_nan_in_any_matrix() -> None:
    a = np.array([[1.0, 0.0], [np.nan, 1.0], [1.0, 1.0], [0.0, 0.0]])
    b = np.array([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [0.0, 0.0, 0.0], [1.0, np.nan, 0.0]])
    (fa, fb), dropped = complete_cases(a, b)
    assert dropped == 2
    np.testing.assert_array_equal(fa, a[[0, 2]])
    np.testing.assert_array_equal(fb, b[[0, 2]])
    assert fa.dtype == np.float64


def test_complete_cases_without_nan_keeps_everything() -> None:
    a = _bernoulli((5, 2), 0.5, 0)
    (fa,), dropped = complete_cases(a)
    assert dropped == 0
    np.testing.assert_array_equal(fa, a)


def test_complete_cases_errors() -> None:
    with pytest.raises(ValueError, match="at least one matrix"):
        complete_cases()
    with pytest.raises(ValueError, match=r"same number of items: matrix 0 has shape \(3, 2\), matrix 1 has"):
        complete_cases(np.zeros((3, 2)), np.zeros((4, 2)))


def test_nan_refused_with_pointer_to_complete_cases() -> None:
    scores = np.array([[1.0, np.nan], [0.0, 1.0]])
    with pytest.raises(ValueError, match=r"scores contains 1 NaN entries.*complete_cases"):
        percentile_bootstrap_mean(scores)
    with pytest.raises(ValueError, match=r"b contains 1 NaN"):
        paired_bootstrap_diff(np.ones((2, 2)), scores)


# --- validation -----------------------------------------------------------------------------------------


def test_shape_mismatch_message() -> None:
    with pytest.raises(ValueError, match=r"^a and b must have the same shape \(3, 2\) vs \(4, 2\)$"):
        paired_bootstrap_diff(np.zeros((3, 2)), np.zeros((4, 2)))


@pytest.mark.parametrize(
    ("scores", "message"),
    [
        (np.zeros(5), r"must be 2-D \(n_items, n_seeds\), got shape \(5,\); for a single seed"),
        (np.zeros((2, 2, 2)), r"must be 2-D"),
        (np.zeros((0, 3)), r"at least one item and one seed"),
        (np.array([[1.0, np.inf]]), r"1 infinite entries"),
    ],
)
def test_bad_matrices(scores: np.ndarray, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        percentile_bootstrap_mean(scores)


def test_non_numeric_scores() -> None:
    with pytest.raises(TypeError, match="must hold numbers"):
        percentile_bootstrap_mean(np.array([["a", "b"]]))


@pytest.mark.parametrize("confidence", [0.0, 1.0, 1.5, -0.1])
def test_bad_confidence(confidence: float) -> None:
    with pytest.raises(ValueError, match="confidence must lie strictly between 0 and 1"):
        percentile_bootstrap_mean(np.ones((3, 1)), confidence=confidence)


def test_bad_n_resamples_and_seed() -> None:
    with pytest.raises(ValueError, match="n_resamples must be at least 1, got 0"):
        percentile_bootstrap_mean(np.ones((3, 1)), n_resamples=0)
    with pytest.raises(TypeError, match="n_resamples must be an integer"):
        percentile_bootstrap_mean(np.ones((3, 1)), n_resamples=10.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="seed must be non-negative"):
        percentile_bootstrap_mean(np.ones((3, 1)), seed=-1)


def test_contrast_validation() -> None:
    cells = _paper_cells()
    with pytest.raises(ValueError, match=r"contrast 'd' names unknown cell 'masked'"):
        paired_bootstrap_contrasts(cells, {"d": ("masked", "free")})
    with pytest.raises(ValueError, match=r"contrast 'd' must be a \(minuend, subtrahend\) pair"):
        paired_bootstrap_contrasts(cells, {"d": ("free",)})  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="at least one"):
        paired_bootstrap_contrasts(cells, {})
    cells["free"] = cells["free"][:10]
    with pytest.raises(
        ValueError, match=r"^cell 'free' and cell 'short' must have the same shape \(10, 3\) vs \(80, 3\)$"
    ):
        paired_bootstrap_contrasts(cells, PAPER_002_CONTRASTS)
    with pytest.raises(ValueError, match="cells must contain at least one"):
        bootstrap_replicates({})


# --- properties -----------------------------------------------------------------------------------------

score_matrices = st.tuples(st.integers(1, 15), st.integers(1, 4)).flatmap(
    lambda shape: st.one_of(
        hnp.arrays(np.float64, shape, elements=st.sampled_from([0.0, 1.0])),
        hnp.arrays(np.float64, shape, elements=st.floats(0.0, 1.0, allow_nan=False, width=32)),
    )
)


@settings(max_examples=60, deadline=None)
@given(scores=score_matrices, seed=st.integers(0, 2**32 - 1), confidence=st.sampled_from([0.8, 0.9, 0.95]))
def test_interval_properties(scores: np.ndarray, seed: int, confidence: float) -> None:
    interval = percentile_bootstrap_mean(scores, n_resamples=400, confidence=confidence, seed=seed)
    tol = 1e-12
    assert interval.low <= interval.high
    assert scores.min() - tol <= interval.low
    assert interval.high <= scores.max() + tol
    assert interval.low - tol <= interval.estimate <= interval.high + tol


@settings(max_examples=30, deadline=None)
@given(
    data=st.tuples(st.integers(1, 12), st.integers(1, 3)).flatmap(
        lambda shape: st.tuples(
            hnp.arrays(np.float64, shape, elements=st.sampled_from([0.0, 1.0])),
            hnp.arrays(np.float64, shape, elements=st.sampled_from([0.0, 1.0])),
        )
    ),
    seed=st.integers(0, 1000),
)
def test_paired_diff_antisymmetric(data: tuple[np.ndarray, np.ndarray], seed: int) -> None:
    a, b = data
    forward = paired_bootstrap_diff(a, b, n_resamples=300, seed=seed)
    backward = paired_bootstrap_diff(b, a, n_resamples=300, seed=seed)
    assert forward.estimate == pytest.approx(-backward.estimate, abs=1e-12)
    assert forward.low == pytest.approx(-backward.high, abs=1e-12)
    assert forward.high == pytest.approx(-backward.low, abs=1e-12)
    assert -1.0 - 1e-12 <= forward.low <= forward.high <= 1.0 + 1e-12


# --- resampling items only (the cluster bootstrap) ------------------------------------------------------


def test_items_only_replicates_keep_every_seed_of_an_item() -> None:
    scores = np.random.default_rng(3).random((6, 4))
    draws = list(_resample_indices(6, 4, 50, 9, Resampling.ITEMS))
    naive = np.array([scores[items[r]].mean() for items, _ in draws for r in range(items.shape[0])])
    fast = bootstrap_replicates({"x": scores}, 50, 9, Resampling.ITEMS)["x"]
    np.testing.assert_allclose(fast, naive, rtol=0, atol=1e-12)
    for _, seeds in draws:
        assert (seeds == np.arange(4)).all()


def test_items_only_agrees_with_scipy_on_item_means() -> None:
    """Resampling items keeping their seeds is scipy's percentile bootstrap of the per-item means."""
    x = _bernoulli((150, 3), 0.4, 17)
    ours = percentile_bootstrap_mean(x, n_resamples=10_000, seed=0, resampling=Resampling.ITEMS)
    ref = scipy.stats.bootstrap(
        (x.mean(axis=1),), np.mean, n_resamples=10_000, method="percentile", vectorized=True,
        rng=np.random.default_rng(5),
    ).confidence_interval
    assert abs(ours.low - ref.low) < 0.01
    assert abs(ours.high - ref.high) < 0.01


def test_crossed_resampling_is_wider_when_seeds_are_independent_per_item() -> None:
    """No seed effect: the crossed bootstrap counts within-item noise twice (Owen 2007), so it is wider."""
    x = _bernoulli((60, 3), 0.5, 21)  # every (item, seed) independent
    crossed = percentile_bootstrap_mean(x, n_resamples=4000, seed=1)
    items = percentile_bootstrap_mean(x, n_resamples=4000, seed=1, resampling=Resampling.ITEMS)
    assert (crossed.high - crossed.low) > 1.2 * (items.high - items.low)


# --- the variance-components correction (issue 37, point 12) ----------------------------------------------


def test_crossed_variance_equals_statsmodels_two_way_anova() -> None:
    """The components come from the two-way ANOVA's mean squares; statsmodels' anova_lm is the oracle."""
    import pandas as pd
    import statsmodels.formula.api as smf
    from statsmodels.stats.anova import anova_lm

    rng = np.random.default_rng(3)
    z = rng.normal(size=(12, 4)) + rng.normal(size=(12, 1)) + 0.5 * rng.normal(size=(1, 4))
    df = pd.DataFrame([{"y": z[i, j], "item": i, "seed": j} for i in range(12) for j in range(4)])
    table = anova_lm(smf.ols("y ~ C(item) + C(seed)", data=df).fit())
    ms = table["sum_sq"] / table["df"]
    ms_item, ms_seed, ms_noise = ms["C(item)"], ms["C(seed)"], ms["Residual"]
    want = (max(0.0, (ms_item - ms_noise) / 4) / 12 + max(0.0, (ms_seed - ms_noise) / 12) / 4
            + ms_noise / 48)
    assert crossed_variance(z) == pytest.approx(want, rel=1e-10)
    assert crossed_variance(z[:, :1]) == pytest.approx(z[:, 0].var(ddof=1) / 12)  # one seed: items only


def test_the_correction_removes_the_pigeonhole_over_count() -> None:
    """Y = a_i + b_j + e_ij: the true variance of the mean is s_a/I + s_b/S + s_e/(I S). The crossed bootstrap's
    own variance over-counts the noise (Owen 2007: by about 2 s_e/(I S)); the components' estimate does not,
    beyond the upward bias of truncating negative components at 0 (here, a weak item effect and 3 seeds, about
    half the variance; chosen: the untruncated, unbiased total leans on a seed mean square of 2 degrees of
    freedom and collapsed D_paired's interval, 0.77 coverage in bench/calibration.py's world)."""
    rng = np.random.default_rng(0)
    n_i, n_s, s_a, s_b, s_e = 30, 3, 0.04, 0.0, 1.0  # independent seeds: formtax's per-request sampling
    truth = s_a / n_i + s_b / n_s + s_e / (n_i * n_s)
    ours, crossed = [], []
    for k in range(300):
        z = (rng.normal(0, np.sqrt(s_a), (n_i, 1)) + rng.normal(0, np.sqrt(s_b), (1, n_s))
             + rng.normal(0, np.sqrt(s_e), (n_i, n_s)))
        ours.append(crossed_variance(z))
        crossed.append(bootstrap_replicates({"z": z}, 400, k, Resampling.ITEMS_AND_SEEDS)["z"].var())
    assert truth * 0.95 <= np.mean(ours) <= truth * 1.6
    # the crossed draw's variance is the plug-in (divisor n) of each component, the noise in all three
    plug_in = ((n_i - 1) / n_i * (s_a + s_e / n_s) / n_i + (n_s - 1) / n_s * (s_b + s_e / n_i) / n_s
               + (n_i - 1) * (n_s - 1) / (n_i * n_s) * s_e / (n_i * n_s))
    assert np.mean(crossed) == pytest.approx(plug_in, rel=0.1)
    assert np.mean(crossed) > 2.0 * truth and np.mean(crossed) > 1.3 * np.mean(ours)


def test_ratio_parts_linearise_the_ratio() -> None:
    rng = np.random.default_rng(1)
    num, den = rng.random((20, 3)), 1.0 + rng.random((20, 3))
    reps = bootstrap_replicates({"n": num, "d": den}, 2000, 0, Resampling.ITEMS_AND_SEEDS)
    raw, est, infl, lin = ratio_parts(reps["n"], reps["d"], num, den)
    assert est == pytest.approx(num.mean() / den.mean()) and infl.mean() == pytest.approx(0.0, abs=1e-12)
    assert np.corrcoef(raw, lin)[0, 1] > 0.99  # the linearisation tracks the ratio's replicates
    out = corrected_replicates(raw, est, infl, lin)
    assert out.var() == pytest.approx(crossed_variance(infl) * raw.var() / lin.var(), rel=1e-9)
