"""One report over several runs: same-model runs merge into their cells, several models stay apart (per-model
tables), and the pooling rules refuse runs whose data, prompts, scoring or requests clash; verify re-derives the
pooled records from their sources."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from formtax.backends.fake import FakeBackend, random_logits
from formtax.cli.main import main
from formtax.errors import ConfigError
from formtax.report import verify_report
from formtax.report.combine import pool_records, write_pooled
from formtax.runner import RunConfig, run


def cfg(**kw: object) -> RunConfig:
    base: dict[str, object] = dict(task="arith", strategies=["free"], backend="fake", limit=4, batch_size=2)
    base.update(kw)
    return RunConfig(**base)  # type: ignore[arg-type]


@pytest.fixture
def two_runs(tmp_path: Path) -> tuple[Path, Path]:
    a, b = tmp_path / "a", tmp_path / "b"
    run(cfg(strategies=["free"]), a)
    run(cfg(strategies=["constrained"]), b)
    return a, b


def test_same_model_runs_merge_into_one_task(two_runs: tuple[Path, Path], tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    a, b = two_runs
    out = tmp_path / "pooled"
    assert main(["report", str(a), str(b), "--out", str(out), "--replicates", "200"]) == 0
    assert "report:" in capsys.readouterr().out
    paired = pd.read_csv(out / "tables" / "paired.csv")
    assert {frozenset((r.strategy, r.baseline)) for r in paired.itertuples()} == {frozenset(("constrained", "free"))}
    summary = pd.read_csv(out / "tables" / "summary.csv")
    assert set(summary["task"]) == {"arith"} and len(summary) == 2
    assert "pooled run 1" in (out / "report.md").read_text(encoding="utf-8")
    assert main(["verify", str(out)]) == 0
    # a source that changes after pooling is named by verify
    with (b / "records.jsonl").open("a", encoding="utf-8") as f:
        f.write((b / "records.jsonl").read_text(encoding="utf-8").splitlines()[0] + "\n")
    assert any("changed since it was pooled" in p for p in verify_report(out))


def test_several_models_stay_apart(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    run(cfg(strategies=["free", "constrained"]), a, backend=FakeBackend(random_logits(seed=0), model_id="m-one"))
    run(cfg(strategies=["free", "constrained"]), b, backend=FakeBackend(random_logits(seed=1), model_id="m-two"))
    out = tmp_path / "pooled"
    assert main(["report", str(a), str(b), "--out", str(out), "--replicates", "200"]) == 0
    summary = pd.read_csv(out / "tables" / "summary.csv")
    assert set(summary["task"]) == {"arith | m-one", "arith | m-two"} and len(summary) == 4
    assert verify_report(out) == []


def test_pooling_refusals(two_runs: tuple[Path, Path], tmp_path: Path) -> None:
    a, b = two_runs
    with pytest.raises(ConfigError, match="repeats a request"):
        copy = tmp_path / "copy"
        shutil.copytree(a, copy)
        pool_records([a, copy])
    edited = tmp_path / "edited"
    shutil.copytree(b, edited)
    lines = (edited / "records.jsonl").read_text(encoding="utf-8").splitlines()
    rec = json.loads(lines[0])
    rec["item_hash"] = "0" * 64
    (edited / "records.jsonl").write_text("\n".join([json.dumps(rec), *lines[1:]]) + "\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="item arith/.* differs"):
        pool_records([a, edited])
    shutil.rmtree(edited)
    shutil.copytree(b, edited)
    manifest = json.loads((edited / "manifest.json").read_text(encoding="utf-8"))
    manifest["formtax_version"] = "0.0.1"
    (edited / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
    with pytest.raises(ConfigError, match="formtax version"):
        pool_records([a, edited])
    with pytest.raises(ConfigError, match="one of the runs being pooled"):
        write_pooled([a, b], a)
    with pytest.raises(ConfigError, match="holds a run's records.jsonl"):
        write_pooled([a, b], edited)


def test_report_cli_needs_out_for_several_runs(two_runs: tuple[Path, Path],
                                               capsys: pytest.CaptureFixture[str]) -> None:
    a, b = two_runs
    assert main(["report", str(a), str(b)]) == 2
    assert "give --out FOLDER" in capsys.readouterr().err
