"""formtax.report: tables against direct numpy computation, report files, verification, malformed input."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from formtax.errors import DataError
from formtax.records.schema import ParseRecord, Record
from formtax.report import compute_tables, load_records, verify_report, write_report
from formtax.stats.rules import MEAN_RULE

N_RESAMPLES = 500
TASKS = ("arith", "csqa")
# strategy spec -> (base strategy, level, rc, probability of a correct strict answer)
STRATEGIES = {
    "free": ("free", "none", False, 0.5),
    "json@none": ("json", "none", False, 0.3),
    "json@fc": ("json", "fc", False, 0.55),
    "json@vc": ("json", "vc", False, 0.85),
}
SEEDS = (0, 1)
VARIANTS = ("t1f1", "t2f1")
N_ITEMS = 30
# (task, strategy, item, seed, variant) of the one crashed request
ERRORED = ("arith", "json@fc", "item07", 1, "t2f1")
PHASES = {"free": ("free",), "json@none": ("reasoning", "answer"), "json@fc": ("reasoning", "answer")}


def make_record(task: str, spec: str, item: str, seed: int, variant: str, error: str | None = None) -> Record:
    """A valid record without outcome fields (unscored until scores, parses, tokens and timings are set)."""
    base, level, rc, _ = STRATEGIES[spec]
    return Record(
        request_id=f"{task}-{spec}-{item}-{seed}-{variant}",
        task=task,
        item_id=item,
        item_hash="h" + item,
        strategy=spec,
        base_strategy=base,
        level=level,
        rc=rc,
        output_format="json" if base == "json" else "reason-answer",
        prompt_variant=variant,
        seed=seed,
        shots=0,
        model="fake-model",
        batch_size=8,
        prompt_hash="p",
        prompt="What is it?",
        gold="42",
        error=error,
    )


def fill_outcome(rec: Record, rng: np.random.Generator, p: float) -> None:
    """Random scores, parses, token counts and timings for a scored record."""
    strict = bool(rng.random() < p)
    lenient = strict or bool(rng.random() < 0.3)
    parse_ok = strict or bool(rng.random() < 0.5)
    by_phase = {
        ph: int(rng.integers(1, 40)) for ph in PHASES.get(rec.strategy, ("rc", "reasoning", "answer"))
    }
    rec.scores = {"strict": strict, "lenient": lenient}
    rec.parses = {
        "strict": ParseRecord(status="ok" if parse_ok else "no_answer"),
        "lenient": ParseRecord(status="ok" if lenient or parse_ok else "invalid"),
    }
    rec.tokens = {
        "prompt": int(rng.integers(50, 80)),
        "total": sum(by_phase.values()),
        "forced": int(rng.integers(0, 5)),
        "by_phase": by_phase,
    }
    rec.timings = {"wall_s": float(rng.uniform(0.1, 2.0)), "batch_wall_s": 3.0}
    rec.finish_reason = "stop"


def make_records(seed: int = 1) -> list[Record]:
    """Synthetic valid records: 2 tasks x 4 strategies x 30 items x 2 seeds x 2 prompt variants, one errored."""
    rng = np.random.default_rng(seed)
    records = []
    for task in TASKS:
        ability = rng.uniform(-0.15, 0.15, size=N_ITEMS)
        for spec, (_, _, _, p) in STRATEGIES.items():
            for i in range(N_ITEMS):
                item = f"item{i:02d}"
                for s in SEEDS:
                    for variant in VARIANTS:
                        error = "CUDA out of memory" if (task, spec, item, s, variant) == ERRORED else None
                        rec = make_record(task, spec, item, s, variant, error)
                        if error is None:
                            fill_outcome(rec, rng, p + ability[i])
                        records.append(rec)
    return records


def write_run(run_dir: Path, records: list[Record], manifest: bool = True) -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    with (run_dir / "records.jsonl").open("w", encoding="utf-8") as handle:
        for rec in records:
            handle.write(rec.model_dump_json() + "\n")
    if manifest:
        info = {
            "backend": {"backend": "fake", "model": "fake-model"},
            "git": {"commit": "abc123def", "dirty": False},
            "config": {"task": "arith", "strategies": list(STRATEGIES), "seeds": 2},
            "status": "complete",
        }
        (run_dir / "manifest.json").write_text(json.dumps(info), encoding="utf-8")
    return run_dir


def numpy_matrix(records: list[Record], task: str, strategy: str, field: str) -> np.ndarray:
    """items x runs matrix computed directly from the records (NaN = unscored)."""
    runs = [(s, v) for s in SEEDS for v in VARIANTS]
    out = np.full((N_ITEMS, len(runs)), np.nan)
    for rec in records:
        if rec.task != task or rec.strategy != strategy or rec.error is not None:
            continue
        i = int(rec.item_id[4:])
        j = runs.index((rec.seed, rec.prompt_variant))
        if field == "parse_strict":
            out[i, j] = float(rec.parses["strict"].status == "ok")
        else:
            out[i, j] = float(rec.scores[field])
    return out


def complete_mean(matrix: np.ndarray) -> float:
    return float(matrix[~np.isnan(matrix).any(axis=1)].mean())


@pytest.fixture(scope="module")
def records() -> list[Record]:
    return make_records()


@pytest.fixture(scope="module")
def tables(records: list[Record], tmp_path_factory: pytest.TempPathFactory) -> dict[str, pd.DataFrame]:
    run_dir = write_run(tmp_path_factory.mktemp("tables"), records)
    return compute_tables(load_records(run_dir), n_resamples=N_RESAMPLES, seed=0)


@pytest.fixture(scope="module")
def report_dir(records: list[Record], tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = write_run(tmp_path_factory.mktemp("report") / "run", records)
    write_report(run_dir, n_resamples=N_RESAMPLES, seed=0)
    return run_dir


@pytest.fixture
def report_copy(report_dir: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(report_dir, tmp_path / "run"))


def row(table: pd.DataFrame, **keys: str) -> pd.Series:
    mask = np.ones(len(table), dtype=bool)
    for column, value in keys.items():
        mask &= (table[column] == value).to_numpy()
    assert mask.sum() == 1, keys
    return table[mask].iloc[0]


def test_load_records_flattens(records: list[Record], tmp_path: Path) -> None:
    df = load_records(write_run(tmp_path, records))
    assert len(df) == len(records) == 2 * 4 * N_ITEMS * 4
    assert int((~df["scored"]).sum()) == 1
    for column in ("score_strict", "score_lenient", "parse_ok_strict", "tokens_total", "tokens_rc", "wall_s"):
        assert column in df.columns
    errored = df[~df["scored"]].iloc[0]
    assert np.isnan(errored["score_strict"]) and errored["error"] == "CUDA out of memory"
    free = df[(df["strategy"] == "free") & df["scored"]]
    assert (free["tokens_rc"] == 0).all() and (free["tokens_free"] == free["tokens_total"]).all()


def test_accuracy_matches_numpy(records: list[Record], tables: dict[str, pd.DataFrame]) -> None:
    accuracy = tables["accuracy"]
    assert len(accuracy) == len(TASKS) * len(STRATEGIES)
    for task in TASKS:
        for strategy in STRATEGIES:
            r = row(accuracy, task=task, strategy=strategy)
            errored = (task, strategy) == ERRORED[:2]
            assert r["n_unscored"] == (1 if errored else 0)
            assert r["n_scored"] == N_ITEMS * 4 - r["n_unscored"]
            assert r["n_items"] == N_ITEMS and r["n_runs"] == 4
            # one basis per task: the item unscored in one strategy is dropped from every strategy of its task
            assert r["n_items_dropped"] == (1 if task == ERRORED[0] else 0)
            basis = np.ones(N_ITEMS, dtype=bool)
            for other in STRATEGIES:
                basis &= ~np.isnan(numpy_matrix(records, task, other, "strict")).any(axis=1)
            columns = (
                ("strict", "acc_strict"),
                ("lenient", "acc_lenient"),
                ("parse_strict", "parse_rate_strict"),
            )
            for field, column in columns:
                expected = float(numpy_matrix(records, task, strategy, field)[basis].mean())
                assert r[column] == pytest.approx(round(expected, 6), abs=1e-12)
                assert r[f"{column}_low"] <= r[column] <= r[f"{column}_high"]
            assert r["n_resamples"] == N_RESAMPLES and r["interval_method"] == MEAN_RULE


def test_runs_table_mean_std(records: list[Record], tables: dict[str, pd.DataFrame]) -> None:
    matrix = numpy_matrix(records, "arith", "json@fc", "strict")
    per_run = np.nanmean(matrix, axis=0)
    r = row(tables["runs"], task="arith", strategy="json@fc")
    assert r["acc_strict_mean"] == pytest.approx(round(per_run.mean(), 6), abs=1e-12)
    assert r["acc_strict_std"] == pytest.approx(round(per_run.std(ddof=1), 6), abs=1e-12)
    assert r["n_unscored"] == 1 and r["n_runs"] == 4


def test_decomposition_gains(records: list[Record], tables: dict[str, pd.DataFrame]) -> None:
    decomposition = tables["decomposition"]
    assert sorted(decomposition["base_strategy"]) == ["json", "json"]  # "free" has a single level: no row
    for task in TASKS:
        r = row(decomposition, task=task, base_strategy="json")
        assert (r["strategy_none"], r["strategy_fc"], r["strategy_vc"]) == ("json@none", "json@fc", "json@vc")
        mats = [numpy_matrix(records, task, s, "strict") for s in ("json@none", "json@fc", "json@vc")]
        keep = ~np.any([np.isnan(m).any(axis=1) for m in mats], axis=0)
        none, fc, vc = (float(m[keep].mean()) for m in mats)
        assert r["n_items"] == keep.sum()
        assert r["format_gain"] == pytest.approx(fc - none, abs=2e-6)
        assert r["validity_gain"] == pytest.approx(vc - fc, abs=2e-6)
        assert r["total_gain"] == pytest.approx(vc - none, abs=2e-6)
        assert np.isnan(r["reasoning_gain"])
        assert r["format_gain"] > 0 and r["validity_gain"] > 0
        assert r["format_gain_low"] <= r["format_gain"] <= r["format_gain_high"]


def pair(table: pd.DataFrame, task: str, a: str, b: str) -> pd.Series:
    """The paired row of strategies ``a`` and ``b``, whichever way the table oriented it."""
    mask = (table["task"] == task) & table["strategy"].isin([a, b]) & table["baseline"].isin([a, b])
    assert mask.sum() == 1, (task, a, b)
    return table[mask].iloc[0]


def test_paired_differences(records: list[Record], tables: dict[str, pd.DataFrame]) -> None:
    paired = tables["paired"]
    assert len(paired) == len(TASKS) * 6  # C(4, 2) pairs per task
    r = pair(paired, "csqa", "json@none", "json@vc")
    a = numpy_matrix(records, "csqa", r["strategy"], "strict")
    b = numpy_matrix(records, "csqa", r["baseline"], "strict")
    assert r["diff"] == pytest.approx(round(a.mean() - b.mean(), 6), abs=1e-12)  # strategy - baseline
    assert r["acc_strategy"] - r["acc_baseline"] == pytest.approx(r["diff"], abs=1e-6)
    if r["strategy"] == "json@vc":  # json@vc is much better, whichever side it is on
        assert r["diff"] > 0 and r["diff_low"] > 0
    else:
        assert r["diff"] < 0 and r["diff_high"] < 0
    assert r["n_only_baseline"] == int(((a == 0) & (b == 1)).sum())
    assert r["n_only_strategy"] == int(((a == 1) & (b == 0)).sum())
    assert r["paired_p"] < 0.05 and r["n_pairs"] == N_ITEMS * 4
    errored = pair(paired, "arith", "json@fc", "json@vc")
    assert errored["n_items"] == N_ITEMS - 1 and errored["n_unscored"] == 1


def test_tokens_and_timing(records: list[Record], tables: dict[str, pd.DataFrame]) -> None:
    scored = [r for r in records if r.task == "csqa" and r.strategy == "json@vc" and r.error is None]
    t = row(tables["tokens"], task="csqa", strategy="json@vc")
    total = np.mean([r.tokens["total"] for r in scored])
    assert t["tokens_total_mean"] == pytest.approx(round(total, 6), abs=1e-12)
    assert t["tokens_rc_mean"] == pytest.approx(
        round(np.mean([r.tokens["by_phase"]["rc"] for r in scored]), 6)
    )
    walls = [r.timings["wall_s"] for r in scored]
    timing = row(tables["timing"], task="csqa", strategy="json@vc")
    assert timing["wall_s_median"] == pytest.approx(round(float(np.median(walls)), 6), abs=1e-12)
    assert timing["wall_s_total"] == pytest.approx(round(float(np.sum(walls)), 6), abs=1e-12)


def test_compute_tables_deterministic(
    records: list[Record], tmp_path: Path, tables: dict[str, pd.DataFrame]
) -> None:
    again = compute_tables(load_records(write_run(tmp_path, records)), n_resamples=N_RESAMPLES, seed=0)
    for name, table in tables.items():
        pd.testing.assert_frame_equal(table, again[name])


def test_write_report_files(report_dir: Path) -> None:
    names = ("summary", "accuracy", "runs", "decomposition", "paired", "tokens", "timing", "outcomes")
    for name in names:
        assert (report_dir / "tables" / f"{name}.csv").is_file()
    figures = sorted(p.name for p in (report_dir / "figures").glob("*.png"))
    assert figures == ["accuracy.png", "paired.png", "parse.png", "tokens.png"]
    html = (report_dir / "report.html").read_text(encoding="utf-8")
    assert html.count("data:image/png;base64,") == 4
    md = (report_dir / "report.md").read_text(encoding="utf-8")
    assert "abc123def" in md and "fake-model" in md
    rows = {n: len(pd.read_csv(report_dir / "tables" / f"{n}.csv")) for n in names}
    assert md.count("\nn = ") == sum(1 for n in names if rows[n])  # a footer line under every table with rows
    empty = [n for n in names if not rows[n]]
    if empty:  # an empty table is named, not rendered as a blank row
        assert f"not shown; their CSV files hold the header): {', '.join(empty)}." in md
    assert md.index("## Summary") < md.index("## Figures") < md.index("## Detailed tables")
    assert 'id="items"' in html and html.count('class="item"') == len(pd.read_json(
        report_dir / "records.jsonl", lines=True).groupby(["task", "item_id"]))
    assert "unscored = 1, replicates = 500" in md
    meta = json.loads((report_dir / "tables" / "meta.json").read_text(encoding="utf-8"))
    assert meta["n_resamples"] == N_RESAMPLES and meta["seed"] == 0 and len(meta["records_sha256"]) == 64
    assert meta["formtax_version"]


def test_verify_passes_on_fresh_report(report_dir: Path) -> None:
    assert verify_report(report_dir) == []


def test_verify_names_tampered_cell(report_copy: Path) -> None:
    path = report_copy / "tables" / "accuracy.csv"
    table = pd.read_csv(path)
    index = table.index[(table["task"] == "arith") & (table["strategy"] == "free")][0]
    table.loc[index, "acc_strict"] = table.loc[index, "acc_strict"] + 0.01
    table.to_csv(path, index=False)
    problems = verify_report(report_copy)
    assert len(problems) == 1, problems
    assert problems[0].startswith("accuracy.csv row (arith, free) column acc_strict: written ")


def test_verify_reports_changed_records(report_copy: Path, records: list[Record]) -> None:
    extra = records[0].model_copy(update={"item_id": "item99", "request_id": "new"})
    with (report_copy / "records.jsonl").open("a", encoding="utf-8") as handle:
        handle.write(extra.model_dump_json() + "\n")
    problems = verify_report(report_copy)
    assert any("records.jsonl changed since the report" in p and "sha256" in p for p in problems), problems


def test_verify_reports_missing_table_and_extra_row(report_copy: Path) -> None:
    (report_copy / "tables" / "timing.csv").unlink()
    path = report_copy / "tables" / "tokens.csv"
    text = path.read_text(encoding="utf-8")
    path.write_text(text + text.splitlines()[1].replace("arith", "zzz", 1) + "\n", encoding="utf-8")
    problems = verify_report(report_copy)
    assert "timing.csv is missing" in problems
    assert any(p.startswith("tokens.csv: extra row (zzz, ") for p in problems), problems


def test_malformed_line_raises_with_line_number(records: list[Record], tmp_path: Path) -> None:
    run_dir = write_run(tmp_path, records[:5])
    lines = (run_dir / "records.jsonl").read_text(encoding="utf-8").splitlines()
    lines[2] = lines[2][:40]
    (run_dir / "records.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(DataError, match="line 3"):
        load_records(run_dir)


def test_invalid_record_and_duplicates_raise(records: list[Record], tmp_path: Path) -> None:
    run_dir = write_run(tmp_path, records[:3])
    path = run_dir / "records.jsonl"
    bad = json.loads(records[3].model_dump_json())
    del bad["task"]
    path.write_text(path.read_text(encoding="utf-8") + json.dumps(bad) + "\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"line 4: malformed record: task"):
        load_records(run_dir)
    write_run(run_dir, [records[0], records[1], records[0]])
    with pytest.raises(DataError, match="line 3: duplicate record"):
        load_records(run_dir)


def test_sparse_run_reports_nan_and_verifies(tmp_path: Path) -> None:
    """One run only, a strategy whose every request crashed, runs that differ between strategies."""
    rng = np.random.default_rng(3)
    records = []
    for i in range(5):
        rec = make_record("solo", "free", f"item{i:02d}", 0, "t1f1")
        fill_outcome(rec, rng, 0.5)
        records.append(rec)
        for s in (0, 1):
            rec = make_record("gappy", "json@none", f"item{i:02d}", s, "t1f1")
            fill_outcome(rec, rng, 0.5)
            records.append(rec)
        rec = make_record("gappy", "json@vc", f"item{i:02d}", 0, "t1f1")
        fill_outcome(rec, rng, 0.9)
        records.append(rec)
        records.append(make_record("gappy", "json@fc", f"item{i:02d}", 0, "t1f1", error="crash"))
    run_dir = write_run(tmp_path / "run", records, manifest=False)
    write_report(run_dir, n_resamples=50, seed=7)
    assert verify_report(run_dir) == []
    tables = compute_tables(load_records(run_dir), n_resamples=50, seed=7)
    assert np.isnan(row(tables["runs"], task="solo", strategy="free")["acc_strict_std"])
    crashed = row(tables["accuracy"], task="gappy", strategy="json@fc")
    assert crashed["n_unscored"] == 5 and crashed["n_items_used"] == 0 and np.isnan(crashed["acc_strict"])
    assert set(tables["paired"]["task"]) == {"gappy"}
    both = pair(tables["paired"], "gappy", "json@none", "json@vc")
    assert both["n_runs"] == 1 and both["n_items"] == 5  # only the run both strategies have
    decomposition = row(tables["decomposition"], task="gappy", base_strategy="json")
    assert np.isnan(decomposition["format_gain"]) and decomposition["n_items"] == 0
    assert "none (no manifest.json" in (run_dir / "report.md").read_text(encoding="utf-8")


def test_accuracy_and_decomposition_share_one_basis(tables: dict[str, pd.DataFrame]) -> None:
    """With one json@fc request unscored, acc_fc - acc_none from the accuracy table is the format gain."""
    acc = tables["accuracy"].set_index(["task", "strategy"])["acc_strict"]
    dec = row(tables["decomposition"], task=ERRORED[0], base_strategy="json")
    assert acc[(ERRORED[0], "json@fc")] - acc[(ERRORED[0], "json@none")] == pytest.approx(dec["format_gain"], abs=2e-6)
    assert acc[(ERRORED[0], "json@vc")] - acc[(ERRORED[0], "json@fc")] == pytest.approx(dec["validity_gain"], abs=2e-6)


def test_markdown_cells_escape_what_markdown_would_interpret() -> None:
    from formtax.report.render import markdown_table

    t = pd.DataFrame({"model": ["<img src=x onerror=alert(1)>|*bold*\n[link](u)"], "p_value": [1e-9]})
    md = markdown_table(t)
    body = md.splitlines()[2]
    import re

    assert not re.search(r"(?<!\\)<img", body) and "\\|" in body and "\\*bold\\*" in body
    assert "\\[link\\]" in body and body.rstrip().endswith("| <1e-6 |")  # p-values: never 0.0


def test_every_table_says_why_it_dropped_an_item(tables: dict[str, pd.DataFrame]) -> None:
    """The errored json@fc request ("CUDA out of memory") is named in each table that drops its item."""
    task = ERRORED[0]
    acc = tables["accuracy"].set_index(["task", "strategy"])
    for strategy in ("json@none", "json@fc", "json@vc"):
        assert acc.loc[(task, strategy), "drop_reasons"] == "json@fc: 1 unscored (CUDA out of memory 1)"
    dec = row(tables["decomposition"], task=task, base_strategy="json")
    assert dec["drop_reasons"] == "json@fc: 1 unscored (CUDA out of memory 1)"
    both = pair(tables["paired"], task, "json@fc", "json@vc")
    assert both["drop_reasons"] == "json@fc: 1 unscored (CUDA out of memory 1)"
    clean = tables["accuracy"][tables["accuracy"]["task"] != task]
    assert (clean["drop_reasons"].fillna("") == "").all()


def test_the_outcomes_table_counts_finishes_and_switches() -> None:
    """Issue 49: finish reasons and InWriting's switch reasons per strategy, counted from the records."""
    from formtax.report.tables import outcomes_table

    df = pd.DataFrame([{"task": "t", "strategy": s, "finish_reason": f, "switch_reason": w}
                       for s, f, w in (("inwriting", "eos", "budget"), ("inwriting", "length", "budget"),
                                       ("inwriting", "eos", "eos"), ("free", "length", None), ("free", "eos", None))])
    t = outcomes_table(df)
    got = {(r.strategy, r.kind, r.reason): (r.n, r.share) for r in t.itertuples()}
    assert got == {("free", "finish", "eos"): (1, 0.5), ("free", "finish", "length"): (1, 0.5),
                   ("inwriting", "finish", "eos"): (2, pytest.approx(2 / 3)),
                   ("inwriting", "finish", "length"): (1, pytest.approx(1 / 3)),
                   ("inwriting", "switch", "budget"): (2, pytest.approx(2 / 3)),
                   ("inwriting", "switch", "eos"): (1, pytest.approx(1 / 3))}
