"""run + report + verify through the CLI on the embedded default model, a few items."""

import json

import pytest

from formtax.cli.main import main

pytestmark = pytest.mark.model


def test_run_report_verify_on_default_model(tmp_path, default_model, capsys):
    out = tmp_path / "run"
    args = ["run", "--task", "arith", "--strategies", "free,constrained,json,inwriting,nl2format",
            "--limit", "3", "--max-tokens", "72", "--batch-size", "3", "--out", str(out)]
    assert main(args) == 0
    recs = [json.loads(x) for x in (out / "records.jsonl").read_text().splitlines()]
    assert len(recs) == 15
    for r in recs:
        if r["base_strategy"] in {"constrained", "json", "inwriting", "nl2format"}:
            assert r["constraint_ok"] is True, r["text"]
            assert r["parses"]["strict"]["status"] in {"ok", "invalid"}
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["backend"]["origin_sha256"] and manifest["backend"]["tokenizer_sha256"]
    assert main(args) == 0  # resume: nothing to do
    assert len((out / "records.jsonl").read_text().splitlines()) == 15
    assert main(["report", str(out), "--replicates", "300"]) == 0
    assert main(["verify", str(out)]) == 0
    acc = (out / "tables" / "accuracy.csv").read_text().splitlines()
    line = acc[1]
    acc[1] = line.replace(",3,", ",4,", 1) if ",3," in line else line + "x"
    (out / "tables" / "accuracy.csv").write_text("\n".join(acc) + "\n")
    assert main(["verify", str(out)]) == 1
    assert "MISMATCH" in capsys.readouterr().out
