"""The typed, versioned manifest (issue 38): every layout the project has written migrates, its run resumes and its
report verifies; a manifest from a newer formtax is refused by name; a hand-broken one names its field."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from formtax.backends.fake import FakeBackend
from formtax.cli.main import main
from formtax.errors import DataError
from formtax.report import verify_report, write_report
from formtax.runner import RunConfig, run
from formtax.runner.manifest import MANIFEST_VERSION, Manifest, RunStatus, load_manifest, migrate

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "manifests"
LAYOUTS = sorted(p.name for p in FIXTURES.iterdir() if p.is_dir())


def test_there_is_a_fixture_of_every_layout() -> None:
    versions = {json.loads((FIXTURES / d / "manifest.json").read_text()).get("schema_version", 0) for d in LAYOUTS}
    assert versions == set(range(MANIFEST_VERSION + 1))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_each_layout_migrates_resumes_and_verifies(layout: str, tmp_path: Path) -> None:
    run_dir = tmp_path / layout
    shutil.copytree(FIXTURES / layout, run_dir)
    raw = json.loads((run_dir / "manifest.json").read_text())
    m = load_manifest(run_dir)
    assert isinstance(m, Manifest) and m.schema_version == MANIFEST_VERSION
    assert m.config_identity == raw["config_identity"]  # the records' run identity is its hash: untouched
    assert m.status is RunStatus.COMPLETE and m.run_config().strategies == ["free", "constrained"]
    write_report(run_dir, n_resamples=200)
    assert verify_report(run_dir) == []
    # resuming the same grid adds nothing and writes the current layout
    cfg = RunConfig(task="arith", strategies=["free", "constrained"], backend="fake", limit=3)
    summary = run(cfg, run_dir, backend=FakeBackend())
    assert summary.done == 0 and summary.skipped == 6
    assert json.loads((run_dir / "manifest.json").read_text())["schema_version"] == MANIFEST_VERSION


def test_a_newer_manifest_is_refused_with_a_clear_message(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                                          ) -> None:
    run_dir = tmp_path / "future"
    shutil.copytree(FIXTURES / "v1", run_dir)
    write_report(run_dir, n_resamples=100)
    raw = json.loads((run_dir / "manifest.json").read_text())
    raw["schema_version"] = MANIFEST_VERSION + 1
    (run_dir / "manifest.json").write_text(json.dumps(raw))
    assert main(["verify", str(run_dir)]) != 0
    said = capsys.readouterr()
    assert f"schema_version {MANIFEST_VERSION + 1} is newer than this formtax knows" in said.out + said.err
    with pytest.raises(DataError, match="config.max_tokens"):
        migrate({**raw, "schema_version": 1, "config": {**raw["config"], "max_tokens": "many"}})


def test_rundir_opens_locks_resumes_and_verifies(tmp_path: Path) -> None:
    from formtax.errors import ConfigError
    from formtax.report.rundir import RunDir

    rd = RunDir(tmp_path / "old")
    shutil.copytree(FIXTURES / LAYOUTS[0], rd.path)
    assert rd.manifest().schema_version == MANIFEST_VERSION and len(rd.records()) == 6
    summary = rd.resume(backend=FakeBackend())  # the recorded config (defaults filled in) names the same run
    assert summary.done == 0 and summary.skipped == 6
    rd.report(n_resamples=100)
    assert rd.verify() == []
    with rd.lock(), pytest.raises(ConfigError, match="in use by another formtax run"):
        rd.resume(backend=FakeBackend())
