"""formtax.studies.eae.report: the AI/AC/AI+/AC+ table from hand-made records (counts and F1 checked by hand), its
bootstrap (paired, deterministic, containing the estimate), errored records, and write_report + verify."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from formtax.errors import DataError
from formtax.records.schema import ParseRecord, Record
from formtax.report import load_records, verify_report, write_report
from formtax.report.catalog import analyses
from formtax.studies.eae.report import COLUMNS, eae_figure, eae_table
from formtax.studies.eae.scoring import (
    Attachment,
    RuleHeads,
    encode_gold,
    encode_prediction,
    normalize_span,
    sentence_key,
)

TASK = "eae-wikievents"
RULE = RuleHeads()
PASSAGE = "The Taliban killed members of the security forces in Kabul and soldiers in central Maidan Wardak province."
GOLD = {
    "m1": [("Attacker", "The Taliban"), ("Victim", "members")],
    "m2": [("Place", "Kabul")],
    "m3": [("Victim", "soldiers"), ("Place", "in central Maidan Wardak province")],
    "m4": [],
}
# strategy -> item -> parser -> prediction (None: the parse failed)
Prediction = dict[str, str | None] | None
OUTPUTS: dict[str, dict[str, dict[str, Prediction]]] = {
    "decog": {
        "m1": {"strict": {"Attacker": "Taliban", "Victim": "members"}},
        "m2": {"strict": {"Place": "Kabul"}},
        "m3": {"strict": {"Victim": "Maidan Wardak province", "Place": None}},
        "m4": {"strict": {"Victim": "none"}},
    },
    "free": {
        "m1": {"strict": None, "lenient": {"Attacker": "members", "Victim": "The Taliban"}},
        "m2": {"strict": {"Place": "Kabul."}},
        "m3": {"strict": {"Victim": "soldiers", "Place": "Wardak"}},
        "m4": {"strict": {"Victim": "soldiers", "Place": "Herat"}},
    },
}
ERRORED = ("free", "m3", 1)  # (strategy, item, seed) of a crashed request


def in_passage(values: dict[str, str | None]) -> dict[str, bool]:
    key = normalize_span(PASSAGE)
    return {r: v is not None and normalize_span(v) in key for r, v in values.items()}


def parse_of(pred: Prediction) -> ParseRecord:
    if pred is None:
        return ParseRecord(status="no_answer")
    return ParseRecord(status="ok", value=encode_prediction(pred, RULE, in_passage(pred)))


def make_record(strategy: str, item: str, seed: int, gold: str | None = None) -> Record:
    error = "CUDA out of memory" if (strategy, item, seed) == ERRORED else None
    outs = OUTPUTS[strategy][item]
    rec = Record(
        request_id=f"{strategy}-{item}-{seed}",
        task=TASK,
        item_id=item,
        item_hash="h" + item,
        strategy=strategy,
        base_strategy=strategy,
        level="vc" if strategy == "decog" else "none",
        rc=False,
        output_format="reason-answer",
        prompt_variant="t1f1",
        seed=seed,
        shots=0,
        model="fake-model",
        batch_size=1,
        prompt_hash="p",
        prompt=PASSAGE,
        gold=gold if gold is not None else encode_gold(GOLD[item], RULE),
        error=error,
    )
    if error is None:
        strict = parse_of(outs["strict"])
        lenient = parse_of(outs["lenient"]) if "lenient" in outs else strict
        rec.parses = {"strict": strict, "lenient": lenient}
        rec.scores = {"strict": strict.status == "ok", "lenient": lenient.status == "ok"}
        rec.text = "..."
    return rec


def make_records(strategies: tuple[str, ...] = ("decog", "free")) -> list[Record]:
    return [make_record(s, item, seed) for s in strategies for item in GOLD for seed in (0, 1)]


def as_frame(records: list[Record]) -> pd.DataFrame:
    return pd.DataFrame(
        {"task": [r.task for r in records], "strategy": [r.strategy for r in records], "record": records}
    )


def row(table: pd.DataFrame, strategy: str, parser: str) -> pd.Series:
    return table.set_index(["strategy", "parser"]).loc[(strategy, parser)]


def test_counts_and_f1_by_hand() -> None:
    t = eae_table(as_frame(make_records()), n_resamples=200, seed=3)
    assert t is not None and list(t.columns) == COLUMNS
    assert list(zip(t["strategy"], t["parser"], strict=True)) == [
        ("decog", "strict"),
        ("decog", "lenient"),
        ("free", "strict"),
        ("free", "lenient"),
    ]
    assert set(t["head_method"]) == {"rule"} and set(t["task"]) == {TASK}
    # decog, per run: m1 Taliban (span != "The Taliban", head Taliban = Taliban) + members: ai 1, ac 1, ai+ 2,
    #   ac+ 2, 2 predicted, 2 gold; m2 Kabul: 1 everywhere; m3 "Maidan Wardak province" as Victim vs gold
    #   Place "in central Maidan Wardak province": spans differ, heads equal (province) with the wrong role:
    #   ai+ 1 only, 1 predicted, 2 gold; m4 "none" is no argument. Per run 4 predicted, 5 gold, ai 2, ac 2,
    #   ai+ 4, ac+ 3; two identical runs double every count.
    d = row(t, "decog", "strict")
    assert (d["n_records"], d["n_unscored"], d["n_runs"], d["n_mentions"]) == (8, 0, 2, 4)
    assert (d["n_pred"], d["n_gold"], d["parse_rate"], d["span_in_passage_rate"]) == (8, 10, 1.0, 1.0)
    assert (d["ai_p"], d["ai_r"], d["ai_f1"]) == pytest.approx((0.5, 0.4, round(8 / 18, 6)))
    assert (d["ac_p"], d["ac_r"], d["ac_f1"]) == pytest.approx((0.5, 0.4, round(8 / 18, 6)))
    assert (d["ai_head_p"], d["ai_head_r"], d["ai_head_f1"]) == pytest.approx((1.0, 0.8, round(16 / 18, 6)))
    assert (d["ac_head_p"], d["ac_head_r"], d["ac_head_f1"]) == pytest.approx((0.75, 0.6, round(12 / 18, 6)))
    # free, strict: m1's parse failed (0 predicted, 2 gold, twice); m2 "Kabul." = Kabul (1 everywhere, twice);
    #   m3 only seed 0 (seed 1 errored): soldiers right, Wardak wrong (head Wardak != province): 2 predicted,
    #   2 gold, 1 everywhere; m4: 2 predicted, 0 gold, twice. 8 predicted, 8 gold, 3 correct on every metric.
    f = row(t, "free", "strict")
    assert (f["n_records"], f["n_unscored"], f["n_runs"], f["n_mentions"]) == (8, 1, 2, 4)
    assert (f["n_pred"], f["n_gold"]) == (8, 8)
    assert f["parse_rate"] == pytest.approx(round(5 / 7, 6))
    # filled roles of ok parses: Kabul. x2, soldiers + Wardak, (soldiers + Herat) x2 -> 6 of 8 in the passage
    assert f["span_in_passage_rate"] == pytest.approx(0.75)
    for m in ("ai", "ac", "ai_head", "ac_head"):
        assert (f[f"{m}_p"], f[f"{m}_r"], f[f"{m}_f1"]) == pytest.approx((0.375, 0.375, 0.375))
    # free, lenient: m1 now parses (roles swapped): 2 predicted, ai 2, ac 0, ai+ 2, ac+ 0, twice.
    #   12 predicted, 8 gold; ai = ai+ = 7, ac = ac+ = 3.
    fl = row(t, "free", "lenient")
    assert (fl["n_pred"], fl["n_gold"], fl["parse_rate"]) == (12, 8, 1.0)
    assert (fl["ai_p"], fl["ai_r"], fl["ai_f1"]) == pytest.approx((round(7 / 12, 6), 0.875, 0.7))
    assert (fl["ac_p"], fl["ac_r"], fl["ac_f1"]) == pytest.approx((0.25, 0.375, 0.3))
    assert fl["ai_head_f1"] == fl["ai_f1"] and fl["ac_head_f1"] == fl["ac_f1"]
    assert row(t, "decog", "lenient")["ai_f1"] == d["ai_f1"]


def test_intervals_contain_the_estimate_and_are_deterministic() -> None:
    df = as_frame(make_records())
    t = eae_table(df, n_resamples=300, seed=7)
    assert t is not None
    for m in ("ai", "ac", "ai_head", "ac_head"):
        assert (t[f"{m}_f1_lo"] <= t[f"{m}_f1"] + 1e-9).all() and (
            t[f"{m}_f1"] <= t[f"{m}_f1_hi"] + 1e-9
        ).all()
        assert (t[f"{m}_f1_lo"] >= 0).all() and (t[f"{m}_f1_hi"] <= 1).all()
    pd.testing.assert_frame_equal(t, eae_table(df, n_resamples=300, seed=7))
    other = eae_table(df, n_resamples=300, seed=8)
    bounds = [c for c in COLUMNS if c.endswith(("_f1_lo", "_f1_hi"))]
    assert other is not None and not other[bounds].equals(t[bounds])  # another seed, other draws
    none = eae_table(df, n_resamples=0, seed=7)
    assert none is not None and none["ai_f1_lo"].isna().all() and none["ac_head_f1_hi"].isna().all()
    pd.testing.assert_series_equal(none["ai_f1"], t["ai_f1"])


def test_intervals_contain_the_estimate_on_a_larger_random_run() -> None:
    rng = np.random.default_rng(11)
    roles = ["Attacker", "Victim", "Place", "Target"]
    words = ["Taliban", "members", "Kabul", "soldiers", "police", "province", "convoy"]
    records = []
    for strategy, p_right in (("decog", 0.7), ("free", 0.4)):
        for i in range(30):
            gold = [(r, str(rng.choice(words))) for r in roles if rng.random() < 0.5]
            pred = {r: (t if rng.random() < p_right else str(rng.choice(words))) for r, t in gold}
            rec = make_record("decog", "m1", 0, gold=encode_gold(gold, RULE))
            ok = ParseRecord(status="ok", value=encode_prediction(pred, RULE, {r: True for r in pred}))
            records.append(
                rec.model_copy(
                    update={
                        "strategy": strategy,
                        "item_id": f"x{i:02d}",
                        "parses": {"strict": ok, "lenient": ok},
                    }
                )
            )
    t = eae_table(as_frame(records), n_resamples=500, seed=0)
    assert t is not None and set(t["n_mentions"]) == {30}
    for m in ("ai", "ac", "ai_head", "ac_head"):
        assert (t[f"{m}_f1_lo"] <= t[f"{m}_f1"]).all() and (t[f"{m}_f1"] <= t[f"{m}_f1_hi"]).all()
        assert (t[f"{m}_f1_lo"] < t[f"{m}_f1_hi"]).all()


def test_resampling_is_paired_across_strategies() -> None:
    """A copy of a strategy gets exactly its intervals: every cell of a task uses the same mention draws."""
    records = make_records()
    copies = [
        r.model_copy(update={"strategy": "decog-copy", "request_id": r.request_id + "c"}) for r in records[:8]
    ]
    t = eae_table(as_frame(records + copies), n_resamples=200, seed=5)
    assert t is not None
    a, b = row(t, "decog", "strict"), row(t, "decog-copy", "strict")
    for m in ("ai", "ac", "ai_head", "ac_head"):
        assert (a[f"{m}_f1_lo"], a[f"{m}_f1_hi"]) == (b[f"{m}_f1_lo"], b[f"{m}_f1_hi"])


def test_errored_records_are_unscored_not_wrong() -> None:
    records = make_records(("free",))
    t = eae_table(as_frame(records), n_resamples=50, seed=0)
    assert t is not None
    f = row(t, "free", "strict")
    assert f["n_unscored"] == 1 and f["n_gold"] == 8  # m3's gold counted once (seed 0), not twice
    # all of an item's records errored: the item is not a mention of the cell
    for r in records:
        if r.item_id == "m4":
            r.error = "boom"
    f2 = row(eae_table(as_frame(records), n_resamples=50, seed=0), "free", "strict")
    assert (f2["n_unscored"], f2["n_mentions"], f2["n_pred"]) == (3, 3, 4)


def test_non_eae_frame_and_mixed_head_methods() -> None:
    rec = make_record("decog", "m1", 0)
    assert eae_table(as_frame([rec.model_copy(update={"task": "gsm8k"})])) is None

    class Other:
        method = "spacy:en_core_web_sm-3.7.1"

        def __call__(self, text: str) -> str:
            return text

    odd = make_record("decog", "m2", 0, gold=encode_gold(GOLD["m2"], Other()))
    with pytest.raises(DataError, match="mixes head methods"):
        eae_table(as_frame([rec, odd]))
    bad = make_record("decog", "m2", 1, gold="m2 gold as plain text")
    with pytest.raises(DataError, match="gold"):
        eae_table(as_frame([rec, bad]))


def test_registered_and_figure() -> None:
    a = analyses()["eae"]
    assert a.keys == ("task", "strategy", "parser") and a.bootstrap and a.figure is not None
    assert "AI+" in a.description and "attached" in a.description and "head_method" in a.description
    t = eae_table(as_frame(make_records()), n_resamples=50, seed=0)
    assert t is not None
    fig = eae_figure(t)
    assert len(fig.axes) == 1 and len(fig.axes[0].patches) == 6 * 2  # 6 metrics x 2 strategies
    import matplotlib.pyplot as plt

    plt.close(fig)


def write_run(run_dir: Path, records: list[Record]) -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    with (run_dir / "records.jsonl").open("w", encoding="utf-8") as handle:
        for rec in records:
            handle.write(rec.model_dump_json() + "\n")
    manifest = {
        "backend": {"backend": "fake", "model": "fake-model"},
        "config": {"task": TASK, "strategies": ["decog", "free"], "seeds": 2},
        "status": "complete",
    }
    (run_dir / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
    return run_dir


def test_write_report_and_verify_round_trip(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path / "run", make_records())
    loaded = eae_table(load_records(run_dir), n_resamples=100, seed=2)
    assert loaded is not None
    pd.testing.assert_frame_equal(loaded, eae_table(as_frame(make_records()), n_resamples=100, seed=2))
    write_report(run_dir, n_resamples=100, seed=2)
    csv = run_dir / "tables" / "eae.csv"
    assert csv.is_file() and (run_dir / "figures" / "eae.png").is_file()
    assert "Event argument extraction" in (run_dir / "report.md").read_text(encoding="utf-8")
    written = pd.read_csv(csv)
    assert len(written) == 4 and written["ai_f1"].tolist() == pytest.approx(loaded["ai_f1"].tolist())
    assert verify_report(run_dir) == []
    # a changed number is caught, naming the table, the row and the column
    text = csv.read_text(encoding="utf-8").splitlines()
    cells = text[1].split(",")
    column = text[0].split(",").index("ac_head_f1")
    cells[column] = "0.123"
    csv.write_text("\n".join([text[0], ",".join(cells), *text[2:]]) + "\n", encoding="utf-8")
    problems = verify_report(run_dir)
    assert len(problems) == 1 and "eae.csv" in problems[0] and "ac_head_f1" in problems[0]
    assert not math.isnan(float(written["ai_f1_lo"].iloc[0]))


def test_attached_metrics_on_two_mentions_of_one_type_in_one_sentence() -> None:
    """TextEE's definitions (issue 14's case): gold A {Attacker: rebels}, B {Target: village}; the prediction gives
    A {Target: village} and B nothing. AI: 1 correct, P 1, R 0.5; AC 1; AI+ 0; AC+ 0 (village is B's, not A's)."""
    sentence = sentence_key("doc1", "The rebels attacked and burned the village.")
    at_a = Attachment(sentence, "Conflict.Attack", (2, 3))
    at_b = Attachment(sentence, "Conflict.Attack", (4, 5))
    gold_a = encode_gold([("Attacker", "rebels")], RULE, at_a)
    gold_b = encode_gold([("Target", "village")], RULE, at_b)
    a = make_record("decog", "m1", 0, gold=gold_a)
    b = make_record("decog", "m2", 0, gold=gold_b)
    pred_a = ParseRecord(status="ok", value=encode_prediction({"Attacker": None, "Target": "village"}, RULE,
                                                              {"Target": True}))
    pred_b = ParseRecord(status="ok", value=encode_prediction({"Target": None}, RULE, {}))
    recs = [a.model_copy(update={"parses": {"strict": pred_a, "lenient": pred_a}}),
            b.model_copy(update={"parses": {"strict": pred_b, "lenient": pred_b}})]
    t = eae_table(as_frame(recs), n_resamples=100, seed=0)
    assert t is not None
    d = row(t, "decog", "strict")
    assert (d["n_mentions"], d["n_sentences"]) == (2, 1)
    assert (d["ai_p"], d["ai_r"]) == (1.0, 0.5) and d["ai_f1"] == pytest.approx(2 / 3)
    assert (d["ac_p"], d["ac_r"]) == (1.0, 0.5)
    assert (d["ai_plus_p"], d["ai_plus_r"], d["ai_plus_f1"]) == (0.0, 0.0, 0.0)
    assert (d["ac_plus_p"], d["ac_plus_r"], d["ac_plus_f1"]) == (0.0, 0.0, 0.0)
    # the head-word extras score per mention: village was A's prediction, B's gold: no credit either
    assert d["ai_head_f1"] == 0.0
    # the same span predicted for two roles of one mention is one AI key, two AC keys
    both = ParseRecord(status="ok", value=encode_prediction({"Attacker": "rebels", "Target": "rebels"}, RULE,
                                                            {"Attacker": True, "Target": True}))
    t2 = eae_table(as_frame([a.model_copy(update={"parses": {"strict": both, "lenient": both}})]), n_resamples=0)
    assert t2 is not None
    d2 = row(t2, "decog", "strict")
    assert (d2["ai_p"], d2["ai_r"]) == (1.0, 1.0) and (d2["ac_p"], d2["ac_r"]) == (0.5, 1.0)
