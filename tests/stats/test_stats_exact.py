"""Issue 49: the small-study rule. Exact intervals below 20 items, checked against statsmodels and scipy, and their
coverage and false-finding rate at 3-8 items against the item worlds' truths (formtax.planted.small_n)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from scipy.stats import binomtest
from statsmodels.stats.proportion import proportion_confint

from formtax.planted.small_n import WORLDS, study
from formtax.stats import exact
from formtax.stats.rules import mean_interval, paired_interval


@pytest.mark.parametrize(("k", "n"), [(0, 3), (1, 3), (3, 3), (2, 5), (7, 15), (0, 15)])
def test_the_mean_interval_is_clopper_pearson_on_items(k, n):
    m = np.zeros((n, 1))
    m[:k] = 1.0
    got = exact.exact_mean_interval(m)
    low, high = proportion_confint(k, n, alpha=0.05, method="beta")
    assert got.low == pytest.approx(low, abs=1e-9) and got.high == pytest.approx(high, abs=1e-9)


def test_runs_count_as_fractions_of_an_item():
    m = np.array([[1.0, 0.0], [1.0, 1.0], [0.0, 0.0]])  # item means 0.5, 1, 0: k = 1.5 of 3
    got = exact.exact_mean_interval(m)
    assert got.low == pytest.approx(exact.clopper_pearson(1.5, 3)[0]) and got.estimate == pytest.approx(0.5)


@pytest.mark.parametrize(("n10", "n01", "n"), [(0, 0, 10), (5, 0, 12), (6, 0, 12), (9, 1, 15), (3, 3, 8), (8, 0, 9)])
def test_the_paired_interval_excludes_0_only_where_the_exact_test_rejects(n10, n01, n):
    a = np.zeros((n, 1))
    b = np.zeros((n, 1))
    a[:n10] = 1.0
    b[n10:n10 + n01] = 1.0
    got = exact.exact_paired_interval(a, b)
    assert got.low <= got.estimate <= got.high
    assert got.estimate == pytest.approx((n10 - n01) / n)
    if got.low > 0 or got.high < 0:  # theta's interval at 1 - 0.8 alpha excludes 1/2: McNemar rejects at 0.04
        assert binomtest(n10, n10 + n01, 0.5).pvalue < 0.8 * 0.05 + 1e-12


def test_the_issue_example_is_not_called_a_difference():
    """3 items x 2 variants, one correct cell: the corrected bootstrap printed [0.03, 0.58] beside p = 1."""
    a = np.array([[1.0, 0.0], [0.0, 0.0], [0.0, 0.0]])
    b = np.zeros((3, 2))
    got = paired_interval(a, b, 2000, 0)
    assert got.method == exact.EXACT_PAIRED_METHOD
    assert got.low < 0 < got.high


def test_the_rule_switches_at_20_items():
    rng = np.random.default_rng(0)
    small = (rng.random((19, 1)) < 0.5).astype(float)
    large = (rng.random((20, 1)) < 0.5).astype(float)
    assert mean_interval(small, 500, 0).method == exact.EXACT_METHOD
    assert mean_interval(large, 500, 0).method != exact.EXACT_METHOD
    assert not exact.applies(np.full((5, 1), 2.0))  # a score outside [0, 1] is not a share


@pytest.mark.parametrize(("world", "n_items", "n_runs"), list(itertools.product(
    ["zero, items 0.05-0.95", "0.02 vs 0", "0.98 vs 1", "+0.2, items 0.1-0.7", "0.75 vs 0.25"], [3, 5, 8], [1, 3])))
def test_small_studies_cover_and_make_no_false_findings(world, n_items, n_runs):
    r = study(WORLDS[world](), n_items, n_runs, 300, n_resamples=200)
    assert r.cell_coverage >= 0.93 and r.paired_coverage >= 0.93, r
    if r.zero_effect:
        assert r.distinguishable <= 0.05, r


def test_the_bootstrap_alone_under_covers_at_5_items():
    """The check above can fail: without the exact rule, paired coverage at 5 items x 1 run is under 0.93."""
    r = study(WORLDS["+0.2, items 0.1-0.7"](), 5, 1, 300, n_resamples=200, exact_below=0)
    assert r.paired_coverage < 0.93, r
