"""The report leads with its findings (issue 38): sentences generated from the tables, checked by ``formtax
verify`` (a changed number fails it), comparisons against a named baseline, a summary of at most eight columns,
a parse-rate figure, and the run's configuration at the end. Fake backend: seconds."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from formtax.backends.fake import FakeBackend, random_logits
from formtax.cli.main import main
from formtax.report import verify_report, write_report
from formtax.report.findings import baseline_rows, findings_table
from formtax.runner import RunConfig, run


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("findings") / "run"
    cfg = RunConfig(task="arith", strategies=["free", "constrained", "short"], backend="fake", limit=6,
                    batch_size=3, max_tokens=48)
    run(cfg, out, backend=FakeBackend(random_logits(seed=2)))
    write_report(out, n_resamples=300)
    return out


def test_findings_lead_and_verify_catches_a_changed_number(run_dir: Path, tmp_path: Path) -> None:
    md = (run_dir / "report.md").read_text(encoding="utf-8")
    headings = [line for line in md.splitlines() if line.startswith("## ")]
    assert headings[0] == "## Findings" and headings[-1] == "## Run configuration and provenance"
    assert md.index("config.strategies") > md.index("## Detailed tables")  # configuration at the end
    assert "Accuracy against the baseline free" in md and "Strict parse rate" in md
    assert verify_report(run_dir) == []
    import shutil

    tampered = tmp_path / "tampered"
    shutil.copytree(run_dir, tampered)
    path = tampered / "report.md"
    text = path.read_text(encoding="utf-8")
    line = next(x for x in text.splitlines() if x.startswith("- Strict parse rate"))
    changed = line.replace("%", "1%", 1)  # one number changed in one sentence
    path.write_text(text.replace(line, changed), encoding="utf-8")
    problems = verify_report(tampered)
    assert any("is missing" in p for p in problems) and any("not what the records give" in p for p in problems)
    assert main(["verify", str(tampered)]) != 0


def test_the_summary_has_at_most_eight_columns_and_a_parse_figure(run_dir: Path) -> None:
    summary = pd.read_csv(run_dir / "tables" / "summary.csv")
    assert len(summary.columns) <= 8 and {"parse_rate_strict", "parse_rate_format"} <= set(summary.columns)
    assert (run_dir / "figures" / "parse.png").is_file()
    by = summary.set_index("strategy")
    # paper 003's (format-level) parse rate is defined for every output, constrained or not, and never below the
    # strict one (the strict parser also asks for the canonical spelling)
    assert by["parse_rate_format"].notna().all() and by.at["constrained", "parse_rate_format"] == 1.0
    assert (by["parse_rate_format"] >= by["parse_rate_strict"]).all()


def test_a_well_shaped_answer_in_the_wrong_spelling_parses_at_the_format_level() -> None:
    """Issue 37, point 2: ``The answer is: H E N E`` has the format's shape (paper 003 counts it as parsed; only
    its accuracy is wrong); the strict parser says ``invalid`` (not the canonical spelling), a missing line
    ``no_answer``."""
    from formtax.records.schema import ParseRecord
    from formtax.report.load import format_ok

    assert format_ok(ParseRecord(status="invalid", value=None, raw="H E N E")) == 1.0
    assert format_ok(ParseRecord(status="ok", value="hene", raw="hene")) == 1.0
    assert format_ok(ParseRecord(status="no_answer", value=None, raw=None)) == 0.0
    assert format_ok(ParseRecord(status="invalid", value=None, raw="")) == 0.0


def test_a_named_baseline_orients_every_comparison(run_dir: Path, tmp_path: Path) -> None:
    import shutil

    other = tmp_path / "other"
    shutil.copytree(run_dir, other)
    assert main(["report", str(other), "--baseline", "constrained", "--replicates", "300"]) == 0
    md = (other / "report.md").read_text(encoding="utf-8")
    assert "Accuracy against the baseline constrained" in md and verify_report(other) == []
    paired = pd.read_csv(other / "tables" / "paired.csv")
    assert len(paired) == 3  # every pair stays in the CSV
    rows = baseline_rows(paired, "arith", "constrained")
    assert set(rows["strategy"]) == {"free", "short"}
    for r in rows.itertuples():  # oriented strategy - baseline
        acc = pd.read_csv(other / "tables" / "accuracy.csv").set_index("strategy")["acc_strict"]
        assert r.diff == pytest.approx(acc[r.strategy] - acc["constrained"], abs=1e-6)
    assert main(["report", str(other), "--baseline", "nope"]) != 0


def test_sentences_follow_the_intervals() -> None:
    acc = pd.DataFrame([
        {"task": "t", "strategy": s, "n_items_used": 20, "n_runs": 1, "acc_strict": a, "acc_strict_low": lo,
         "acc_strict_high": hi, "parse_rate_strict": p, "parse_rate_strict_low": p - 0.1,
         "parse_rate_strict_high": min(p + 0.1, 1.0), "parse_rate_format": f,
         "parse_rate_format_low": f - 0.1, "parse_rate_format_high": min(f + 0.1, 1.0)}
        for s, a, lo, hi, p, f in (("free", 0.2, 0.05, 0.4, 0.25, float("nan")), ("json", 0.7, 0.5, 0.9, 1.0, 1.0),
                                   ("short", 0.25, 0.1, 0.45, 0.75, float("nan")))])
    paired = pd.DataFrame([
        {"task": "t", "strategy": "json", "baseline": "free", "diff": 0.5, "diff_low": 0.3,
         "diff_high": 0.7, "paired_p": 0.001, "n_pairs": 20},
        {"task": "t", "strategy": "free", "baseline": "short", "diff": -0.05, "diff_low": -0.2,
         "diff_high": 0.1, "paired_p": 0.6, "n_pairs": 20}])  # the second oriented against free: read flipped
    f = findings_table(acc, paired, "free").set_index("finding")["sentence"]
    # issue 60: Holm-adjusted p beside the raw one (statsmodels: [0.001, 0.6] -> [0.002, 0.6]); "the other one is"
    assert f["baseline"] == ("Accuracy against the baseline free: json +0.50 [0.30, 0.70] (paired p = 0.001, "
                             "Holm-adjusted p = 0.002); the other one is not distinguishable from 0 (largest "
                             "difference +0.05 for short, [-0.10, 0.20], paired p = 0.6, Holm-adjusted p = 0.6).")
    none = findings_table(acc, paired, "free", p_adjust="none").set_index("finding")["sentence"]["baseline"]
    assert "Holm" not in none and "(paired p = 0.001)" in none
    assert f["parse"].startswith("Strict parse rate (20 items x 1 run, 95% intervals): json 100% [90, 100], short 75%")


def test_an_interval_that_excludes_0_beside_a_paired_p_of_1_is_not_called_a_difference() -> None:
    """Issue 49's example: 3 items x 2 variants, one correct cell; the corrected bootstrap put the interval off 0
    while the exact paired test gave p = 1. A finding needs both to reject, and names the one that does not."""
    acc = pd.DataFrame([
        {"task": "gsm8k", "strategy": s, "n_items_used": 3, "n_runs": 2, "acc_strict": a, "acc_strict_low": 0.0,
         "acc_strict_high": 0.6, "parse_rate_strict": 1.0, "parse_rate_strict_low": 0.4,
         "parse_rate_strict_high": 1.0, "parse_rate_format": 1.0, "parse_rate_format_low": 0.4,
         "parse_rate_format_high": 1.0} for s, a in (("free", 0.0), ("inwriting", 1 / 6))])
    paired = pd.DataFrame([{"task": "gsm8k", "strategy": "free", "baseline": "inwriting", "diff": -1 / 6,
                            "diff_low": -0.577, "diff_high": -0.030, "paired_p": 1.0, "n_pairs": 6}])
    sentence = findings_table(acc, paired, "free").set_index("finding")["sentence"]["baseline"]
    assert "distinguishable" in sentence and "is not called distinguishable" in sentence
    assert sentence == ("Accuracy against the baseline free: inwriting +0.17 [0.03, 0.58] is not called "
                        "distinguishable: the interval excludes 0 but the paired test does not reject (paired p = 1).")
    paired.loc[0, ["diff", "diff_low", "diff_high"]] = [0.001, -0.004, 0.3]
    sentence = findings_table(acc, paired, "free").set_index("finding")["sentence"]["baseline"]
    assert "-0.00" not in sentence and "[-0.30, 0.00]" in sentence


def test_decomposition_gains_carry_their_std_over_runs(tmp_path: Path) -> None:
    """Issue 37, point 4: paper 003 reports each gain as mean +- std over seeds x prompt variants; the table gives
    that std beside the pooled gain and its bootstrap interval, recomputed here by hand from the records."""
    import numpy as np

    out = tmp_path / "run"
    cfg = RunConfig(task="arith", strategies=["inwriting@none", "inwriting@fc", "inwriting@vc"], backend="fake",
                    limit=6, seeds=3, temperature=1.0, max_tokens=128)
    run(cfg, out, backend=FakeBackend(random_logits(seed=4)))
    write_report(out, n_resamples=200)
    row = pd.read_csv(out / "tables" / "decomposition.csv").iloc[0]
    recs = pd.read_json(out / "records.jsonl", lines=True)
    recs["ok"] = recs["scores"].map(lambda s: float(bool(s["strict"])))
    acc = recs.pivot_table(index="seed", columns="level", values="ok", aggfunc="mean")
    per_run = acc["vc"] - acc["none"]
    assert row["total_gain"] == pytest.approx(per_run.mean(), abs=1e-6)
    assert row["total_gain_std"] == pytest.approx(float(np.std(per_run, ddof=1)), abs=1e-6)
    assert verify_report(out) == []


def test_the_baseline_is_found_under_the_form_a_prompt_plan_gave_it() -> None:
    """``free`` listed beside decog runs as ``free:keyphrase`` (one prompt for Deco-G's comparison): the default
    baseline and ``--baseline free`` both find it; an absent strategy is still refused."""
    from formtax.errors import ConfigError
    from formtax.report.findings import resolve_baseline

    df = pd.DataFrame({"strategy": ["decog", "free:keyphrase", "free:plain"]})
    manifest = {"config": {"strategies": ["free", "decog", "free:plain"]}}
    assert resolve_baseline(df, None, manifest) == "free:keyphrase"
    assert resolve_baseline(df, "free", manifest) == "free:keyphrase"
    assert resolve_baseline(df, "free:plain", manifest) == "free:plain"
    with pytest.raises(ConfigError, match="not a strategy"):
        resolve_baseline(df, "constrained", manifest)


def test_an_interrupted_runs_findings_open_with_a_warning(tmp_path: Path, capsys) -> None:
    """Issue 49 point 3: 8 of 12 requests recorded, inwriting missing; the findings say so first, and verify too."""
    from formtax.backends.fake import FakeBackend, random_logits
    from formtax.cli.main import main
    from formtax.runner import RunConfig, run

    class StopAtThirdBatch(FakeBackend):  # Ctrl-C as the third batch (inwriting's) starts
        def new_batch(self, prompts):
            if len(self.batches) >= 2:
                raise KeyboardInterrupt
            return super().new_batch(prompts)

    cfg = RunConfig(task="arith", strategies=["free", "constrained", "inwriting"], backend="fake", limit=4,
                    batch_size=4, max_tokens=64)
    with pytest.raises(KeyboardInterrupt):
        run(cfg, tmp_path, backend=StopAtThirdBatch(random_logits(seed=0), model_id="fake-random-0"))
    assert main(["report", str(tmp_path), "--replicates", "200"]) == 0
    findings = pd.read_csv(tmp_path / "tables" / "findings.csv")
    first = findings.iloc[0]
    assert first["finding"] == "incomplete"
    assert first["sentence"] == ("Incomplete run (status interrupted): 8 of 12 requests recorded; no records for "
                                 "inwriting. The findings below describe only what was recorded.")
    assert first["sentence"] in (tmp_path / "report.md").read_text()
    capsys.readouterr()
    assert main(["verify", str(tmp_path)]) == 0
    assert "warning: Incomplete run (status interrupted): 8 of 12" in capsys.readouterr().out
    assert run(cfg, tmp_path).planned == 12  # resumed: complete, and the warning is gone
    assert main(["report", str(tmp_path), "--replicates", "200"]) == 0
    assert "incomplete" not in set(pd.read_csv(tmp_path / "tables" / "findings.csv")["finding"])


def test_when_every_strategy_ties_the_findings_say_so() -> None:
    """Issue 49: "ranges from inwriting@vc 0% ... to inwriting@fc 0%" read as a range; a tie is said as one."""
    acc = pd.DataFrame([
        {"task": "t", "strategy": s, "n_items_used": 5, "n_runs": 1, "acc_strict": 0.0, "acc_strict_low": 0.0,
         "acc_strict_high": 0.43, "parse_rate_strict": 1.0, "parse_rate_strict_low": 0.57,
         "parse_rate_strict_high": 1.0, "parse_rate_format": 1.0, "parse_rate_format_low": 0.57,
         "parse_rate_format_high": 1.0} for s in ("inwriting@vc", "inwriting@fc")])
    f = findings_table(acc, pd.DataFrame(columns=["task", "strategy", "baseline", "diff", "diff_low",
                                                  "diff_high", "paired_p", "n_pairs"]), None)
    sentence = f.set_index("finding")["sentence"]["accuracy"]
    assert sentence == "Strict accuracy is the same for every strategy: 0% (inwriting@fc, inwriting@vc)."


def test_one_sign_across_the_csv_the_findings_and_the_figure(run_dir: Path, tmp_path: Path) -> None:
    """Issue 49: every difference is ``strategy - baseline`` in paired.csv (named columns), the findings and the
    paired figure's plotted points and labels; a named baseline turns every pair that holds it."""
    import shutil

    from formtax.report.figures import paired_figure

    for baseline in ("free", "constrained"):
        other = tmp_path / baseline
        shutil.copytree(run_dir, other)
        assert main(["report", str(other), "--baseline", baseline, "--replicates", "300"]) == 0
        paired = pd.read_csv(other / "tables" / "paired.csv")
        acc = pd.read_csv(other / "tables" / "accuracy.csv").set_index("strategy")["acc_strict"]
        held = paired[(paired["strategy"] == baseline) | (paired["baseline"] == baseline)]
        assert (held["baseline"] == baseline).all() and len(held) == 2
        for r in paired.itertuples():  # every row, the baseline's or not: strategy - baseline
            assert r.diff == pytest.approx(acc[r.strategy] - acc[r.baseline], abs=1e-6)
            assert r.diff == pytest.approx(r.acc_strategy - r.acc_baseline, abs=1e-6)
        sentence = (pd.read_csv(other / "tables" / "findings.csv").set_index("finding").loc["baseline", "sentence"])
        mentioned = 0
        for r in held.itertuples():  # each difference the sentence names carries the CSV's sign
            shown = "+0.00" if round(r.diff, 2) == 0 else f"{r.diff:+.2f}"
            mentioned += f"{r.strategy} {shown} [" in sentence or f"difference {shown} for {r.strategy}," in sentence
        assert mentioned >= 1
        ax = paired_figure(paired, baseline).axes[0]
        plotted = sorted(float(x) for x in ax.lines[0].get_xdata())
        assert plotted == pytest.approx(sorted(held["diff"]), abs=1e-9)
        labels = {t.get_text() for t in ax.get_yticklabels()}
        assert labels == {f"arith: {r.strategy} - {baseline}" for r in held.itertuples()}
        assert "-0.00" not in sentence


def test_paper_003s_gains_with_their_std_are_a_finding() -> None:
    """Issue 49: a plan with levels states paper 003's gains in the findings, mean +- std over runs with the
    paired interval, from the decomposition table's own numbers."""
    from formtax.report.findings import gains_sentence

    nan = float("nan")
    dec = pd.DataFrame([{"task": "t", "base_strategy": "inwriting", "format_gain": 0.2, "format_gain_low": 0.05,
                         "format_gain_high": 0.35, "format_gain_std": 0.04, "validity_gain": -0.001,
                         "validity_gain_low": -0.1, "validity_gain_high": 0.1, "validity_gain_std": nan,
                         "reasoning_gain": nan, "reasoning_gain_low": nan, "reasoning_gain_high": nan,
                         "reasoning_gain_std": nan, "total_gain": 0.199, "total_gain_low": 0.02,
                         "total_gain_high": 0.33, "total_gain_std": 0.05}])
    assert gains_sentence(dec) == (
        "Paper 003's gains (strict accuracy, mean +- std over runs, 95% paired intervals): inwriting: format +0.20 "
        "+- 0.04 [0.05, 0.35], validity +0.00 [-0.10, 0.10], total +0.20 +- 0.05 [0.02, 0.33].")
    assert gains_sentence(dec.iloc[0:0]) is None
    one_run = dec.assign(format_gain_std=nan, total_gain_std=nan)  # issue 60: no "mean +- std" at one run
    assert gains_sentence(one_run).startswith("Paper 003's gains (strict accuracy, one run, no spread over runs, 95%")
    acc = pd.DataFrame([{"task": "t", "strategy": "inwriting@vc", "n_items_used": 5, "n_runs": 1, "acc_strict": 0.4,
                         "acc_strict_low": 0.1, "acc_strict_high": 0.8, "parse_rate_strict": 1.0,
                         "parse_rate_strict_low": 0.5, "parse_rate_strict_high": 1.0, "parse_rate_format": 1.0,
                         "parse_rate_format_low": 0.5, "parse_rate_format_high": 1.0}])
    empty = pd.DataFrame(columns=["task", "strategy", "baseline", "diff", "diff_low", "diff_high", "paired_p",
                                  "n_pairs"])
    f = findings_table(acc, empty, None, None, dec).set_index("finding")["sentence"]
    assert f["gains"] == gains_sentence(dec)
