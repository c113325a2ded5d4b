"""Growing a run: adding strategies or seeds to a run directory appends their records and the manifest records
each extension; any other change is still refused, naming the field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from formtax.errors import ConfigError
from formtax.records import read_records
from formtax.report import verify_report, write_report
from formtax.runner import RunConfig, run
from formtax.runner.run import grid_extension


def cfg(**kw: object) -> RunConfig:
    base: dict[str, object] = dict(task="arith", strategies=["free"], backend="fake", limit=4, batch_size=2)
    base.update(kw)
    return RunConfig(**base)  # type: ignore[arg-type]


def test_adding_a_strategy_then_seeds_appends_and_records_each_extension(tmp_path: Path) -> None:
    run(cfg(), tmp_path)
    first = read_records(tmp_path / "records.jsonl")
    s = run(cfg(strategies=["free", "constrained"]), tmp_path)
    assert (s.skipped, s.done) == (4, 4)
    s = run(cfg(strategies=["free", "constrained"], seeds=2), tmp_path)
    assert (s.skipped, s.done) == (8, 8)
    records = read_records(tmp_path / "records.jsonl")
    assert [r.model_dump() for r in records[:4]] == [r.model_dump() for r in first]  # nothing rewritten
    assert sorted({(r.strategy, r.seed) for r in records}) == [("constrained", 0), ("constrained", 1),
                                                              ("free", 0), ("free", 1)]
    manifest = json.loads((tmp_path / "manifest.json").read_text(encoding="utf-8"))
    assert [{k: v for k, v in e.items() if k != "at"} for e in manifest["extensions"]] == [
        {"added_strategies": ["constrained"]}, {"added_seeds": [1]}]
    assert manifest["config"]["strategies"] == ["free", "constrained"] and manifest["seeds"] == [0, 1]
    assert run(cfg(strategies=["free", "constrained"], seeds=2), tmp_path).done == 0  # plain resume
    write_report(tmp_path, n_resamples=100)
    assert verify_report(tmp_path) == []


@pytest.mark.parametrize(("change", "field"), [
    ({"strategies": ["constrained"]}, "strategies"),  # dropping one is not growth
    ({"seeds": 1, "strategies": ["free"], "max_tokens": 99}, "max_tokens"),
    ({"limit": 6}, "limit"),
])
def test_other_changes_are_refused_naming_the_field(tmp_path: Path, change: dict[str, object], field: str) -> None:
    run(cfg(strategies=["free"], seeds=2), tmp_path)
    with pytest.raises(ConfigError, match=f"differs in: .*{field}.*only adding strategies or seeds"):
        run(cfg(**{"seeds": 2, **change}), tmp_path)


def test_fewer_seeds_is_refused(tmp_path: Path) -> None:
    run(cfg(seeds=2), tmp_path)
    with pytest.raises(ConfigError, match="seeds"):
        run(cfg(seeds=1), tmp_path)


def test_growth_that_would_change_earlier_budgets_is_refused(tmp_path: Path) -> None:
    """json@vc's reasoning budget is max_tokens minus the largest answer reserve of json's levels in the grid:
    adding json@fc (a larger reserve) would change it, so the earlier records no longer match their plan."""
    run(cfg(strategies=["json@vc"]), tmp_path)
    with pytest.raises(ConfigError, match="would change the token budget.*--reasoning-tokens"):
        run(cfg(strategies=["json@vc", "json@fc"]), tmp_path)
    assert len(read_records(tmp_path / "records.jsonl")) == 4
    other = tmp_path / "fixed"
    run(cfg(strategies=["json@vc"], reasoning_tokens=64), other)  # a fixed reasoning budget grows freely
    assert run(cfg(strategies=["json@vc", "json@fc"], reasoning_tokens=64), other).done == 4


def test_grid_extension_rules() -> None:
    base = {"task": "arith", "strategies": ["a", "b"], "seeds": 2, "max_tokens": 10}
    assert grid_extension(base, {**base, "strategies": ["a", "b", "c"]}) == {"added_strategies": ["c"]}
    assert grid_extension(base, {**base, "seeds": 3}) == {"added_seeds": [2]}
    assert grid_extension(base, {**base, "strategies": ["b", "a"]}) == {"added_strategies": []}
    assert grid_extension(base, {**base, "strategies": ["a"]}) is None
    assert grid_extension(base, {**base, "seeds": 1}) is None
    assert grid_extension(base, {**base, "max_tokens": 11, "seeds": 3}) is None
    assert grid_extension(base, base) is None
