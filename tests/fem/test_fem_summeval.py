"""The SummEval judge task and its correlation table (report + verify)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from formtax.backends.fake import FakeBackend
from formtax.fem.artifact import save_fem
from formtax.records.schema import ParseRecord, Record
from formtax.records.store import read_records
from formtax.report import verify_report, write_report
from formtax.runner import RunConfig, run
from formtax.runner.distill import DistillConfig, build_fem, task_only_messages
from formtax.studies.summeval.judge import judge_table, lenient_rating, strict_rating
from formtax.tasks import OutputFormat, get_task


def test_items_answer_space_and_prompts(data_dir) -> None:
    task = get_task("summeval")
    items = task.load(data_dir)
    assert len(items) == 5760 and items[0].id == "A0-S0-coherence" and items[3].id == "A0-S0-relevance"
    assert items[0].gold == "1.3333" and task.display_answer(items[0]) == "1"
    assert task.answer_spec("vc", items[0], OutputFormat.REASON_ANSWER) == "The rating is {int:1..5}"
    assert task.answer_spec("vc", items[0], OutputFormat.JSON) == "{int:1..5}"
    assert task.normalize("4") == "4" and task.normalize("6") is None and task.normalize("0") is None
    assert task.score(items[0], "1") and not task.score(items[0], "2")
    msg = task.messages(items[1], OutputFormat.REASON_ANSWER, 1, 1, [])[0]["content"]
    assert "Consistency:" in msg and '"The rating is <score>"' in msg and items[1].question in msg
    only = task_only_messages(task, items[1])[0]["content"]
    assert "The rating is" not in only and "Consistency:" in only
    shots = task.shots(3, 0, set())
    assert all(s.meta["article_id"] in {f"A{i}" for i in range(90, 100)} for s in shots)


def _rec(item_id: str, gold: float, text: str, strategy: str = "decog", fmt: str = "reason-answer",
         error: str | None = None, lenient: str | None = None) -> Record:
    parses = {"strict": ParseRecord(status="no_answer"),
              "lenient": ParseRecord(status="ok" if lenient else "no_answer", value=lenient)}
    return Record(request_id=item_id + strategy, task="summeval", item_id=item_id, item_hash="h", strategy=strategy,
                  base_strategy=strategy, level="vc", rc=False, output_format=fmt, prompt_variant="t1f1", seed=0,
                  shots=0, model="m", batch_size=1, prompt_hash="p", prompt="", gold=f"{gold:.4f}", text=text,
                  error=error, parses=parses)


def test_judge_table_equals_hand_computed_correlations() -> None:
    golds = {"A0": [1.0, 2.3333, 3.0, 4.6667], "A1": [2.0, 3.0, 3.6667, 5.0], "A2": [3.0, 3.0, 3.0, 3.0]}
    ratings = {"A0": [1, 3, 2, 5], "A1": [4, 4, 4, 4], "A2": [1, 2, 3, 4]}
    recs = []
    for a in golds:
        for s in range(4):
            recs.append(_rec(f"{a}-S{s}-coherence", golds[a][s], f"Because.\nThe rating is {ratings[a][s]}."))
    recs.append(_rec("A0-S9-coherence", 2.0, "no rating here", lenient="3"))  # unrated strictly
    recs.append(_rec("A1-S9-coherence", 2.0, "", error="boom"))  # an errored request
    df = pd.DataFrame({"task": [r.task for r in recs], "strategy": [r.strategy for r in recs], "record": recs})
    t = judge_table(df)
    assert t is not None
    row = t.set_index("aspect").loc["coherence"]
    # A0: a real correlation; A1: constant judge -> skipped (G-Eval) or 0 (_const0); A2: constant gold -> skipped
    sp0 = stats.spearmanr(ratings["A0"], golds["A0"]).statistic
    kt0 = stats.kendalltau(ratings["A0"], golds["A0"]).statistic
    assert row["spearman"] == pytest.approx(round(sp0, 6)) and row["kendall"] == pytest.approx(round(kt0, 6))
    assert row["spearman_const0"] == pytest.approx(round((sp0 + 0.0) / 2, 6))
    assert row["kendall_const0"] == pytest.approx(round((kt0 + 0.0) / 2, 6))
    assert row["n_articles"] == 1 and row["n_records"] == 14 and row["n_rated"] == 12
    assert row["n_rated_lenient"] == 13  # the lenient reader takes the parser's 3
    xs = [r for a in golds for r in ratings[a]]
    ys = [g for a in golds for g in golds[a]]
    assert row["pooled_spearman"] == pytest.approx(round(stats.spearmanr(xs, ys).statistic, 6))
    assert row["mean_abs_error"] == pytest.approx(round(float(np.mean(np.abs(np.array(xs) - ys))), 6))
    assert judge_table(pd.DataFrame({"task": ["gsm8k"], "strategy": ["free"], "record": [recs[0]]})) is None


def test_rating_readers() -> None:
    assert strict_rating(_rec("A0-S0-fluency", 3, "ok\nThe rating is 4")) == 4
    assert strict_rating(_rec("A0-S0-fluency", 3, "The rating is 4\nmore")) is None
    assert lenient_rating(_rec("A0-S0-fluency", 3, "My rating: 2 overall\nmore")) == 2
    json_rec = _rec("A0-S0-fluency", 3, '{"reason": "", "answer": 5}', fmt="json")
    json_rec.parses["strict"] = ParseRecord(status="ok", value="5")
    assert strict_rating(json_rec) == 5
    assert math.isnan(float("nan"))


def test_summeval_run_with_decog_then_report_and_verify(tmp_path, data_dir) -> None:
    backend = FakeBackend()
    hmm, meta = build_fem(backend, DistillConfig(task="summeval", states=6, samples=3, max_tokens=16, em_iters=1,
                                                 data_dir=str(data_dir)))
    fem = save_fem(tmp_path / "fem.npz", hmm, meta)
    cfg = RunConfig(task="summeval", strategies=["free", "decog", "json"], backend="fake", limit=8, max_tokens=64,
                    batch_size=4, fem=str(fem), data_dir=str(data_dir))
    out = tmp_path / "run"
    s = run(cfg, out)
    assert s.errors == 0
    write_report(out, n_resamples=100)
    assert (out / "tables" / "judge.csv").is_file()
    table = pd.read_csv(out / "tables" / "judge.csv")
    decog = table[table["strategy"] == "decog"]
    assert (decog["rated_rate"] == 1.0).all()  # every decog output ends with a valid rating line
    assert verify_report(out) == []


def test_g_evals_article_rule_on_the_issue_toy_case() -> None:
    """One article the judge rates constant plus one it ranks perfectly: G-Eval skips the constant one (1.0);
    counting it as 0 gives 0.5 (issue 37, point 10)."""
    recs = [_rec(f"A0-S{s}-fluency", g, f"x\nThe rating is {r}.") for s, (g, r) in enumerate(zip(
        [1.0, 2.0, 3.0], [3, 3, 3], strict=True))]
    recs += [_rec(f"A1-S{s}-fluency", g, f"x\nThe rating is {r}.") for s, (g, r) in enumerate(zip(
        [1.0, 2.0, 3.0], [1, 2, 3], strict=True))]
    df = pd.DataFrame({"task": [r.task for r in recs], "strategy": [r.strategy for r in recs], "record": recs})
    row = judge_table(df).set_index("aspect").loc["fluency"]
    assert row["spearman"] == pytest.approx(1.0) and row["spearman_const0"] == pytest.approx(0.5)


def test_summeval_deco_g_places_the_rating_phrase_anywhere(tmp_path, data_dir) -> None:
    """Paper 001 section 4.3: Deco-G integrates "The rating is <score>" anywhere (the baselines append it at the
    end). The FEM strategies' prompt asks for the sentence somewhere, the FEM is placed anywhere, the last phrase
    is read; free and constrained beside them share that prompt (issue 37, point 7)."""
    from formtax.parsing import parse_all

    task = get_task("summeval")
    item = task.load(data_dir)[0]
    assert task.fem_output_format is OutputFormat.REASON_KEYPHRASE
    assert task.answer_spec("vc", item, OutputFormat.REASON_KEYPHRASE) == "The rating is {int:1..5}"
    for variant in (1, 2, 3):
        msg = task.messages(item, OutputFormat.REASON_KEYPHRASE, 1, variant, [])[0]["content"]
        assert "The rating is" in msg and "last line" not in msg and "nothing" not in msg.lower()
    got = parse_all("The rating is 4 because it is clear. Some more words.", task, item,
                    OutputFormat.REASON_KEYPHRASE)
    assert (got["strict"].status, got["strict"].value) == ("ok", "4")

    backend = FakeBackend()
    hmm, meta = build_fem(backend, DistillConfig(task="summeval", states=6, samples=3, max_tokens=16, em_iters=1,
                                                 data_dir=str(data_dir)))
    fem = save_fem(tmp_path / "fem.npz", hmm, meta)
    cfg = RunConfig(task="summeval", strategies=["decog", "free", "free:plain"], backend="fake", limit=4,
                    max_tokens=48, fem=str(fem), data_dir=str(data_dir))
    assert run(cfg, tmp_path / "run").errors == 0
    recs = read_records(tmp_path / "run" / "records.jsonl")
    decog = [r for r in recs if r.strategy == "decog"]
    assert decog and all(r.output_format == "reason-keyphrase" and r.stats["fem_placement"] == "anywhere"
                         for r in decog)
    assert all(strict_rating(r) is not None for r in decog)  # every output holds a rating phrase somewhere
    free = [r for r in recs if r.strategy == "free:keyphrase"]
    assert {r.prompt for r in free} == {r.prompt for r in decog}
    assert all(r.output_format == "reason-answer" for r in recs if r.strategy == "free:plain")
    # the judge's strict reader takes the phrase anywhere in a key-phrase record, only the last line otherwise
    mid = _rec("A0-S0-fluency", 3, "The rating is 4, since it reads well.\nMore.", fmt="reason-keyphrase")
    parsed = parse_all(mid.text, task, item, OutputFormat.REASON_KEYPHRASE)["strict"]
    mid.parses["strict"] = ParseRecord(status=parsed.status, value=parsed.value)
    assert strict_rating(mid) == 4
    assert strict_rating(_rec("A0-S0-fluency", 3, "The rating is 4, since it reads well.\nMore.")) is None


def test_the_evaluated_set_is_stated_where_the_numbers_are_shown() -> None:
    """Issue 49 (SummEval): formtax evaluates articles A0-A89 (A90-A99 feed the shots and the FEM's distillation),
    1440 of paper 001's 1600 summaries; the task description and the judge table's description say so (the
    description used to say 1600)."""
    from formtax.report.catalog import analyses
    from formtax.studies.summeval.task import SHOT_ARTICLES, SummEvalTask

    assert frozenset(f"A{i}" for i in range(90, 100)) == SHOT_ARTICLES
    assert "1440 of the 1600 summaries" in SummEvalTask.description and "A90-A99" in SummEvalTask.description
    judge = analyses()["judge"].description
    assert "1440 of paper 001's 1600 summaries" in judge and "A90-A99" in judge
