"""Paper 002's remaining analyses (studies/abstention/extra.py) on hand-made records and planted data: the
retention ratio, the masked-mass breakpoint, the tool-naming shift, and the cell regression with its guard."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import statsmodels.api as sm
from test_metatool_report import _record

from formtax.report import load_records
from formtax.studies.abstention.extra import (
    GUARD,
    breakpoint_table,
    cells_table,
    hinge_fit,
    naming_table,
    retention_table,
)


def _write(tmp_path, recs):
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "records.jsonl").write_text("".join(r.model_dump_json() + "\n" for r in recs))
    return load_records(tmp_path)


def _run(tmp_path, outcomes, language="en"):
    """outcomes: per position, (free, short, constrained) output text of an abstention item."""
    recs = []
    for pos, texts in outcomes.items():
        for strategy, text in zip(("free", "short", "constrained"), texts, strict=True):
            if text is not None:
                recs.append(_record("x", strategy, text, language, pos))
    return recs


def test_retention_is_the_ratio_of_accuracies_and_its_language_difference(tmp_path):
    en = {0: ("a", "None", "None"), 1: ("a", "None", "Zapier"), 2: ("None", "None", "Chess"),
          3: ("a", "None", "None"), 4: ("a", "Zapier", "None")}  # short 4/5, constrained 3/5, free 1/5
    ko = {0: ("a", "None", "None"), 1: ("a", "None", "None"), 2: ("None", "None", "None"),
          3: ("a", "None", "Chess"), 4: ("a", "None", "None")}  # short 5/5, constrained 4/5
    df = _write(tmp_path, _run(tmp_path, en) + _run(tmp_path, ko, "ko"))
    t = retention_table(df, 500, 0)
    assert t is not None
    row = t[(t["language"] == "en") & (t["item_type"] == "abstain") & (t["contrast"] == "delta_mask")].iloc[0]
    assert (row["acc_minuend"], row["acc_subtrahend"]) == (pytest.approx(0.6), pytest.approx(0.8))
    assert row["retention"] == pytest.approx(0.75) and row["low"] <= 0.75 <= row["high"]
    total = t[(t["language"] == "en") & (t["contrast"] == "delta_total")].iloc[0]
    assert total["retention"] == pytest.approx(0.6 / 0.2)
    ko_row = t[(t["language"] == "ko") & (t["contrast"] == "delta_mask")].iloc[0]
    assert ko_row["retention"] == pytest.approx(0.8)
    assert ko_row["retention_diff"] == pytest.approx(0.8 - 0.75)
    assert ko_row["diff_low"] <= ko_row["retention_diff"] <= ko_row["diff_high"]
    assert np.isnan(row["retention_diff"])  # the base language has no difference


def test_the_naming_shift_counts_outputs_that_name_a_tool_and_the_first_candidate(tmp_path):
    out = {0: ("None", "None", "Zapier"), 1: ("None", "None", "Chess"), 2: ("None, not Zapier", "None", "None"),
           3: ("I cannot say", "None", "Zapier")}
    t = naming_table(_write(tmp_path, _run(tmp_path, out)), 500, 0)
    assert t is not None
    tools = t[t["measure"] == "names_a_tool"].iloc[0]
    first = t[t["measure"] == "names_first_candidate"].iloc[0]
    assert (tools["free"], tools["short"], tools["constrained"]) == (0.25, 0.0, 0.75)
    assert (first["free"], first["constrained"]) == (0.25, 0.5)  # Zapier is the first candidate offered
    assert tools["shift_total"] == pytest.approx(0.5) and tools["shift_mask"] == pytest.approx(0.75)
    assert tools["shift_total_low"] <= 0.5 <= tools["shift_total_high"]


def test_the_hinge_recovers_a_planted_breakpoint_and_its_interval_covers_it():
    rng = np.random.default_rng(3)
    x = rng.uniform(0, 1, 120)
    y = np.where(x > 0.48, -2.0 * (x - 0.48), 0.0) + rng.normal(0, 0.05, x.size)
    tau, level, slope, sse = hinge_fit(x, y)
    assert tau == pytest.approx(0.48, abs=0.04) and slope == pytest.approx(-2.0, abs=0.3)
    assert level == pytest.approx(0.0, abs=0.03)
    # the grid minimum is the brute-force minimum of the same model over the grid
    best = min(
        (float(((y - np.polyval(np.polyfit(np.maximum(0, x - t), y, 1), np.maximum(0, x - t))) ** 2).sum()), t)
        for t in np.round(np.linspace(0, 1, 101), 2) if 3 <= (x <= t).sum() <= x.size - 3)
    assert sse == pytest.approx(best[0]) and tau == pytest.approx(best[1])
    assert hinge_fit(x[:5], y[:5]) is None  # fewer than 3 items on each side of every breakpoint


def test_breakpoint_table_on_per_item_masses(monkeypatch):
    """The table fits the per-item penalty against the short masked mass (here a planted hinge)."""
    import formtax.studies.abstention.extra as extra

    rng = np.random.default_rng(0)
    mass = rng.uniform(0, 1, 40)
    per_item = pd.DataFrame({"item_id": [f"{i:03d}-abstain" for i in range(40)], "language": "en",
                             "item_type": "abstain", "masked_mass": mass,
                             "penalty": np.where(mass > 0.3, -(mass - 0.3), 0.0)})
    monkeypatch.setattr(extra, "study_frame", lambda df: pd.DataFrame({"language": ["en"]}))
    monkeypatch.setattr(extra, "per_item_frame", lambda sf: per_item)
    t = breakpoint_table(pd.DataFrame(), 300, 0)
    row = t.iloc[0]
    assert row["status"] == "ok" and row["breakpoint"] == pytest.approx(0.3, abs=0.02)
    assert row["low"] <= row["breakpoint"] <= row["high"] and row["sse_hinge"] < row["sse_line"]
    assert list(t["allowed_set"]) == ["encoded"]  # a run without the wider set's masses: one row
    # the wider allowed set leaves less mass outside it: its masses are smaller, and the hinge moves with them
    per_item["masked_mass_prefixes"] = 0.5 * mass
    t = breakpoint_table(pd.DataFrame(), 300, 0).set_index("allowed_set")
    assert t.loc["encoded", "breakpoint"] == pytest.approx(0.3, abs=0.02)
    assert t.loc["prefixes", "breakpoint"] == pytest.approx(0.15, abs=0.02)


def test_the_papers_allowed_set_is_each_options_first_encoded_token():
    """Issue 37, point 11: the masked mass's allowed set is the first token of each option's encoding, bare and
    space-prefixed (paper 002, section 3.5); the wider prefix set contains it."""
    from formtax.backends.fake import FakeBackend
    from formtax.strategies.firstmass import allowed_first_tokens, prefix_first_tokens

    tok = FakeBackend().tokenizer  # bytes: the first token is the first byte
    opts = ["Zapier", "None"]
    allowed = allowed_first_tokens(tok, opts)
    assert sorted(int(i) for i in allowed.nonzero()) == sorted({ord("Z"), ord("N"), ord(" ")})
    wider = prefix_first_tokens(tok, opts)
    assert bool((wider | allowed).eq(wider).all()) and int(wider.sum()) >= int(allowed.sum())


def _model_frame(tmp_path, name, short_right, con_right):
    """One model's abstention cell: 4 positions, short right on the first short_right, constrained on
    con_right."""
    out = {p: ("x", "None" if p < short_right else "Zapier", "None" if p < con_right else "Chess") for p in range(4)}
    recs = [r.model_copy(update={"model": name}) for r in _run(tmp_path, out)]
    df = _write(tmp_path / name, recs)
    return df.assign(task=f"metatool | {name}")


def test_the_cell_regression_is_withheld_below_the_guard_and_fitted_above(tmp_path):
    specs = [(4, 4), (3, 1), (2, 2), (4, 1), (1, 0), (3, 3)]
    frames = [_model_frame(tmp_path, f"m{k}", s, c) for k, (s, c) in enumerate(specs)]
    few = cells_table(pd.concat(frames[: GUARD - 1], ignore_index=True), 200, 0)
    fit = few[few["row"] == "fit"].iloc[0]
    assert fit["status"].startswith("withheld") and np.isnan(fit["slope"]) and fit["n_models"] == GUARD - 1
    many = cells_table(pd.concat(frames, ignore_index=True), 200, 0)
    cells = many[many["row"] == "cell"]
    assert len(cells) == len(specs)
    x = np.array([s / 4 for s, _ in specs])
    y = np.array([(c - s) / 4 for s, c in specs])
    assert cells["short_abstain_acc"].tolist() == pytest.approx(x.tolist())
    assert cells["delta_mask"].tolist() == pytest.approx(y.tolist())
    ols = sm.OLS(y, sm.add_constant(x)).fit()
    fit = many[many["row"] == "fit"].iloc[0]
    assert fit["status"] == "ok" and fit["slope"] == pytest.approx(ols.params[1])
    assert fit["slope_low"] <= fit["slope"] <= fit["slope_high"]
    one = cells_table(frames[0].assign(task="metatool"), 200, 0)  # a single model's own report
    assert one.iloc[0]["model"] == "m0" and one.iloc[-1]["status"].startswith("withheld")
