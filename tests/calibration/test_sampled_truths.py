"""Sampled runs against their exact output distributions, request by request (Deco-G, suffix-beam, suffix-last).

The accuracy's interval only sees a mean; ``distribution_fit`` compares every request's spread of outputs over its
seeds with the exact distribution of :mod:`formtax.planted.exact` / :mod:`formtax.planted.exact_fem` (Pearson's
chi-square, Bonferroni over requests). Seeded, so deterministic: a failure is a real disagreement (or a 1-in-1000
draw, which a change of seeds would not hide twice).
"""

from __future__ import annotations

import pytest

from formtax.planted.calibrate import calibrate
from formtax.planted.world import write_world
from formtax.planted.worlds import BUILTIN


@pytest.mark.parametrize(("world", "strategies", "n_items"), [
    ("decog-format", ["decog@vc"], 3),
    ("suffix-branch", ["suffix-beam", "suffix-last"], 2),
])
def test_sampled_outputs_follow_the_exact_distribution(tmp_path, world, strategies, n_items):
    w = BUILTIN[world](n_items=n_items, tokenizer="bytes")
    cal = calibrate(str(write_world(w, tmp_path / "w.json")), tmp_path / "o", strategies=strategies, seeds=60,
                    temperature=1.0, n_resamples=200)
    assert cal.max_unresolved < 1e-6
    assert cal.fit_p is not None and cal.fit_p > 1e-3, cal.fit_p
    for row in cal.rows:
        if row.quantity.endswith("acc_strict"):
            assert row.low - 0.05 <= row.exact <= row.high + 0.05, row


def test_a_wrong_truth_is_caught(tmp_path, monkeypatch):
    """The fit has power: a truth that misplaces a fifth of the mass (one outcome's probability moved to
    another) is rejected on the same records."""
    import formtax.planted.calibrate as cal_mod
    from formtax.planted.truth import RequestTruth

    real = cal_mod.grid_truth

    def skewed(*a, **k):
        g = real(*a, **k)
        for r in g.requests:
            outs = sorted(r.outcomes, key=lambda o: -o.p)
            if len(outs) >= 2:
                move = min(0.2, outs[1].p)
                outs[0] = type(outs[0])(**{**outs[0].__dict__, "p": outs[0].p + move})
                outs[1] = type(outs[1])(**{**outs[1].__dict__, "p": outs[1].p - move})
            g.by_key[(r.planned.spec.spec, r.planned.item.id, r.planned.prompt_variant, 0)] = RequestTruth(
                r.planned, outs, r.unresolved)
        return g

    monkeypatch.setattr(cal_mod, "grid_truth", skewed)
    w = BUILTIN["decog-format"](n_items=3, tokenizer="bytes")
    cal = calibrate(str(write_world(w, tmp_path / "w.json")), tmp_path / "o", strategies=["decog@vc"], seeds=60,
                    temperature=1.0, n_resamples=200)
    assert cal.fit_p is not None and cal.fit_p < 1e-3, cal.fit_p


@pytest.mark.parametrize("world", ["decog-format", "suffix-branch"])
def test_greedy_on_the_real_tokenizer_reproduces_the_exact_output(tmp_path, world):
    """SmolLM2's tokenizer (space-prefixed tokens, multi-byte DFA classes): every record is the exact output."""
    w = BUILTIN[world](n_items=6, tokenizer="smollm2")
    cal = calibrate(str(write_world(w, tmp_path / "w.json")), tmp_path / "o", n_resamples=200)
    assert cal.records_differing == 0
    rows = {r.quantity: r for r in cal.rows}
    for r in cal.rows:
        assert abs(r.exact - r.estimate) < 1e-6, r  # the tables keep 6 digits
    if world == "decog-format":  # the noline items get their answer line: the planted format gain, exactly
        assert rows["paired/decog@none/decog@vc/diff"].exact == pytest.approx(-2 / 6)
