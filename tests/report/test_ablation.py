"""Issue 49: ``formtax compare`` reads runs as an ablation, side by side (no pooling): a max-tokens ablation (which
pooling refuses: it repeats every request) and a prompt-variant ablation each give, per strategy, the difference from
the first run, paired per item, with what differs named. Oracle: the per-item means computed here from the
records, and statsmodels' McNemar test."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from statsmodels.stats.contingency_tables import mcnemar

from formtax.cli.main import main
from formtax.report.ablation import Side, ablation_table
from formtax.report.load import load_records
from formtax.runner import RunConfig, run


def _run(out: Path, **kw: object) -> Path:
    base: dict[str, object] = dict(task="arith", strategies=["free", "constrained"], backend="fake", limit=6,
                                   batch_size=3, max_tokens=48)
    base.update(kw)
    run(RunConfig(**base), out)  # type: ignore[arg-type]
    return out


def _oracle(a: Path, b: Path, strategy: str) -> tuple[float, int]:
    def means(path: Path) -> pd.Series:
        df = load_records(path)
        df = df[(df["strategy"] == strategy) & df["scored"].astype(bool)]
        return df.groupby("item_id")["score_strict"].mean()

    ma, mb = means(a), means(b)
    common = sorted(set(ma.index) & set(mb.index))
    return float(mb.loc[common].mean() - ma.loc[common].mean()), len(common)


@pytest.mark.parametrize(("first", "second", "differs"), [
    ({"max_tokens": 34}, {"max_tokens": 64}, "max_tokens=34->64"),
    ({"prompt_variants": "t1f1"}, {"prompt_variants": "t2f3"}, "prompt_variants='t1f1'->'t2f3'"),
])
def test_compare_reads_an_ablation(tmp_path: Path, capsys: pytest.CaptureFixture[str], first, second,
                                   differs) -> None:
    a, b = _run(tmp_path / "a", **first), _run(tmp_path / "b", **second)
    assert main(["compare", str(a), str(b), "--out", str(tmp_path / "cmp"), "--replicates", "300"]) == 0
    printed = capsys.readouterr().out
    assert f"differs in: {differs}" in printed and "arith / constrained" in printed and "arith / free" in printed
    table = pd.read_csv(tmp_path / "cmp" / "ablation.csv")
    assert (tmp_path / "cmp" / "ablation.png").stat().st_size > 0
    for strategy in ("free", "constrained"):
        r = table[table["strategy"] == strategy].iloc[0]
        diff, n = _oracle(a, b, strategy)
        assert r["n_items"] == n == 6 and r["diff"] == pytest.approx(diff, abs=1e-12)
        assert r["diff_low"] <= r["diff"] <= r["diff_high"]
    if "max_tokens" in differs:  # pooling refuses it (each request twice), comparing does not
        assert main(["report", str(a), str(b), "--out", str(tmp_path / "pool"), "--replicates", "100"]) != 0


def test_the_difference_and_its_test_on_known_scores() -> None:
    rng = np.random.default_rng(0)
    items = [f"i{k}" for k in range(30)]
    sa, sb = (rng.random(30) < 0.3).astype(float), (rng.random(30) < 0.7).astype(float)

    def side(name: str, scores: np.ndarray, extra: list[str]) -> Side:
        rows = [{"task": "t", "strategy": "s", "item_id": i, "scored": True, "score_strict": float(x)}
                for i, x in zip(items, scores, strict=True)]
        rows += [{"task": "t", "strategy": "s", "item_id": i, "scored": True, "score_strict": 1.0} for i in extra]
        return Side(Path(name), pd.DataFrame(rows), {"max_tokens": 64 if name == "a" else 256})

    table = ablation_table([side("a", sa, []), side("b", sb, ["only-in-b"])], n_resamples=500)
    r = table.iloc[0]
    assert r["n_items"] == 30 and r["diff"] == pytest.approx(sb.mean() - sa.mean())  # run - first, paired items
    b10, b01 = int(((sb == 1) & (sa == 0)).sum()), int(((sb == 0) & (sa == 1)).sum())
    exact = mcnemar([[0, b10], [b01, 0]], exact=True).pvalue
    assert r["paired_p"] == pytest.approx(exact, rel=1e-9) and r["differs_in"] == "max_tokens=64->256"
