"""The planted backend and its exact truths: the lab recovers each planted effect (byte tokenizer: fast)."""

from __future__ import annotations

import json
import math

import pytest

from formtax.planted.backend import PlantedBackend
from formtax.planted.calibrate import calibrate, coverage_study, study_config
from formtax.planted.task import planted_task
from formtax.planted.truth import grid_truth
from formtax.planted.world import WorldError, load_world, parse_world, write_world
from formtax.planted.worlds import BUILTIN


@pytest.mark.parametrize("name", sorted(BUILTIN))
def test_greedy_run_reproduces_exact_truth(tmp_path, name):
    world = BUILTIN[name](tokenizer="bytes")
    path = write_world(world, tmp_path / "w.json")
    cal = calibrate(str(path), tmp_path / "out", n_resamples=500)
    assert cal.records_differing == 0
    for row in cal.rows:
        assert math.isclose(row.exact, row.estimate, abs_tol=1e-6), row
        assert row.covered is not False, row


def test_planted_effects_recovered(tmp_path):
    world = BUILTIN["reasoning-rc"](tokenizer="bytes")
    cal = calibrate(str(write_world(world, tmp_path / "w.json")), tmp_path / "o", n_resamples=500)
    rows = {r.quantity: r for r in cal.rows}
    assert rows["decomposition/inwriting/reasoning_gain"].estimate == pytest.approx(0.3)
    world = BUILTIN["abstention"](tokenizer="bytes")
    cal = calibrate(str(write_world(world, tmp_path / "a.json")), tmp_path / "p", n_resamples=500)
    rows = {r.quantity: r for r in cal.rows}
    assert rows["paired/constrained/short/diff"].estimate == pytest.approx(0.3)


def test_sampled_run_estimate_matches_exact(tmp_path):
    world = BUILTIN["abstention"](n_items=20, tokenizer="bytes")
    path = write_world(world, tmp_path / "w.json")
    cal = calibrate(str(path), tmp_path / "o", strategies=["free", "short", "constrained"], seeds=10,
                    temperature=1.0, n_resamples=500)
    rows = [row for row in cal.rows if row.quantity.startswith("accuracy")]
    assert len(rows) >= 3  # one per strategy at least
    for row in rows:
        assert abs(row.exact - row.estimate) < 0.12, row  # 200 sampled records per cell


def test_coverage_study_runs_and_is_sane(tmp_path):
    world = BUILTIN["abstention"](n_items=30, tokenizer="bytes")
    path = write_world(world, tmp_path / "w.json")
    w = load_world(path)
    cfg = study_config(w, path, ["short", "constrained"], temperature=1.0)
    g = grid_truth(PlantedBackend(w, str(path)), planted_task(w, str(path)), cfg)
    cov = coverage_study(g, n_studies=40, n_items=30, n_seeds=2, n_resamples=300, null_of="constrained")
    assert 0.75 <= cov.by_type["items"]["acc_strict"]["coverage"] <= 1.0
    assert set(cov.by_type) == {"items", "items+seeds", "items+seeds-corrected"}
    # the crossed bootstrap is never narrower on the same studies when seeds are independent per item; the
    # corrected default removes its over-count
    width = {rule: cov.by_type[rule]["acc_strict"]["mean_width"] for rule in cov.by_type}
    assert width["items+seeds"] > width["items+seeds-corrected"] and width["items+seeds"] > width["items"]
    assert cov.paired_ks is not None and cov.paired_reject_05 is not None
    assert "accuracy/constrained/parse_rate_strict" in cov.degenerate  # the mask always gives an answer line


@pytest.mark.parametrize(("name", "format_gain", "validity_gain"),
                         [("format-validity", 0.2, 0.2), ("letters-validity", 0.2, 0.4)])
@pytest.mark.parametrize("tokenizer", ["bytes", "smollm2"])
def test_strict_scoring_shows_the_planted_validity_gain(tmp_path, name, format_gain, validity_gain, tokenizer):
    """Paper 003 A.4.1: 28.00, H E N E and a dropped final letter are strict failures that VC repairs."""
    world = BUILTIN[name](n_items=20, tokenizer=tokenizer)
    cal = calibrate(str(write_world(world, tmp_path / "w.json")), tmp_path / "o", n_resamples=300)
    rows = {r.quantity: r for r in cal.rows}
    assert cal.records_differing == 0
    for gain, planted in (("format_gain", format_gain), ("validity_gain", validity_gain)):
        row = rows[f"decomposition/inwriting/{gain}"]
        assert row.planted == pytest.approx(planted)
        assert row.exact == pytest.approx(planted) and row.estimate == pytest.approx(planted), row


def test_bad_worlds_are_refused_with_the_item_and_field(tmp_path):
    base = {"name": "x", "tokenizer": "bytes",
            "items": [{"id": "a", "question": "Q1?", "gold": "1",
                       "continuations": [{"text": "The answer is: 1", "p": 0.5}]}]}
    with pytest.raises(WorldError, match="item a, field continuations: probabilities sum to 0.5"):
        parse_world(base)
    bad = json.loads(json.dumps(base))
    bad["items"][0]["continuations"][0]["p"] = 2
    with pytest.raises(WorldError, match="item a, field continuations\\[0\\].p"):
        parse_world(bad)
    ok = json.loads(json.dumps(base))
    ok["items"][0]["continuations"][0]["p"] = 1.0
    ok["items"][0]["gold"] = "one"
    with pytest.raises(WorldError, match="item a, field gold"):
        planted_task(parse_world(ok))
    (tmp_path / "w.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(WorldError, match="not valid JSON"):
        load_world(tmp_path / "w.json")


@pytest.mark.parametrize("tokenizer", ["bytes", "smollm2"])
def test_json_answer_forms_recover_the_papers_rules(tmp_path, tokenizer):
    """Issue 37, points 1 and 3: NL-to-Format's unconstrained second call is parsed whole (pretty-printed and
    newline-led objects parse; a prefaced one does not), and FC admits the unquoted number the prompt shows. The
    planted numbers are the world author's, from the paper's rules; the old first-line rule gave none 0.2 and the
    string-only FC refused every object."""
    world = BUILTIN["json-answer-forms"](n_items=20, tokenizer=tokenizer)
    cal = calibrate(str(write_world(world, tmp_path / "w.json")), tmp_path / "o", n_resamples=300)
    assert cal.records_differing == 0
    planted = [r for r in cal.rows if r.planted is not None and not math.isnan(r.planted)]
    assert len(planted) == 4
    for row in planted:
        assert row.exact == pytest.approx(row.planted) and row.estimate == pytest.approx(row.planted), row
