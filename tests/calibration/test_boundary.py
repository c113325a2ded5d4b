"""Intervals near 0 and 1: 0/20 correct no longer prints [0, 0] (nor 0/16, which takes the small-study rule),
and coverage holds at 0.01, 0.5 and 0.99.

Synthetic studies of 40 items x 3 seeds, every (item, seed) correct with probability p, through the report's own
accuracy table. Before the Wilson rule, p = 0.01 left 30% of studies at 0/120 with the interval [0, 0] (coverage
about 0.70).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from formtax.report.tables import accuracy_table
from formtax.stats import Resampling


def _frame(rng: np.random.Generator, p: float, n_items: int = 40, n_seeds: int = 3) -> pd.DataFrame:
    rows = []
    for i in range(n_items):
        for s in range(n_seeds):
            ok = float(rng.random() < p)
            rows.append({"task": "t", "strategy": "a", "base_strategy": "a", "level": "vc", "rc": False,
                         "item_id": f"i{i}", "seed": s, "prompt_variant": "t1f1", "scored": True,
                         "score_strict": ok, "score_lenient": ok, "parse_ok_strict": 1.0, "format_ok": 1.0})
    return pd.DataFrame(rows)


def coverage(p: float, rule: Resampling, studies: int, seed: int = 0) -> float:
    rng = np.random.default_rng(seed)
    hits = 0
    for k in range(studies):
        row = accuracy_table(_frame(rng, p), 300, k, rule).iloc[0]
        hits += row["acc_strict_low"] - 1e-12 <= p <= row["acc_strict_high"] + 1e-12
    return hits / studies


def test_zero_of_twenty_is_not_a_point():
    df = _frame(np.random.default_rng(0), 0.0, n_items=20, n_seeds=1)
    row = accuracy_table(df, 200, 0).iloc[0]
    assert row["acc_strict"] == 0.0 and row["acc_strict_low"] == 0.0
    assert row["acc_strict_high"] == pytest.approx(0.1611, abs=1e-3)  # Wilson, 20 items
    assert "Wilson" in row["interval_method"]


def test_zero_of_sixteen_is_clopper_pearson():
    """Below 20 items the small-study rule (formtax.stats.exact): 0/16 gives [0, 0.206]."""
    row = accuracy_table(_frame(np.random.default_rng(0), 0.0, n_items=16, n_seeds=1), 200, 0).iloc[0]
    assert row["acc_strict_low"] == 0.0 and row["acc_strict_high"] == pytest.approx(0.2059, abs=1e-3)


@pytest.mark.parametrize("p", [0.01, 0.99])
def test_coverage_holds_at_the_boundary(p):
    for rule in (Resampling.CORRECTED, Resampling.ITEMS_AND_SEEDS, Resampling.ITEMS):
        c = coverage(p, rule, 120)
        assert c >= 0.9, (p, rule, c)
        assert not math.isnan(c)


def _paired_frame(rng: np.random.Generator, p_a: float, p_b: float, n_items: int = 16) -> pd.DataFrame:
    rows = []
    for name, p in (("a", p_a), ("b", p_b)):
        for i in range(n_items):
            ok = float(rng.random() < p)
            rows.append({"task": "t", "strategy": name, "base_strategy": name, "level": "vc", "rc": False,
                         "item_id": f"i{i}", "seed": 0, "prompt_variant": "t1f1", "scored": True,
                         "score_strict": ok, "score_lenient": ok, "parse_ok_strict": 1.0, "format_ok": 1.0})
    return pd.DataFrame(rows)


def test_a_paired_difference_with_no_discordant_item_is_not_a_point():
    from formtax.report.comparisons import paired_table

    row = paired_table(_paired_frame(np.random.default_rng(0), 0.0, 0.0, n_items=20), 200, 0).iloc[0]
    assert row["diff"] == 0.0
    assert row["diff_low"] == pytest.approx(-0.1611, abs=1e-3) and row["diff_high"] == pytest.approx(0.1611, abs=1e-3)
    assert "Wilson boundary" in row["interval_method"]


def test_paired_coverage_holds_near_the_boundary():
    """True difference 0.04 (a right on 4% of items, b never): most studies of 16 items see no discordant item,
    where the percentile bootstrap printed [0, 0] and missed the truth."""
    from formtax.report.comparisons import pair_difference, paired_table

    rng = np.random.default_rng(1)
    hits = 0
    studies = 200
    for k in range(studies):
        found = pair_difference(paired_table(_paired_frame(rng, 0.04, 0.0), 200, k), "a", "b")  # a - b
        assert found is not None
        _diff, low, high = found
        hits += low - 1e-12 <= 0.04 <= high + 1e-12
    assert hits / studies >= 0.9, hits / studies


def test_decomposition_gains_at_the_boundary_are_not_points():
    from formtax.report.comparisons import decomposition_table

    rows = []
    for level in ("none", "fc", "vc"):
        for i in range(20):
            rows.append({"task": "t", "strategy": f"inwriting@{level}", "base_strategy": "inwriting",
                         "level": level, "rc": False, "item_id": f"i{i}", "seed": 0, "prompt_variant": "t1f1",
                         "scored": True, "score_strict": 0.0, "score_lenient": 0.0, "parse_ok_strict": 1.0, "format_ok": 1.0})
    row = decomposition_table(pd.DataFrame(rows), 200, 0).iloc[0]
    for gain in ("format_gain", "validity_gain", "total_gain"):
        assert row[gain] == 0.0
        assert row[f"{gain}_low"] == pytest.approx(-0.1611, abs=1e-3), gain
        assert row[f"{gain}_high"] == pytest.approx(0.1611, abs=1e-3), gain
