"""A tiny real-model run (2 pairs, the embedded default model): the three conditions, the first-token masked
mass
against the grammar engine's own, and report + verify on real outputs."""

from __future__ import annotations

import pytest

from formtax.records import read_records
from formtax.report import verify_report, write_report
from formtax.runner import RunConfig, run

pytestmark = pytest.mark.model


@pytest.mark.slow
def test_two_pairs_on_the_default_model(tmp_path, default_model):
    # 32 tokens: the longest candidate name of these two pairs (30 bytes) plus EOS fits the constrained budget
    cfg = RunConfig(
        task="metatool",
        strategies=["free", "short", "constrained"],
        seeds=1,
        max_tokens=32,
        batch_size=4,
        task_options={"pairs": 2},
    )
    out = tmp_path / "run"
    summary = run(cfg, out, backend=default_model)
    recs = read_records(out / "records.jsonl")
    assert summary.errors == 0 and len(recs) == 12
    by = {(r.item_id, r.strategy): r for r in recs}
    assert len({r.prompt_hash for r in recs if r.item_id == recs[0].item_id}) == 1
    for (item, strategy), r in by.items():
        options = (r.answer_spec or "").removeprefix("choice:").split("|")
        if strategy == "constrained":
            assert r.constraint_ok is True and r.answer_text in options, r.text
            assert r.parses["strict"].status == "ok" and r.parses["strict"].value == r.answer_text
        if strategy == "short":
            assert "\n" not in (r.answer_text or "")
            m = r.stats["first_token_mass"]
            assert 0.0 <= m["masked_mass_topk"] <= m["masked_mass"] <= 1.0
            assert m["masked_mass"] <= m["masked_mass_topk"] + 1.0 - m["topk_coverage"] + 1e-9
            assert m["k"] == 20 and m["n_allowed"] >= len(options)
            # the paper's set (first encoded tokens) and the grammar's both sit inside the wider prefix set: their
            # masked masses cannot be smaller than its
            grammar = by[(item, "constrained")].masked_mass
            assert grammar is not None and grammar >= m["masked_mass_prefixes"] - 1e-4
            assert m["masked_mass"] >= m["masked_mass_prefixes"] - 1e-12
    write_report(out, n_resamples=200, seed=0)
    assert verify_report(out) == []
    assert (out / "tables" / "abstention_contrasts.csv").is_file()
