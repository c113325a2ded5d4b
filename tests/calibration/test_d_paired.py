"""Paper 002's D_paired: its exact truth (against enumeration), the lab's estimate next to it, and its coverage."""

from __future__ import annotations

import itertools
import math

import pytest

from formtax.planted.calibrate import calibrate
from formtax.planted.languages import PairTruth, d_paired_coverage, d_paired_truth
from formtax.planted.world import write_world
from formtax.planted.worlds import BUILTIN


def test_truth_equals_enumeration_of_the_four_cells():
    """E[b - c] / E[S] summed over pairs, by enumerating the 16 outcomes of (short_1, con_1, short_2, con_2)."""
    pairs = [PairTruth("a", 0.9, 0.7, 0.6, 0.2), PairTruth("b", 0.3, 0.5, 0.8, 0.9), PairTruth("c", 1.0, 1.0, 0.5, 0.0)]
    eb = ec = es = 0.0
    for t in pairs:
        for s1, c1, s2, c2 in itertools.product((0, 1), repeat=4):
            p = math.prod(q if x else 1 - q for x, q in zip((s1, c1, s2, c2), (t.s1, t.c1, t.s2, t.c2), strict=True))
            both = s1 and s2
            es += p * both
            eb += p * (both and c1 and not c2)
            ec += p * (both and c2 and not c1)
    assert d_paired_truth(pairs) == pytest.approx((eb - ec) / es, abs=1e-12)


def test_calibrate_puts_d_paired_next_to_its_truth(tmp_path):
    w = BUILTIN["abstention-languages"](n_items=12, tokenizer="bytes")
    cal = calibrate(str(write_world(w, tmp_path / "w.json")), tmp_path / "o", seeds=6, temperature=1.0,
                    n_resamples=500)
    row = {r.quantity: r for r in cal.rows}["d_paired/short/constrained"]
    assert not math.isnan(row.exact) and not math.isnan(row.estimate)
    assert row.covered is True, row
    assert cal.fit_p is not None and cal.fit_p > 1e-3


def test_coverage_study_of_d_paired_is_sane():
    pairs = [PairTruth(str(k), 0.8, 0.7 + 0.02 * (k % 5), 0.7, 0.5) for k in range(20)]
    cov = d_paired_coverage(pairs, n_studies=40, n_items=30, n_seeds=2, n_resamples=300)
    assert cov.truth == pytest.approx(d_paired_truth(pairs))
    assert set(cov.by_rule) == {"items", "items+seeds", "items+seeds-corrected"}
    assert 0.75 <= cov.by_rule["items"]["coverage"] <= 1.0
    assert cov.by_rule["items+seeds"]["mean_width"] > cov.by_rule["items"]["mean_width"]
    # the corrected default sits between the conservative crossed rule and the cluster bootstrap
    assert (cov.by_rule["items+seeds"]["mean_width"] > cov.by_rule["items+seeds-corrected"]["mean_width"]
            >= cov.by_rule["items"]["mean_width"] * 0.95)
