"""Data-parallel runs over Ray actors on the fake backend: same records as one process, one writer, resumable.

Skipped when Ray is not importable (optional extra ``formtax[ray]``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from formtax.errors import CapabilityError, ConfigError
from formtax.records import read_records
from formtax.runner import RunConfig, run

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.parallel

STRATS = ["free", "short", "constrained", "json@fc", "inwriting", "nl2format", "inwriting@vc+rc"]
LIMIT = 12  # items of the subprocess runs (12 x 7 = 84 requests, one per chunk: long enough to be killed mid-run)


def cfg(**kw):
    base = dict(task="arith", strategies=STRATS, backend="fake", limit=3, seeds=2, batch_size=3)
    base.update(kw)
    return RunConfig(**base)


def outputs(path: Path) -> dict[str, tuple]:
    return {r.request_id: (r.text, r.answer_text, r.finish_reason, r.constraint_ok, r.scores)
            for r in read_records(path / "records.jsonl")}


def test_two_workers_record_what_one_process_records(tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    s1 = run(cfg(), one)
    s2 = run(cfg(workers=2), two)
    assert s1.planned == s2.planned == s2.done == 3 * 2 * len(STRATS)
    recs = read_records(two / "records.jsonl")
    assert len(recs) == len({r.request_id for r in recs}) == s2.planned
    assert outputs(one) == outputs(two)  # the same greedy outputs, whichever worker ran them
    manifest = json.loads((two / "manifest.json").read_text())
    assert manifest["status"] == "complete" and manifest["backend"]["workers"] == 2
    assert manifest["config_identity"] == json.loads((one / "manifest.json").read_text())["config_identity"]
    assert not ray.is_initialized()  # the run shut its local cluster down


def test_a_worker_refuses_a_strategy_before_any_request(tmp_path):
    with pytest.raises((CapabilityError, ConfigError)):
        run(cfg(backend="fake", strategies=["free"], workers=2, backend_options={"bogus": 1}), tmp_path)
    assert not (tmp_path / "records.jsonl").exists() or not (tmp_path / "records.jsonl").read_bytes()


def _driver(out: Path, workers: int, extra: list[str] | None = None) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "formtax", "run", "--task", "arith", "--strategies", ",".join(STRATS),
           "--backend", "fake", "--limit", str(LIMIT), "--seeds", "1", "--batch-size", "1", "--workers", str(workers),
           "--out", str(out), *(extra or [])]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)


def test_killing_the_driver_loses_nothing_and_duplicates_nothing(tmp_path):
    out = tmp_path / "run"
    proc = _driver(out, 2)
    records = out / "records.jsonl"
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and proc.poll() is None:
            if records.exists() and records.read_bytes().count(b"\n") >= 20:
                break
            time.sleep(0.05)
        assert proc.poll() is None, f"the run ended before it could be killed: {proc.stderr.read()[-2000:]!r}"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the driver and everything it started in its session
        proc.wait(timeout=30)
    before = records.read_bytes()
    n_before = len(read_records(records))
    assert 20 <= n_before < LIMIT * len(STRATS)
    s = run(cfg(limit=LIMIT, seeds=1, batch_size=1, workers=2), out)
    after = records.read_bytes()
    assert after.startswith(before[: before.rfind(b"\n") + 1])  # nothing rewritten
    recs = read_records(records)
    assert s.skipped == n_before and len(recs) == len({r.request_id for r in recs}) == s.planned


@pytest.mark.slow
def test_joining_an_existing_cluster(tmp_path):
    info = ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        address = info.address_info["address"]
        proc = _driver(tmp_path / "run", 2, ["--ray-address", address])
        _, err = proc.communicate(timeout=240)
        assert proc.returncode == 0, err.decode()[-2000:]
        manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
        assert manifest["backend"]["ray_address"] == address and manifest["status"] == "complete"
        assert len(read_records(tmp_path / "run" / "records.jsonl")) == LIMIT * len(STRATS)
        assert ray.is_initialized()  # the joined cluster outlives the run
    finally:
        ray.shutdown()
