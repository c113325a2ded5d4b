"""Issue 49: ``formtax run --system-prompt``: a system message before every chat prompt, an empty one to keep
SmolLM2's template from injecting its default; part of the run's identity (a resume with another prompt is
refused, not mixed). And the backend options that choose other weights (``revision``) are part of it too."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from formtax.cli.main import main
from formtax.runner.config import RunConfig
from formtax.runner.grid import with_system

MSGS = [{"role": "user", "content": "q"}]


def test_with_system_prepends_or_joins():
    assert with_system(MSGS, None) == MSGS
    assert with_system(MSGS, "") == [{"role": "system", "content": ""}, *MSGS]
    own = [{"role": "system", "content": "Answer briefly."}, *MSGS]
    assert with_system(own, "Be exact.") == [{"role": "system", "content": "Be exact.\n\nAnswer briefly."}, *MSGS]
    assert with_system(own, "") == own


def test_the_run_records_it_and_refuses_to_mix(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    base = ["run", "--task", "arith", "--strategies", "free", "--limit", "2", "--backend", "fake", "--max-tokens",
            "8", "--out", str(out)]
    assert main([*base, "--system-prompt", "Be exact."]) == 0
    rec = json.loads((out / "records.jsonl").read_text().splitlines()[0])
    assert "Be exact." in rec["prompt"]
    assert main([*base, "--system-prompt", "Be vague."]) != 0
    assert "differs in: system_prompt" in capsys.readouterr().err


def test_weight_options_are_identity():
    a = RunConfig(task="arith", strategies=["free"], backend_options={"revision": "v1", "attn_implementation": "eager"})
    b = RunConfig(task="arith", strategies=["free"], backend_options={"revision": "v2", "attn_implementation": "eager"})
    c = RunConfig(task="arith", strategies=["free"], backend_options={"attn_implementation": "sdpa"})
    assert a.identity() != b.identity() and a.identity()["model_options"] == {"revision": "v1"}
    assert "model_options" not in c.identity() and "system_prompt" not in c.identity()
