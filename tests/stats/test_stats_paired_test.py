"""The per-item paired test: McNemar's exact test at one seed (statsmodels), seeds never inflate it, exactness."""

from __future__ import annotations

import numpy as np
import pytest
from statsmodels.stats.contingency_tables import mcnemar

from formtax.stats.paired_test import EXACT_MAX_ITEMS, format_p, paired_item_test


def _pair(seed: int, n: int = 30) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return (rng.random((n, 1)) < 0.6).astype(float), (rng.random((n, 1)) < 0.45).astype(float)


@pytest.mark.parametrize("seed", range(6))
def test_one_seed_is_mcnemars_exact_test(seed):
    a, b = _pair(seed)
    b01, b10 = int(((a == 0) & (b == 1)).sum()), int(((a == 1) & (b == 0)).sum())
    ref = mcnemar([[0, b10], [b01, 0]], exact=True).pvalue
    assert paired_item_test(a, b).p_value == pytest.approx(ref, rel=1e-12)


def test_identical_seeds_do_not_inflate_the_evidence():
    """The issue's case: 2 of 10 items discordant, 5 identical (greedy) seeds: p stays 0.5, not 1.6e-7."""
    a = np.zeros((10, 5))
    b = np.zeros((10, 5))
    a[:2] = 1.0
    one = paired_item_test(a[:, :1], b[:, :1]).p_value
    assert paired_item_test(a, b).p_value == pytest.approx(one) == pytest.approx(0.5)
    flattened = mcnemar([[0, 10], [0, 0]], exact=True).pvalue  # what flattening item x seed pairs gave
    assert flattened < 0.01


def test_many_discordant_real_valued_items_use_seeded_monte_carlo():
    rng = np.random.default_rng(3)
    a, b = rng.random((60, 3)), rng.random((60, 3))
    r = paired_item_test(a, b, seed=1)
    assert not r.exact and r.n_discordant > EXACT_MAX_ITEMS
    assert r.p_value == paired_item_test(a, b, seed=1).p_value
    assert 0.0 < r.p_value <= 1.0


def test_no_difference_is_p_one_and_p_values_print_without_zero():
    a = np.ones((4, 2))
    assert paired_item_test(a, a).p_value == 1.0
    assert format_p(3e-9) == "<1e-6" and format_p(0.0) == "<1e-6" and format_p(0.0391) == "0.0391"


def test_exact_distribution_matches_brute_force_enumeration():
    """The convolution equals enumerating all 2**n sign assignments (0/1 scores, 3 runs, 10 items)."""
    import itertools

    rng = np.random.default_rng(11)
    a, b = (rng.random((10, 3)) < 0.7).astype(float), (rng.random((10, 3)) < 0.4).astype(float)
    d = a.mean(axis=1) - b.mean(axis=1)
    d = d[np.abs(d) > 1e-12]
    obs = abs(d.sum())
    sums = [abs(np.dot(signs, d)) for signs in itertools.product((1, -1), repeat=d.size)]
    brute = np.mean(np.array(sums) >= obs - 1e-9)
    assert paired_item_test(a, b).p_value == pytest.approx(brute, rel=1e-12)
    assert paired_item_test(a, b).exact


def test_one_discordant_item_is_p_one():
    a, b = np.zeros((5, 2)), np.zeros((5, 2))
    a[0, 0] = 1.0
    assert paired_item_test(a, b).p_value == 1.0
